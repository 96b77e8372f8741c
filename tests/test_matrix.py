"""docs/compatibility.md, which ``./dev matrix`` (tools/matrix.py) writes, against what tfnb accepts: the ranges it
shows are tfnb/_deps.py's and setup.cfg's, every accepted Keras minor, TensorFlow minor, Spark minor, Python, tf-keras
and MLflow major has a ✓ cell, and the check itself caught Keras' scale error in its plain row. No training here: the
suite trains the newest (tests/test_keras3.py) and the floor through the 15.4 Run All (tests/test_databricks.py); the
matrix trains every cell exactly, the floor again in its runtime (tests/test_runtime_sim.py, marker long)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tfnb import _deps

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import matrix  # noqa: E402


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    got = matrix.committed()
    assert got, "docs/compatibility.md has no matrix data: run ./dev matrix"
    return list(got.values())


def _passing(rows):
    return [r for r in rows if r["ok"] and not r.get("plain")]


def _minor(version: str) -> tuple[int, int]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:2])


def _python_range() -> list[tuple[int, int]]:
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    spec = cfg["options"]["python_requires"]
    low = re.search(r">=\s*3\.(\d+)", spec)
    high = re.search(r"<\s*3\.(\d+)", spec)
    assert low and high, f"python_requires = {spec} has no upper bound: a Python no cell trains would be accepted"
    return [(3, m) for m in range(int(low.group(1)), int(high.group(1)))]


def test_the_page_shows_the_accepted_ranges_tfnb_enforces():
    text = (ROOT / "docs" / "compatibility.md").read_text()
    for axis, value in matrix.accepted().items():
        assert f"| {axis} | {value} |" in text or f"| {axis} | `{value}` |" in text, (axis, value)


def test_every_accepted_version_trains_in_a_passing_cell(rows):
    ok = _passing(rows)
    keras = {r["versions"]["keras"] for r in ok if not r.get("legacy")}
    floor, newest = _deps.KERAS_FLOOR, _deps.TESTED_NEWEST["keras"]
    assert ".".join(map(str, floor)) in keras and ".".join(map(str, newest)) in keras
    want = {(floor[0], m) for m in range(floor[1], newest[1] + 1)}
    assert want <= {_minor(v) for v in keras}, sorted(want - {_minor(v) for v in keras})

    tf = {_minor(r["versions"]["tensorflow"]) for r in ok}
    low, high = _deps.TENSORFLOW_FLOOR, _deps.TESTED_NEWEST["tensorflow"]
    assert {(2, m) for m in range(low[1], high[1] + 1)} <= tf, sorted(tf)

    spark = {_minor(r["versions"]["pyspark"]) for r in ok}
    newest_spark = _deps.TESTED_NEWEST["spark"]
    assert {_deps.SPARK_FLOOR, *((4, m) for m in range(newest_spark[1] + 1))} <= spark, sorted(spark)

    python = {_minor(r["versions"]["python"]) for r in ok}
    assert set(_python_range()) <= python, sorted(python)

    mlflow = {(r["versions"].get("mlflow-skinny") or r["versions"].get("mlflow", "0"))[0]
              for r in ok if any("MLflow" in c for c in r["checks"])}
    assert {"2", "3"} <= mlflow, mlflow


def test_every_cell_of_the_runner_is_on_the_page(rows):
    assert {c.name for c in matrix.CELLS + matrix.PLAIN} == {r["cell"] for r in rows}
    for r in _passing(rows):
        assert {"2 workers", "4 workers"} <= {c.split(":")[0] for c in r["checks"]}, r["cell"]


def test_the_check_caught_keras_scale_error_without_tfnb(rows):
    """The plain row runs the same check on Keras 3.6 alone under MirroredStrategy: it must fail, on about twice the
    one-process update, while the same Keras under tfnb.run passes."""
    (plain,) = [r for r in rows if r.get("plain")]
    assert not plain["ok"]
    ratio = re.search(r"fit: weights \S+ off one process's \(([\d.]+)x its update\)", plain["reason"])
    assert ratio and float(ratio.group(1)) == pytest.approx(2.0, abs=0.05), plain["reason"]
    same = [r for r in rows if not r.get("plain") and r["versions"].get("keras") == plain["versions"]["keras"]]
    assert same and all(r["ok"] for r in same)


def test_tf_keras_trains_in_a_passing_cell(rows):
    assert any(r.get("legacy") and r["versions"].get("tf-keras") for r in _passing(rows)), \
        "no tf-keras (legacy_keras) cell passes"
