"""Lazy imports of heavy or optional packages, with an install hint when missing or too old. Spark and TensorFlow are
not install requirements of tfnb (a Databricks runtime brings its own, and pip must not replace them), so their floors
are checked here, at first use."""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
from types import ModuleType

from .errors import MissingDependencyError

# module -> what to pip install, where that is not the module's own name
_HINTS = {"tf_keras": "tf-keras", "IPython": "ipython", "pyspark": "'tfnb[spark]' (pyspark)",
          "mlflow": "'tfnb[mlflow]' (mlflow-skinny; Databricks runtimes ship MLflow)",
          "optuna": "'tfnb[sweep]' (optuna), or on Databricks %pip install optuna"}

# Floors, and why (README "Requirements" says the same).
SPARK_FLOOR = (3, 5)       # DataFrame.mapInArrow(..., barrier=True) is Spark 3.5+
TENSORFLOW_FLOOR = (2, 16)  # Keras 3 default from 2.16: MultiWorkerMirroredStrategy training needs tf-keras
# The newest version of each that ./dev matrix trains (docs/compatibility.md). Newer ones are not refused: a
# self-check decides at the first fit under a strategy (tfnb/_task/selfcheck.py).
TESTED_NEWEST = {"keras": (3, 15, 1), "tensorflow": (2, 21, 0), "spark": (4, 3, 0)}
KERAS_FLOOR = (3, 3, 3)  # Databricks Runtime 15.4 LTS ML's Keras


def tested_range() -> dict:
    """The tested Keras range, for messages."""
    return {"low": ".".join(map(str, KERAS_FLOOR)), "high": ".".join(map(str, TESTED_NEWEST["keras"]))}


_SPARK_FIX = ("on Databricks use Runtime 14.3 LTS or later (Runtime ML 15.4 LTS or later for TensorFlow); "
              "elsewhere pip install 'tfnb[spark]' (pyspark>=3.5)")
_TF_FIX = ("on Databricks use Runtime ML 15.4 LTS or later, or %pip install 'tensorflow>=2.16' tf-keras; "
           "elsewhere pip install 'tfnb[tf]'")


def require(module: str, purpose: str = "") -> ModuleType:
    """Import ``module`` or raise MissingDependencyError naming the package to install and ``purpose``; TensorFlow
    must be >= 2.16."""
    try:
        imported = importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        fix = _TF_FIX if top == "tensorflow" else f"pip install {_HINTS.get(top, top)}"
        why = f" for {purpose}" if purpose else ""
        raise MissingDependencyError(f"{module} is needed{why} but is not installed; {fix}") from e
    if module == "tensorflow":
        _floor("TensorFlow", getattr(imported, "__version__", "0"), TENSORFLOW_FLOOR,
               "Keras 3 and tf-keras both run on TensorFlow from 2.16 on", _TF_FIX)
    return imported


def _version(text: str, parts: int = 2) -> tuple[int, ...]:
    """``"3.5.1.dev0"``, ``"4.0.0-preview2"``, ``"2.16.1+cpu"``: the leading ``parts`` numbers, zero-padded."""
    numbers = [int(p) for p in re.findall(r"\d+", str(text).split("+")[0])[:parts]]
    return tuple(numbers + [0] * (parts - len(numbers)))


def _floor(name: str, found: str, floor: tuple[int, ...], why: str, fix: str) -> None:
    if _version(found) < floor:
        raise MissingDependencyError(
            f"{name} {found} is too old: tfnb needs {name} >= {'.'.join(map(str, floor))}; {fix}\n"
            f"Why {'.'.join(map(str, floor))}: {why}.")


def require_spark(spark=None) -> ModuleType:
    """Import pyspark and check it, and ``spark``'s server when given, is Spark >= 3.5."""
    pyspark = require("pyspark", "tfnb.run")
    found = [getattr(pyspark, "__version__", "0")]
    if spark is not None:
        with contextlib.suppress(Exception):  # a session that cannot say is checked by its first job
            found.append(spark.version)
    for version in filter(lambda v: isinstance(v, str), found):
        _floor("Spark", version, SPARK_FLOOR, "tfnb launches TensorFlow as one barrier DataFrame.mapInArrow job",
               _SPARK_FIX)
    return pyspark


@contextlib.contextmanager
def temp_env(name: str, value: str):
    """``os.environ[name] = value`` inside the block; the variable's earlier value (or absence) after it."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def tensorflow_with_tf_keras(purpose: str = "") -> ModuleType:
    """``require("tensorflow")`` with ``tf.keras`` meaning tf-keras (where installed) when this process imports
    TensorFlow first; TF_USE_LEGACY_KERAS is set only meanwhile, so the notebook's environment stays its user's."""
    import sys

    if "tensorflow" in sys.modules or importlib.util.find_spec("tf_keras") is None:
        return require("tensorflow", purpose)
    with temp_env("TF_USE_LEGACY_KERAS", "1"):
        tf = require("tensorflow", purpose)
        getattr(tf.keras, "Model", None)  # resolves TensorFlow's lazy keras module while the variable is set
    return tf


def keras_for(path: str) -> ModuleType:
    """The Keras that loads the model at ``path``: Keras 3 for a file Keras 3 saved, else tf-keras where installed."""
    import json
    import zipfile

    major = 2
    if zipfile.is_zipfile(path):
        with contextlib.suppress(KeyError, ValueError), zipfile.ZipFile(path) as z:
            major = int(str(json.loads(z.read("metadata.json")).get("keras_version", "2")).split(".")[0])
    if major < 3 and importlib.util.find_spec("tf_keras") is not None:
        return importlib.import_module("tf_keras")
    return importlib.import_module("keras")
