"""MkDocs hooks for ``./dev docs``: the benchmark chart from bench/, and a visible note on examples not run.

``bench/results.png`` is committed output of ``./dev bench all`` next to ``bench/results.md`` (which the
benchmarks page includes); it is served from the site as it is, not copied into docs/.
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
    files.append(File.generated(config, "bench/results.png", abs_src_path=str(ROOT / "bench" / "results.png")))
    return files


def on_page_markdown(markdown, page, config, files):
    return NOT_RUN.sub(lambda m: f'!!! note "Not run by the test suite: {m.group(1)}"\n', markdown)
