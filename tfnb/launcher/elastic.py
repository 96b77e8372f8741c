"""Elastic runs (``tfnb.run(..., min_workers=M)``): how many workers the next launch gets, and when a running launch
should be resized.

MultiWorkerMirroredStrategy has a fixed membership, so a resize is a relaunch from the last checkpoint, as after a
lost executor. After a loss tfnb waits ``replace_wait`` seconds for a replacement; then it relaunches with as many
workers as the executors left can hold, never fewer than ``min_workers``. While a launch runs, :class:`Watch` looks at
the executors every few seconds: once a smaller launch's whole run fits again, or when Spark gives notice that an
executor that runs one of its tasks is leaving (decommissioning, ``spark.decommission.enabled``: how cloud spot
clusters hear of a reclaimed node), it asks the tasks to stop at the next epoch boundary (tfnb._task.resize), so the
epoch's checkpoint is kept and the run relaunches at the size that fits. The room counted is the executors' free task
slots (cores less the tasks other jobs run there, as Spark's status store has them), the launch's own tasks counted
as free: a run does not stop to grow into slots another job (a sweep's other trial, a colleague's query) holds. Only
classic sessions: a Spark Connect client cannot see the executors.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from ..errors import ClusterError
from .resources import Placement, _conf, _describe, _executors, _is_connect, room
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


def run_executors(spark, tag: str) -> dict[str, int] | None:
    """Executor id -> how many of the launch's running tasks it holds (the launch's jobs run in job group ``tag``;
    fewer than its ``tasks`` while Spark still schedules them); None where Spark cannot say."""
    try:
        tracker, store = spark.sparkContext.statusTracker(), spark.sparkContext._jsc.sc().statusStore()
        where: dict[str, int] = {}
        for job in tracker.getJobIdsForGroup(tag):
            info = tracker.getJobInfo(job)
            for stage in (info.stageIds if info is not None else ()):
                attempt = tracker.getStageInfo(stage)
                if attempt is None:
                    continue
                listed = store.taskList(stage, attempt.currentAttemptId, 1 << 20)
                for i in range(listed.size()):
                    task = listed.apply(i)
                    if task.status() == "RUNNING":
                        where[task.executorId()] = where.get(task.executorId(), 0) + 1
    except Exception:  # noqa: BLE001 - Spark Connect, or a session going away
        return None
    return where


def _free(spark, leaving: frozenset, own: dict[str, int]) -> list[tuple[int, float]] | None:
    """(cores, GPUs) of each registered executor not ``leaving``, less what other jobs' running tasks hold there
    (``spark.task.cpus`` and ``spark.task.resource.gpu.amount`` each: Spark's status store counts tasks, not what
    each asked for); the ``own`` tasks (executor id -> count) are counted as free."""
    if _is_connect(spark):
        return None
    store = spark.sparkContext._jsc.sc().statusStore().executorList(True)
    task_cpus = int(_conf(spark, "spark.task.cpus", "1") or 1)
    task_gpus = float(_conf(spark, "spark.task.resource.gpu.amount", "0") or 0)
    fallback = float(_conf(spark, "spark.executor.resource.gpu.amount", "0") or 0)
    out = []
    for i in range(store.size()):
        e = store.apply(i)
        if e.id() == "driver" or e.id() in leaving:
            continue
        gpu = e.resources().get("gpu")
        gpus = float(len(gpu.get().addresses())) if gpu.isDefined() else fallback
        others = max(int(e.activeTasks()) - own.get(e.id(), 0), 0)
        out.append((max(int(e.totalCores()) - others * task_cpus, 0), max(gpus - others * task_gpus, 0.0)))
    return out


def worker_room(spark, placement: Placement, num_ps: int, own: dict[str, int] | None = None, *,
                total: bool = False) -> int | None:
    """How many chief/worker tasks the registered executors have free slots for, leaving ones left out (and ps
    tasks in the same stage taken out); the ``own`` tasks of a running launch (:func:`run_executors`) count as free
    slots, as they will be once it stops (``total``: every core counts, where the launch's tasks cannot be told
    apart). None where Spark cannot say (Spark Connect)."""
    local = _local_slots(spark.conf.get("spark.master", ""))
    if local is not None and not spark.conf.get("spark.master", "").startswith("local-cluster"):
        return local // max(placement.workers.cpus, 1) - (num_ps if placement.ps is None else 0)  # one JVM
    executors = _executors(spark, leaving(spark)) if total else _free(spark, leaving(spark), own or {})
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
    """While a launch of ``size`` workers runs (its jobs in job group ``tag``), looks at the executors every few
    seconds and calls ``resize`` once: when the run's ``wanted`` workers fit in the free slots again (``why``
    "executors returned"), or when an executor running one of its tasks is leaving."""

    def __init__(self, spark, placement: Placement, num_ps: int, size: int, wanted: int, resize: Callable[[], None],
                 tag: str | None = None):
        self.why: str | None = None
        self._stop = threading.Event()
        self._tag = tag
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
                own = run_executors(spark, self._tag) if self._tag else None
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
