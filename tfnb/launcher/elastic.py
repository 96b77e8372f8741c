"""Elastic runs (``tfnb.run(..., min_workers=M)``): how many workers the next launch gets, and when a running launch
should be resized.

MultiWorkerMirroredStrategy has a fixed membership, so a resize is a relaunch from the last checkpoint, as after a
lost executor. After a loss tfnb waits ``replace_wait`` seconds for a replacement; then it relaunches with as many
workers as the executors left can hold, never fewer than ``min_workers``. While a launch runs, :class:`Watch` looks at
the executors every few seconds: once a smaller launch's whole run fits again, or when Spark gives notice that an
executor is leaving (decommissioning, ``spark.decommission.enabled``: how cloud spot clusters hear of a reclaimed
node), it asks the tasks to stop at the next epoch boundary (tfnb._task.resize), so the epoch's checkpoint is kept
and the run relaunches at the size that fits. Only classic sessions: a Spark Connect client cannot see the executors.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from ..errors import ClusterError
from .resources import Placement, _describe, _executors, room
from .spark import _local_slots

_POLL = 2.0  # seconds between two counts of the executors' room


def leaving(spark) -> frozenset:
    """The executors Spark is decommissioning: they run their tasks on for a while, but take no new ones."""
    try:
        sc = spark.sparkContext._jsc.sc()
        store, scheduler = sc.statusStore().executorList(True), sc.taskScheduler()
        ids = [store.apply(i).id() for i in range(store.size())]
        return frozenset(i for i in ids if i != "driver" and scheduler.getExecutorDecommissionState(i).isDefined())
    except Exception:  # noqa: BLE001 - Spark Connect, or a Spark without decommissioning: no notice to read
        return frozenset()


def worker_room(spark, placement: Placement, num_ps: int) -> int | None:
    """How many chief/worker tasks the registered executors can hold, leaving ones left out (and ps tasks in the
    same stage taken out); None where Spark cannot say (Spark Connect)."""
    local = _local_slots(spark.conf.get("spark.master", ""))
    if local is not None and not spark.conf.get("spark.master", "").startswith("local-cluster"):
        return local // max(placement.workers.cpus, 1) - (num_ps if placement.ps is None else 0)  # one JVM
    executors = _executors(spark, leaving(spark))
    if executors is None:
        return None
    in_stage = num_ps if placement.ps is None and not placement.ps_on_driver else 0
    return max(room(executors, placement.workers, 1 << 20)[0] - in_stage, 0)


def next_size(spark, placement: Placement, num_ps: int, wanted: int, minimum: int, wait: float,
              cancelled: Callable[[], bool] = lambda: False) -> int:
    """The size of the next launch: ``wanted`` as soon as the executors can hold it, else after ``wait`` seconds as
    many as they hold, never fewer than ``minimum``.

    Raises:
        ClusterError: after ``wait`` the executors hold fewer than ``minimum`` workers (the slots it had and needed).
        KeyboardInterrupt: ``cancelled()`` turned true while waiting.
    """
    end = time.monotonic() + wait
    while True:
        have = worker_room(spark, placement, num_ps)
        if have is None or have >= wanted:
            return wanted
        if time.monotonic() >= end:
            if have >= minimum:
                return have
            raise ClusterError(
                f"the cluster can hold {have} of this run's workers, fewer than min_workers={minimum}; add executors "
                f"or lower min_workers\nNo replacement for the lost executors registered within {wait:g} s "
                f"(replace_wait). Executors now: {_describe(_executors(spark) or [])}.")
        if cancelled():
            raise KeyboardInterrupt
        time.sleep(min(_POLL, max(end - time.monotonic(), 0.05)))


class Watch:
    """While a launch of ``size`` workers runs, looks at the executors every few seconds and calls ``resize`` once:
    when the run's ``wanted`` workers fit again (``why`` "executors returned"), or when an executor is leaving."""

    def __init__(self, spark, placement: Placement, num_ps: int, size: int, wanted: int, resize: Callable[[], None]):
        self.why: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(spark, placement, num_ps, size, wanted, resize),
                                        name="tfnb-elastic-watch", daemon=True)

    def __enter__(self) -> "Watch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self, spark, placement, num_ps, size, wanted, resize) -> None:
        try:
            known = leaving(spark)  # leaving before this launch: it runs on the others already
        except Exception:  # noqa: BLE001 - a session going away: the attempt itself reports that
            return
        while not self._stop.wait(_POLL):
            try:
                gone = leaving(spark) - known
                have = worker_room(spark, placement, num_ps) if size < wanted else None
            except Exception:  # noqa: BLE001 - a session going away: the attempt itself reports that
                return
            if gone:
                self.why = f"executor {', '.join(sorted(gone))} leaving (decommission notice)"
            elif have is not None and have >= wanted:
                self.why = "executors returned"
            else:
                continue
            resize()
            return
