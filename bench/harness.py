"""What every bench shares: this checkout on the path, a quiet Spark session, medians, the RESULT line.

A bench ends with :func:`report`, one ``RESULT {json}`` line holding its ratios and goals (and any
table it wants in ``bench/results.md``); ``bench/all.py`` reads that line, writes the table and the chart.
Each ratio compares tfnb with an anchor measured in the same run, interleaved with it round by round,
and is the median over the rounds: on a shared machine one round proves little.
"""
from __future__ import annotations

import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def use_checkout() -> None:
    """This checkout's tfnb, in the bench and in the Spark executors it starts."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, here] + [p for p in paths if p not in (ROOT, here)])


def session(master: str, name: str, **conf):
    """A Spark session without UI or progress bars; ``conf`` keys use ``_`` for ``.`` after ``spark``."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(name)
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def tfos_available(skip: bool) -> bool:
    """Whether TensorFlowOnSpark, the comparison some benches keep, can run; when not, say how to install it."""
    if skip:
        return False
    try:
        import tensorflowonspark  # noqa: F401
    except ImportError:
        print("TensorFlowOnSpark is not installed; for the comparison run\n"
              "    .venv/bin/pip install tensorflowonspark==2.2.5 --no-deps\n"
              "(continuing without it)", file=sys.stderr)
        return False
    return True


def median(values) -> float:
    return statistics.median(values)


def spread(values) -> str:
    """``median [min-max]`` of a ratio over the rounds."""
    return f"{median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def report(bench: str, ratios: dict, goals: dict, **extra) -> None:
    """Print the RESULT line ``bench/all.py`` reads: ratios (medians), their goals, and extra facts.

    ``extra["tables"]`` may hold ``{title: [header, row, ...]}``: all.py copies them into results.md.
    """
    print("RESULT " + json.dumps({"bench": bench, "ratios": {k: round(v, 3) for k, v in ratios.items()},
                                  "goals": goals, **extra}), flush=True)
