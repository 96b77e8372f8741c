"""Elastic runs (``tfnb.run(..., min_workers=M)``): the next launch's size, and when a running launch resizes.

A resize is a relaunch from the last checkpoint (MultiWorkerMirroredStrategy's membership is fixed); room is free
task slots, on executors not decommissioning. Classic sessions only (docs/launcher.md, "Elastic runs").
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Callable

from ..errors import ClusterError
from .resources import Placement, _describe, _executors, room

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


def run_executors(spark, tag: str) -> dict[str, int] | None:
    """Executor id -> running tasks of the launch in job group ``tag``; None where Spark cannot say."""
    try:
        tracker, store = spark.sparkContext.statusTracker(), spark.sparkContext._jsc.sc().statusStore()
        where: Counter[str] = Counter()
        for job in tracker.getJobIdsForGroup(tag):
            info = tracker.getJobInfo(job)
            for stage in (info.stageIds if info is not None else ()):
                attempt = tracker.getStageInfo(stage)
                if attempt is not None:
                    listed = store.taskList(stage, attempt.currentAttemptId, 1 << 20)
                    tasks = (listed.apply(i) for i in range(listed.size()))
                    where.update(task.executorId() for task in tasks if task.status() == "RUNNING")
    except Exception:  # noqa: BLE001 - Spark Connect, or a session going away
        return None
    return where


def worker_room(spark, placement: Placement, num_ps: int, own: dict[str, int] | None = None, *,
                total: bool = False) -> int | None:
    """Chief/worker tasks the free slots of the executors not leaving hold, less ps tasks of the same stage; the
    ``own`` tasks of a running launch count as free (``total``: every core does). None on Spark Connect."""
    executors = _executors(spark, leaving(spark), None if total else own or {})
    if executors is None:
        return None
    in_stage = num_ps if placement.ps is None and not placement.ps_on_driver else 0
    return max(room(executors, placement.workers, 1 << 20)[0] - in_stage, 0)


def next_size(spark, placement: Placement, num_ps: int, wanted: int, minimum: int, wait: float,
              cancelled: Callable[[], bool] = lambda: False) -> int:
    """``wanted`` as soon as the executors hold it, else after ``wait`` s as many as they hold: ClusterError below
    ``minimum``, KeyboardInterrupt once ``cancelled()``."""
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
    """While a launch of ``size`` workers runs (job group ``tag``), calls ``resize`` once: when ``wanted`` workers fit
    the free slots again (``why``: "executors returned"), or when an executor running one of its tasks leaves."""

    def __init__(self, spark, placement: Placement, num_ps: int, size: int, wanted: int, resize: Callable[[], None],
                 tag: str):
        self.why: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(spark, placement, num_ps, size, wanted, resize, tag),
                                        name="tfnb-elastic-watch", daemon=True)

    def __enter__(self) -> "Watch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self, spark, placement, num_ps, size, wanted, resize, tag) -> None:
        known = leaving(spark)  # leaving before this launch: it runs on the others already
        while not self._stop.wait(_POLL):
            try:
                gone = leaving(spark) - known
                own = run_executors(spark, tag)
                scheduled = own is not None and sum(own.values()) >= size + num_ps  # every task of the launch runs
                if gone and own is not None:
                    if scheduled:  # another run's or job's executor: it takes no new task, so none of this launch's
                        known |= gone - own.keys()
                    gone &= own.keys()
                have = None
                if size < wanted and (own is None or scheduled):
                    have = worker_room(spark, placement, num_ps, own, total=own is None)
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
