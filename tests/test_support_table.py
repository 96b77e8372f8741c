"""The Databricks support table (README.md, included in docs/databricks.md) against the code: every cell says
✓ tested and how, ◐ expected and why, or ✗ not supported with the error a user gets; and every ✗ error is raised
here, with the words the table quotes, on a real Spark Connect session (what standard access mode, serverless
and Databricks Connect run)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import tfnb
from tfnb import ConfigError

ROOT = Path(__file__).resolve().parent.parent
MODES = ["classic, dedicated (single user)", "classic, standard (shared)", "serverless",
         "Spark Connect client (Databricks Connect)"]


def table() -> dict[str, dict[str, str]]:
    """feature -> mode -> cell, from the README's table."""
    text = (ROOT / "README.md").read_text()
    part = text.split("<!-- --8<-- [start:databricks-modes] -->\n", 1)[1].split("<!-- --8<-- [end:", 1)[0]
    lines = [ln for ln in part.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[1:] == MODES, header
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(MODES, cells[1:], strict=True))
    return rows


def not_supported() -> dict[tuple[str, str], str]:
    """(feature, mode) -> the error a ✗ cell quotes."""
    out = {}
    for feature, cells in table().items():
        for mode, cell in cells.items():
            if cell.startswith("✗"):
                quoted = re.fullmatch(r"✗ `([A-Za-z]+Error: [^`]+)`", cell)
                assert quoted, f"the ✗ cell of {feature!r} / {mode!r} must quote the error: ✗ `TypeError: words`"
                out[feature, mode] = quoted.group(1)
    return out


def test_every_cell_says_tested_expected_or_not_supported_and_how():
    rows = table()
    assert len(rows) >= 4
    for feature, cells in rows.items():
        for mode, cell in cells.items():
            assert re.match(r"(✓ tested: |◐ expected: |✗ `)\S", cell), (feature, mode, cell)
    # docs/databricks.md shows the same table: it includes it from the README
    assert '--8<-- "README.md:databricks-modes"' in (ROOT / "docs" / "databricks.md").read_text()


def test_the_connect_modes_are_refused_alike_and_only_what_this_file_raises():
    refused = not_supported()
    connect_modes = MODES[1:]
    for (feature, mode), error in refused.items():
        assert mode in connect_modes, f"{feature!r} is refused on {mode!r}: no test raises that here"
        assert {refused.get((feature, m)) for m in connect_modes} == {error}, feature
    assert {f for f, _ in refused} == set(RAISED), f"every ✗ row needs its test here: {sorted({f for f, _ in refused})}"


@pytest.fixture(scope="module")
def connect():
    from conftest import spark_connect

    with spark_connect() as client:
        yield client


def _elastic(spark):
    tfnb.run(lambda ctx: None, num_workers=2, min_workers=1, spark=spark, display=False)


def _tfos(spark):
    from tfnb.compat import cluster

    cluster.run(spark, lambda args, ctx: None, None, 2, 0)


RAISED = {  # feature row of the table -> what a user of a Connect session calls
    "elastic runs (`min_workers`)": _elastic,
    "TensorFlowOnSpark-style calls that take `sc` (`tfnb.compat`)": _tfos,
}


@pytest.mark.parametrize("feature", sorted(RAISED))
def test_a_not_supported_cell_is_the_error_a_connect_session_gets(feature, connect):
    (error,) = {e for (f, _), e in not_supported().items() if f == feature}
    kind, words = error.split(": ", 1)
    with pytest.raises(ConfigError) as raised:
        RAISED[feature](connect)
    assert type(raised.value).__name__ == kind
    assert str(raised.value).startswith(words), str(raised.value)
