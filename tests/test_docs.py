"""The documentation as a reader meets it: the site builds in strict mode, and every python example runs.

A python block in README.md or docs/*.md is executed unless the line right above it is
``<!-- not run: REASON -->``; the site shows REASON in a note above the block (tools/mkdocs_hooks.py).
The blocks of one page run in order in one fresh Python process, like a notebook's cells, from an empty
folder. docs/getting-started.md includes the README's laptop example (``--8<-- "README.md:laptop"``) and
continues from it, so the README's blocks run there, once.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tfnb

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
SNIPPET = re.compile(r'^--8<-- "([^":]+)(?::(\w+))?"$', re.MULTILINE)
NOT_RUN = re.compile(r"<!-- not run: (.+) -->\n\Z")


def expanded(page: Path) -> str:
    """The page's markdown with its snippet includes replaced by what they include, as the site shows it."""
    def include(m: re.Match) -> str:
        text = (ROOT / m.group(1)).read_text()
        if m.group(2):
            text = text.split(f"--8<-- [start:{m.group(2)}] -->\n", 1)[1].split("<!-- --8<-- [end:", 1)[0]
        return text
    return SNIPPET.sub(include, page.read_text())


def blocks(page: Path) -> list[tuple[str, str, str | None]]:
    """(language, code, reason it is not run or None) of every fenced block of the page, in order."""
    text = expanded(page)
    found = []
    for m in FENCE.finditer(text):
        reason = NOT_RUN.search(text[:m.start()])
        found.append((m.group(1).strip(), m.group(2), reason.group(1) if reason else None))
    return found


def runnable(page: Path) -> list[str]:
    return [code for lang, code, reason in blocks(page) if lang in ("python", "py") and reason is None]


def test_every_block_names_its_language():
    # An unlabelled fence could hide a python example from the run below.
    unlabelled = [page.name for page in PAGES for lang, _, _ in blocks(page) if not lang]
    assert not unlabelled, f"fenced blocks without a language (```python, ```bash, ```text) in {unlabelled}"


def test_the_readme_runs_within_getting_started():
    started = runnable(ROOT / "docs" / "getting-started.md")
    assert runnable(README) and runnable(README) == started[:len(runnable(README))], \
        "docs/getting-started.md must begin with the README's python examples (--8<-- \"README.md:laptop\")"


def test_the_readme_is_a_short_front_door():
    text = README.read_text()
    assert 150 <= len(text.splitlines()) <= 250, len(text.splitlines())
    first_screen = "\n".join(text.splitlines()[:30])
    assert "tfnb.run(" in first_screen and "pip install" in first_screen
    for command in ("./dev test", "./dev demo", "./dev docs", "./dev wheel", "pip install -e", "dbc/tfnb.dbc"):
        assert command in text, command
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == ["./dev test"], f".ci/run must run exactly the README's test command, runs {ci}"


def test_the_api_reference_lists_every_public_name():
    api = (ROOT / "docs" / "api.md").read_text()
    missing = [name for name in tfnb.__all__ if f"::: tfnb.{name}\n" not in api]
    assert not missing, f"docs/api.md lacks ::: tfnb.NAME for {missing}"


def test_the_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    site = tmp_path / "site"
    api = (site / "api" / "index.html").read_text()
    assert all(f'id="tfnb.{name}"' in api for name in tfnb.__all__)  # rendered from the docstrings
    assert "training accuracy after 5 epochs" in (site / "getting-started" / "index.html").read_text()
    assert "Not run by the test suite: needs an S3 bucket and credentials" in (site / "data" / "index.html").read_text()
    assert (site / "bench" / "results.png").read_bytes() == (ROOT / "bench" / "results.png").read_bytes()


@pytest.mark.parametrize("page", [p for p in PAGES if p != README and runnable(p)], ids=lambda p: p.name)
def test_the_python_examples_run(page, tmp_path):
    program = "\n\n".join(runnable(page))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "TFNB_WARM": "0",  # no standbys left behind by the example's run
           "TFNB_DISPLAY": "console", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-"], input=program, cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"{page.name}'s examples failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    if page.name == "getting-started.md":
        accuracy = float(re.search(r"accuracy on 197 held-out digits: (\S+)", done.stdout).group(1))
        assert accuracy > 0.5, done.stdout  # chance is 0.1
