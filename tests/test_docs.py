"""The documentation as a reader meets it: the site builds in strict mode, every page is in the site's navigation
and on the home page, no pointer is dead (links and anchors of the README, README and docs sections named in
docstrings and messages), the words are a user's, and every python example runs.

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


def _nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        for value in (item.values() if isinstance(item, dict) else [item]):
            out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_every_page_is_in_the_navigation_and_on_the_home_page():
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)  # mkdocs' !!python/name tags
    nav = _nav_pages(yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)["nav"])
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(nav) == pages, f"pages missing from mkdocs.yml's nav: {sorted(set(pages) - set(nav))}; " \
                                 f"nav entries without a page: {sorted(set(nav) - set(pages))}"
    home = expanded(ROOT / "docs" / "index.md")
    unlinked = [p for p in pages if p != "index.md" and f"]({p}" not in home]
    assert not unlinked, f"docs/index.md does not link {unlinked}"


def _slug(heading: str) -> str:
    """The anchor MkDocs gives a heading (Python-Markdown's toc slugify, on the heading's text)."""
    import unicodedata

    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _headings(page: Path) -> list[str]:
    text = FENCE.sub("", expanded(page))
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, re.MULTILINE)]


def test_no_dead_link_or_anchor_in_the_readme():
    # docs/ pages are checked by the strict site build (mkdocs.yml: validation of links and anchors)
    text = FENCE.sub("", README.read_text())
    dead = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        page = (ROOT / path) if path else README
        if not page.exists():
            dead.append(target)
        elif anchor and anchor not in {_slug(h) for h in _headings(page)}:
            dead.append(target)
    assert not dead, f"README.md points nowhere: {dead}"


SECTION_REF = re.compile(r"""(README|docs/[\w-]+\.md)\b[^"'\n]{0,12}?(?:"([^"\n]{3,60})"|'([^'\n]{3,60})')""")
JOINED = re.compile(r"""(["'])\s*\n\s*f?\1""")  # "a " "b" over two lines: one string to a reader


def test_sections_named_in_docstrings_and_messages_exist():
    dead = []
    for path in sorted((ROOT / "tfnb").rglob("*.py")) + [ROOT / "tests" / "conftest.py"]:
        for m in SECTION_REF.finditer(JOINED.sub("", path.read_text())):
            page, section = README if m.group(1) == "README" else ROOT / m.group(1), m.group(2) or m.group(3)
            if not page.exists() or not any(h.startswith(section) for h in _headings(page)):
                dead.append(f"{path.relative_to(ROOT)}: {m.group(1)}, {section!r}")
    assert not dead, "sections that are not there (moved to a docs/ page?):\n" + "\n".join(dead)


# Words of the people who build tfnb, not of its users (the changelog keeps the words each release used).
INSIDE_WORDS = re.compile(r"\brefusals?\b|\bthe ways?\s+out\b|retires?\s+(?:itself|themselves)"
                          r"|could\s+not\s+be\s+(?:read|reached|found)\s+from\s+here", re.IGNORECASE)


def test_the_pages_speak_a_users_words():
    said = []
    for page in PAGES:
        if page.name == "changelog.md":
            continue
        text = re.sub(r"\]\([^)]*\)|`[^`\n]*`", "", page.read_text())  # link targets and code name files, not words
        said += [f"{page.name}: {m.group(0)!r} in {text[max(0, m.start() - 40):m.end() + 20]!r}"
                 for m in INSIDE_WORDS.finditer(text)]
    assert not said, "say what the user sees (\"tfnb stops with an error that says how to fix it\"):\n" + "\n".join(said)
