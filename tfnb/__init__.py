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
import sys
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> module that defines it (imported on first use)
_EXPORTS = {
    "run": "cluster",
    "stage": "staging",
    "StageResult": "staging",
    "StageProgress": "staging",
    "predict": "inference",
    "Evaluator": "evaluator",
    "EvalResult": "evaluator",
    "EventSync": "sync",
    "SyncStats": "sync",
    "SyncError": "errors",
    "WorkerContext": "context",
    "RunEvent": "events",
    "ProgressWidget": "notebook",
    "ConsoleDisplay": "progress",
    "Launched": "_tb_process",
    "Reused": "_tb_process",
    "Failed": "_tb_process",
    "TimedOut": "_tb_process",
    "TfnbError": "errors",
    "ConfigError": "errors",
    "ClusterError": "errors",
    "WorkerError": "errors",
    "WorkerStalledError": "errors",
    "RunTimeoutError": "errors",
    "RunCancelledError": "errors",
    "MissingDependencyError": "errors",
    "StagingError": "errors",
    "StorageError": "errors",
    "EvaluatorError": "errors",
}

__all__ = sorted([*_EXPORTS, "tensorboard"])

if TYPE_CHECKING:  # what the lazy exports are, for type checkers and IDEs
    from . import tensorboard
    from ._tb_process import Failed, Launched, Reused, TimedOut
    from .cluster import run
    from .context import WorkerContext
    from .errors import (ClusterError, ConfigError, EvaluatorError, MissingDependencyError, RunCancelledError,
                         RunTimeoutError, StagingError, StorageError, SyncError, TfnbError, WorkerError,
                         WorkerStalledError)
    from .evaluator import EvalResult, Evaluator
    from .events import RunEvent
    from .inference import predict
    from .notebook import ProgressWidget
    from .progress import ConsoleDisplay
    from .staging import StageProgress, StageResult, stage
    from .sync import EventSync, SyncStats


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
    """``%load_ext tfnb``: loads the notebook layer and registers its magics (see tfnb.notebook.magics)."""
    from .notebook import load_ipython_extension as load

    load(ipython)


# The notebook layer plugs its widget into the core's display registry. Loading it here, only when
# IPython is, gives notebook users the widget by default while the core modules never import it
# (Spark's Python workers and train_fn processes have no IPython, so they never load it either).
if "IPython" in sys.modules:
    from . import notebook  # noqa: E402,F401
