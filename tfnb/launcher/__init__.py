"""The driver side of a run: ``tfnb.run`` launches the barrier job, watches it and gives the verdict.

The job is ``spark.range(n, numPartitions=n).mapInArrow(task, barrier=True)`` (or the fed DataFrame in n parts),
on classic and Spark Connect sessions alike; tasks talk back over the run's authenticated channel, and only the
chief returns a value. Modules in the order a run meets them: :mod:`.runner`, :mod:`.options`, :mod:`.spark`,
:mod:`.resources`, :mod:`.attempt` and :mod:`.jobs`, :mod:`.verdict`, :mod:`.elastic`, :mod:`.channel` and
:mod:`.runlog`; :mod:`.hooks` is the surface add-ons build on.
"""
from __future__ import annotations

from .._protocol import EventKind, RunEvent
from ..monitor.display import make_display
from .hooks import ArrowSpill, LaunchHooks, pickle_fn
from .options import RunOptions
from .runner import run
from .resources import is_connect
from .spark import check_cluster, get_spark

# The launch surface add-ons build on (tfnb.compat uses nothing else of the launcher): documented, kept stable.
__all__ = ["run", "RunOptions", "LaunchHooks", "ArrowSpill", "pickle_fn", "check_cluster", "get_spark",
           "is_connect", "make_display", "RunEvent", "EventKind"]
