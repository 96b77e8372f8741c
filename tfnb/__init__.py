"""tfnb: distributed TensorFlow training, evaluation and monitoring on Apache Spark, from notebooks.

Example:
    >>> import tfnb
    >>> def train_fn(ctx):
    ...     import tensorflow as tf
    ...     strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ...     ...
    >>> tfnb.run(train_fn, num_workers=2)

Heavy modules (TensorFlow, pyspark, ipywidgets, boto3) are imported only when used.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "run": "cluster",
    "stage": "staging",
    "StageResult": "staging",
    "predict": "inference",
    "Evaluator": "evaluator",
    "EvalResult": "evaluator",
    "EventSync": "sync",
    "SyncError": "errors",
    "WorkerContext": "context",
    "RunEvent": "events",
    "ProgressWidget": "progress",
    "ConsoleDisplay": "progress",
    "TfnbError": "errors",
    "ConfigError": "errors",
    "ClusterError": "errors",
    "WorkerError": "errors",
    "WorkerStalledError": "errors",
    "RunTimeoutError": "errors",
    "RunCancelledError": "errors",
    "MissingDependencyError": "errors",
    "StagingError": "errors",
    "EvaluatorError": "errors",
    "DbcFormatError": "errors",
}

__all__ = sorted([*_EXPORTS, "tensorboard"])


def __getattr__(name: str):
    if name == "tensorboard":
        # tfnb/tensorboard.py is a callable module: tfnb.tensorboard(logdir) shows TensorBoard, and
        # stays callable after the submodule import rebinds the package attribute.
        return importlib.import_module(".tensorboard", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tfnb' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython):
    """``%load_ext tfnb``: registers tfnb's notebook magics (see tfnb.magics)."""
    from .magics import load_ipython_extension as load

    load(ipython)
