"""tfnb: distributed TensorFlow training, evaluation and monitoring on Apache Spark, from notebooks.

Example:
    >>> import tfnb
    >>> def train_fn(ctx):
    ...     import tensorflow as tf
    ...     strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ...     ...
    >>> tfnb.run(train_fn, num_workers=2)

Heavy modules (TensorFlow, pyspark, ipywidgets, boto3) are imported only when used. The layout
(docs/architecture.md): :mod:`tfnb.launcher` is the driver side of a run, :mod:`tfnb._task` what runs
inside a barrier task, :mod:`tfnb._protocol` what crosses the wire, :mod:`tfnb.data` staging, feeding
and predict, :mod:`tfnb.storage` the one storage layer, :mod:`tfnb.monitor` sync, evaluator, TensorBoard,
tracking and the run model, :mod:`tfnb.notebook` the display layer, :mod:`tfnb.compat` the
TensorFlowOnSpark and spark-tensorflow-distributor APIs.
"""
from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

from ._protocol import VERSION as __version__

# public name -> module that defines it (imported on first use)
_EXPORTS = {
    "run": "launcher",
    "RunOptions": "launcher",
    "stage": "data.staging",
    "StageResult": "data.staging",
    "StageProgress": "data.staging",
    "predict": "data.inference",
    "Evaluator": "monitor.evaluator",
    "EvalResult": "monitor.evaluator",
    "EventSync": "monitor.sync",
    "SyncStats": "monitor.sync",
    "tensorboard": "notebook.tensorboard",
    "Launched": "monitor.tensorboard",
    "Reused": "monitor.tensorboard",
    "Failed": "monitor.tensorboard",
    "TimedOut": "monitor.tensorboard",
    "WorkerContext": "_task.context",
    "RunEvent": "_protocol",
    "ProgressWidget": "notebook",
    "ConsoleDisplay": "notebook",
    "TfnbError": "errors",
    "ConfigError": "errors",
    "ClusterError": "errors",
    "WorkerError": "errors",
    "WorkerStalledError": "errors",
    "RunTimeoutError": "errors",
    "RunCancelledError": "errors",
    "MissingDependencyError": "errors",
    "StorageError": "errors",
    "EvaluatorError": "errors",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # what the lazy exports are, for type checkers and IDEs
    from ._protocol import RunEvent
    from ._task.context import WorkerContext
    from .data.inference import predict
    from .data.staging import StageProgress, StageResult, stage
    from .errors import (ClusterError, ConfigError, EvaluatorError, MissingDependencyError, RunCancelledError,
                         RunTimeoutError, StorageError, TfnbError, WorkerError, WorkerStalledError)
    from .launcher import RunOptions, run
    from .monitor.evaluator import EvalResult, Evaluator
    from .monitor.sync import EventSync, SyncStats
    from .monitor.tensorboard import Failed, Launched, Reused, TimedOut
    from .notebook import ConsoleDisplay, ProgressWidget
    from .notebook.tensorboard import tensorboard


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tfnb' has no attribute {name!r}")
    # The display layer plugs into the core's registry when imported: the first public verb brings it,
    # so tfnb.run shows a console or widget display while no core module imports it.
    importlib.import_module(".notebook", __name__)
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
