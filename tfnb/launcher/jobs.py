"""How one launch's tasks start, as its :class:`~tfnb.launcher.resources.Placement` says: the workers' barrier
job, the ps tasks' own barrier job beside it (they meet at the driver's address exchange), or the ps tasks as
processes on the driver.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Mapping

from ..errors import ClusterError
from .resources import Ask, Placement

_STOP_WAIT = 10.0  # seconds a driver ps process has to leave after the run ends before it is killed


def collect(source, spec, placement: Placement, ask: Ask | None) -> list:
    """Run ``spec``'s tasks as one barrier stage over ``source``'s partitions, asking ``ask`` of each (None: the
    session's conf)."""
    import cloudpickle

    from .._protocol import VERSION as __version__
    from .._task.entry import RESULT_SCHEMA, task_entry

    task = task_entry(cloudpickle.dumps(spec), __version__)
    if ask is None or placement.build == "profile":  # a profile: Spark 4.0+, classic and Connect
        profile = {} if ask is None else {"profile": placement.profile(ask)}
        return source.mapInArrow(task, RESULT_SCHEMA, barrier=True, **profile).collect()
    # Spark 3.5, classic sessions: the profile goes on a barrier RDD of the same stage
    rdd = source.mapInArrow(task, RESULT_SCHEMA).rdd.barrier()
    return rdd.mapPartitions(lambda rows: rows).withResources(placement.profile(ask)).collect()


def run_jobs(spark, spec, placement: Placement, source, num_ps: int, tag: str,
             report: Callable[[tuple], None]) -> None:
    """The launch's barrier job(s); ``report`` gets ``("done", rows)`` once all ended well, ``("error", e)`` as
    soon as one failed."""
    from .spark import job_tag

    ps_thread, ps_failed = None, []
    try:
        if placement.ps is not None:
            def ps_job():
                try:
                    ps_spec = dataclasses.replace(spec, first_rank=spec.num_workers)
                    with job_tag(spark, tag):
                        collect(spark.range(0, num_ps, 1, num_ps), ps_spec, placement,
                                placement.ps if placement.ps_profile else None)
                except BaseException as e:  # noqa: BLE001 - reported to the main thread at once
                    ps_failed.append(e)
                    report(("error", e))

            ps_thread = threading.Thread(target=ps_job, name="tfnb-ps-job", daemon=True)
            ps_thread.start()
        with job_tag(spark, tag):  # a job group on classic sessions
            rows = collect(source, spec, placement, placement.workers if placement.worker_profile else None)
        if ps_thread is not None:
            ps_thread.join()
        if not ps_failed:
            report(("done", rows))
    except BaseException as e:  # noqa: BLE001 - reported to the main thread
        report(("error", e))


def exchange_overdue(heard: Mapping[int, float], num_workers: int, num_ps: int, wait: float) -> ClusterError | None:
    """The error that ends a launch whose ps tasks run as a barrier job of their own once one job's tasks all reported
    their address (``heard``: rank -> when) and waited ``wait`` s (TFNB_PS_JOB_WAIT) for the other's; else None."""
    jobs = {"the chief/worker tasks'": range(num_workers), "the ps tasks'": range(num_workers, num_workers + num_ps)}
    heard = dict(heard)  # written on the channel's thread
    ready = {job: max(heard[r] for r in ranks) for job, ranks in jobs.items() if all(r in heard for r in ranks)}
    waited = time.monotonic() - next(iter(ready.values()), 0.0)
    if len(ready) != 1 or waited < wait:
        return None
    other = next(j for j in jobs if j not in ready)
    missing = sum(r not in heard for r in jobs[other])
    return ClusterError(
        f"{next(iter(ready))} barrier job waited {waited:.0f} s at the address exchange for {other} barrier job, which "
        f"did not start ({missing} of {len(jobs[other])} tasks never reported): other Spark jobs took its task slots "
        "after tfnb checked that both jobs fit; run again once they finish (or stop them), run the ps tasks on the "
        f"driver (ps_placement='driver'), or let it wait longer (TFNB_PS_JOB_WAIT={wait:g})")


class DriverPs:
    """The ps tasks of one launch as processes on the driver (``ps_placement="driver"``): ``python -m
    tfnb._task.local``, the barrier task's body without Spark, given its spec on stdin, which the launcher keeps
    open (the process exits when it closes). ``on_exit(rank, failure)`` hears of one that failed."""

    def __init__(self, spec, host: str, on_exit: Callable[[int, dict], None]):
        self.spec, self.host, self.on_exit = spec, host, on_exit
        self.procs: dict[int, subprocess.Popen] = {}
        self.stopping = threading.Event()

    def start(self) -> "DriverPs":
        env = dict(os.environ)
        # this driver's tfnb, wherever the notebook imported it from
        home = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([home] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        for i in range(self.spec.num_ps):
            rank = self.spec.num_workers + i
            proc = subprocess.Popen([sys.executable, "-m", "tfnb._task.local"], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                    start_new_session=True)
            blob = pickle.dumps((self.spec, rank, self.host))  # holds the run's secret: never argv or a file
            proc.stdin.write(struct.pack(">Q", len(blob)) + blob)
            proc.stdin.flush()
            self.procs[rank] = proc
            threading.Thread(target=self._watch, args=(rank, proc), name=f"tfnb-driver-ps-{i}", daemon=True).start()
        return self

    def _watch(self, rank: int, proc: subprocess.Popen) -> None:
        err = proc.stderr.read().decode(errors="replace")[-2000:]
        code = proc.wait()
        if code == 0 or self.stopping.is_set():
            return
        signals = signal.Signals._value2member_map_
        how = f"was killed by {signals[-code].name if -code in signals else -code}" if code < 0 else \
            f"exited with code {code}"
        last = next((line for line in reversed(err.strip().splitlines()) if line.strip()), "")
        message = f"the ps process on the driver {how}" + (f" ({last[:300]})" if last else "")
        self.on_exit(rank, {"exc_type": "ProcessDied", "message": message, "traceback": err, "exit_code": code})

    def stop(self) -> None:
        """End every process; whatever remains after _STOP_WAIT is killed with its group."""
        self.stopping.set()
        for proc in self.procs.values():
            with contextlib.suppress(OSError):
                proc.stdin.close()  # the parent-death watch: the process exits
        for proc in self.procs.values():
            try:
                proc.wait(timeout=_STOP_WAIT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

