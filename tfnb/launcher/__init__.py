"""The driver side of a run: ``tfnb.run`` launches the barrier job, watches it and gives the verdict.

The barrier job is ``spark.range(n, numPartitions=n).mapInArrow(task, barrier=True)`` (or the fed
DataFrame split into n parts), which runs on classic and Spark Connect sessions alike. Tasks talk back
over the run's authenticated channel (logs, progress, failures); only partition 0, the chief, returns a
value. The package's modules, in the order a run meets them: :mod:`.runner` (``run`` itself: the launches
one after another), :mod:`.options` (what was asked, resolved once), :mod:`.spark` (what the cluster can
host), :mod:`.resources` (what each task asks Spark for, where the ps tasks go, whether it fits),
:mod:`.attempt` (one launch, watched) and :mod:`.jobs` (its barrier job(s), ps processes on the driver),
:mod:`.verdict` (what a failure was, and whether a relaunch helps), :mod:`.elastic` (an elastic run's size),
:mod:`.channel` and :mod:`.runlog` (what the tasks say, and the file that keeps it); :mod:`.hooks` is the
surface add-ons build on.
"""
from __future__ import annotations

from .._protocol import EventKind, RunEvent
from ..monitor.display import make_display
from .hooks import ArrowSpill, LaunchHooks, pickle_fn
from .options import RunOptions
from .runner import run
from .spark import check_cluster, get_spark

# The launch surface add-ons build on (tfnb.compat uses nothing else of the launcher): documented, kept stable.
__all__ = ["run", "RunOptions", "LaunchHooks", "ArrowSpill", "pickle_fn", "check_cluster", "get_spark",
           "make_display", "RunEvent", "EventKind"]
