"""MkDocs hooks for ``./dev docs``: the benchmark chart from bench/, and a visible note on examples not run.

``bench/results*.png`` (the ratio chart, each bench's curve) are committed output of ``./dev bench all`` next
to ``bench/results.md`` (which the benchmarks page includes); they are served from the site as they are,
not copied into docs/.
A python block whose line above is ``<!-- not run: REASON -->`` is one tests/test_docs.py does not execute;
the page shows REASON in a note above it, so a reader knows the example was not run by the suite.
"""
from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
NOT_RUN = re.compile(r"^<!-- not run: (.+?) -->$", re.MULTILINE)


def on_files(files, config):
    for png in sorted((ROOT / "bench").glob("results*.png")):  # the ratio chart and each bench's curve
        files.append(File.generated(config, f"bench/{png.name}", abs_src_path=str(png)))
    return files


def on_page_markdown(markdown, page, config, files):
    return NOT_RUN.sub(lambda m: f'!!! note "Not run by the test suite: {m.group(1)}"\n', markdown)
