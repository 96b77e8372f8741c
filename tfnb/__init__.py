"""tfnb: distributed TensorFlow training, evaluation and monitoring on Apache Spark, from notebooks.

The public names load their modules on first use, so heavy ones (TensorFlow, pyspark, ipywidgets, boto3) load only
when used. docs/getting-started.md shows a first run, docs/architecture.md the layout.
"""
from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

from ._protocol import VERSION as __version__

# public name -> module that defines it (imported on first use)
_EXPORTS = {name: module for module, names in {
    "launcher": ("run", "RunOptions"),
    "launcher.selfcheck": ("selfcheck", "SelfCheck"),
    "tuning": ("sweep", "SweepResult", "TrialResult", "SweepStoppedError", "SweepCancelledError"),
    "data.staging": ("stage", "StageResult", "StageProgress"),
    "data.inference": ("predict",),
    "monitor.evaluator": ("Evaluator", "EvalResult"),
    "monitor.sync": ("EventSync", "SyncStats"),
    "notebook.tensorboard": ("tensorboard",),
    "monitor.tensorboard": ("Launched", "Reused", "Failed", "TimedOut"),
    "_task.context": ("WorkerContext",),
    "_protocol": ("RunEvent",),
    "notebook": ("ProgressWidget", "ConsoleDisplay"),
    "errors": ("TfnbError", "ConfigError", "ClusterError", "WorkerError", "WorkerStalledError", "RunTimeoutError",
               "RunCancelledError", "MissingDependencyError", "StorageError", "EvaluatorError"),
}.items() for name in names}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # what the lazy exports are, for type checkers and IDEs
    from ._protocol import RunEvent
    from ._task.context import WorkerContext
    from .data.inference import predict
    from .data.staging import StageProgress, StageResult, stage
    from .errors import (ClusterError, ConfigError, EvaluatorError, MissingDependencyError, RunCancelledError,
                         RunTimeoutError, StorageError, TfnbError, WorkerError, WorkerStalledError)
    from .launcher import RunOptions, run
    from .launcher.selfcheck import SelfCheck, selfcheck
    from .monitor.evaluator import EvalResult, Evaluator
    from .monitor.sync import EventSync, SyncStats
    from .monitor.tensorboard import Failed, Launched, Reused, TimedOut
    from .notebook import ConsoleDisplay, ProgressWidget
    from .notebook.tensorboard import tensorboard
    from .tuning import SweepCancelledError, SweepResult, SweepStoppedError, TrialResult, sweep


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
