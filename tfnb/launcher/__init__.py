"""The driver side of a run: ``tfnb.run`` launches the barrier job (``mapInArrow(task, barrier=True)``, classic and
Spark Connect alike), watches it over the run's channel and gives the verdict. :mod:`.hooks` is the surface add-ons
build on.
"""
from __future__ import annotations

from .._deps import temp_env
from .._protocol import EventKind, RunEvent
from ..monitor.display import make_display
from .hooks import ArrowSpill, LaunchHooks, pickle_fn
from .options import RunOptions
from .runner import run
from .resources import _conf as spark_conf, is_connect
from .spark import check_cluster, get_spark

# The launch surface add-ons build on (tfnb.compat uses nothing else of the launcher): documented, kept stable.
__all__ = ["run", "RunOptions", "LaunchHooks", "ArrowSpill", "pickle_fn", "check_cluster", "get_spark",
           "is_connect", "spark_conf", "temp_env", "make_display", "RunEvent", "EventKind"]
