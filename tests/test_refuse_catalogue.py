"""The refusal catalogue as a whole: it covers every area, and docs/refusals.md is generated from it."""
from __future__ import annotations

import refusals


def test_catalogue_is_large_and_covers_every_area():
    cases = refusals.catalogue()
    assert len(cases) > 40
    assert {c.area for c in cases} == set(refusals.AREAS)


def test_docs_list_the_catalogue():
    assert refusals.DOC.read_text() == refusals.document(), \
        "docs/refusals.md is out of date: regenerate it with python tests/refusals.py (from the repository root)"
