"""Barrier-mode launch, driver side: validate, check slots, run the barrier job, gather the outcome.

The barrier job is ``spark.range(n, numPartitions=n).mapInArrow(task, barrier=True)`` (or the fed
DataFrame split into n parts), which runs on classic and Spark Connect sessions alike. Tasks talk
back over the run's authenticated channel (logs, progress, failures); only partition 0, the chief,
returns a value.
"""
from __future__ import annotations

import logging
import os
import queue
import re
import socket
import sys
import threading
import time
import uuid
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from . import events
from ._config import setting
from .errors import (KERAS3_MWMS, STALLED, ClusterError, ConfigError, RunCancelledError, RunTimeoutError,
                     TaskFailure, WorkerError, WorkerStalledError)
from .events import RunEvent
from .progress import make_display, show

log = logging.getLogger(__name__)

_CANCEL_WAIT = 20.0     # seconds to let Spark kill tasks after a cancel before giving up waiting
_STACK_WAIT = 5.0       # seconds to wait for the stacks of a stalled run's train_fn processes
_STALL_DEFAULT = 1800.0
# Spark's words for a task whose executor (or its Python worker) went away, as opposed to a task that raised.
_EXECUTOR_LOST = re.compile(r"ExecutorLostFailure|executor \S+ (was )?lost|Executor heartbeat timed out|"
                            r"Remote RPC client disassociated|Python worker exited unexpectedly|worker lost",
                            re.IGNORECASE)
_PER_REPLICA = re.compile(r"Attempt to convert a value \(PerReplica")  # Keras 3 under tf.distribute
_DRAIN_SLICE = 0.05     # seconds of task messages handled before the watch loop looks at its clock again
# events handed to the display at once: enough to fold them in one call, few enough that they die
# young (thousands held for a whole pass outlive the garbage collector's young generation, and each
# survivor brings its next sweep of every object in the process nearer: with 2,048 tasks the
# collector took 0.04 CPU-s/s at 500 events, 0.02 at 100)
_SHOW_EVERY = 100
_MAX_SHOWN_LINE = 2000  # characters of a log line the display gets; the run's log file has it whole


# ---------------------------------------------------------------- session and cluster checks


def _is_connect(spark) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _refuse_in_task(verb: str) -> None:
    """Stop a driver verb at once inside train_fn or any Spark task, where it would start a second Spark.

    Raises:
        ConfigError: this process is a train_fn process (TFNB_RUN_ID, which tfnb sets in each) or runs
            a Spark task (pyspark's TaskContext).
    """
    run_id = os.environ.get("TFNB_RUN_ID")
    pyspark = sys.modules.get("pyspark")  # a Spark task has imported it; the check imports nothing
    task = getattr(pyspark, "TaskContext", None)
    task = task.get() if task is not None else None
    if run_id is None and task is None:
        return
    if run_id is not None:
        where, fix = (f"inside train_fn (a train_fn process of run {run_id})",
                      "train_fn already runs on every worker: train there, and call tfnb.run once from the notebook")
    else:
        where, fix = (f"inside a Spark task (stage {task.stageId()}, partition {task.partitionId()}) on an executor",
                      "call it from the notebook, not from a UDF or a mapInArrow/mapPartitions/foreach function")
    raise ConfigError(f"{verb} was called {where}, but it runs on the Spark driver only; {fix}")


def get_spark(spark=None, num_slots: int = 2):
    """The session to run on: ``spark``, else the active one, else a new embedded ``local[N]`` session.

    For a new local session PYSPARK_PYTHON is set to this interpreter, so Spark's Python workers
    import the same packages as the notebook.
    """
    from ._deps import require_spark

    _refuse_in_task("tfnb's launcher")

    require_spark(spark)  # Spark >= 3.5, or one error naming the floor and the fix
    if spark is not None:
        return spark
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    cores = max(num_slots, os.cpu_count() or 1)
    return (SparkSession.builder.master(f"local[{cores}]").appName("tfnb")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate())


def _check_session(spark) -> None:
    """Refuse what is not a live SparkSession before anything calls into it (Py4J/AttributeError walls)."""
    if not (hasattr(type(spark), "conf") and callable(getattr(spark, "range", None))
            and callable(getattr(spark, "interruptTag", None))):
        hint = ("pass the SparkSession (spark), not its SparkContext" if type(spark).__name__ == "SparkContext"
                else "pass a SparkSession (classic or Spark Connect), or leave spark= out to use the active one")
        raise ConfigError(f"spark={repr(spark)[:80]} ({type(spark).__name__}) is not a SparkSession; {hint}")
    if _is_connect(spark):
        stopped = bool(getattr(spark, "is_stopped", False))
    else:
        jsc = getattr(getattr(spark, "_sc", None), "_jsc", None)
        try:
            stopped = jsc is None or jsc.sc().isStopped()
        except Exception:  # noqa: BLE001 - a dead JVM gateway: as stopped as it gets
            stopped = True
    if stopped:
        raise ConfigError("spark= is a stopped SparkSession (spark.stop() was called, or its SparkContext "
                          "ended); start a new one with SparkSession.builder.getOrCreate() and pass that, "
                          "or leave spark= out")


def _conf(spark, key: str, default: str | None = None) -> str | None:
    try:
        return spark.conf.get(key, default)
    except Exception:  # noqa: BLE001 - Connect raises its own types for unknown keys
        return default


def _local_slots(master: str) -> int | None:
    """Task slots implied by a local master string, None for cluster masters."""
    if master == "local":
        return 1
    m = re.fullmatch(r"local\[(\*|\d+)(?:,\s*\d+)?\]", master)
    if m:
        return os.cpu_count() or 1 if m.group(1) == "*" else int(m.group(1))
    m = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master)
    if m:
        return int(m.group(1)) * int(m.group(2))
    return None


def _cluster_slots(spark, needed: int, wait: float) -> tuple[int | None, str]:
    """(task slots Spark can run at once, master) — what a barrier stage needs to fit in."""
    master = _conf(spark, "spark.master", "") or ""
    local = _local_slots(master)
    if _is_connect(spark):
        # No SparkContext to ask; a local master string still says how many slots there are.
        cpus = int(_conf(spark, "spark.task.cpus", "1") or 1)
        return (local // cpus if local is not None else None), master
    jsc = spark.sparkContext._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    slots = jsc.maxNumConcurrentTasks(profile)
    if master.startswith("local") and not master.startswith("local-cluster"):
        return slots, master
    # Executors register a little after the session starts; give them a moment before judging.
    deadline = time.monotonic() + wait
    # wait for what the run needs, or (local-cluster) for every executor the master string promises
    target = needed if local is None else min(needed, local)
    while slots < target and time.monotonic() < deadline:
        time.sleep(0.25)
        slots = jsc.maxNumConcurrentTasks(profile)
    return slots, master


def check_cluster(spark, needed: int, wait: float | None = None, use_gpu: bool | None = None) -> None:
    """Fail fast when Spark could never schedule a barrier stage of ``needed`` tasks.

    Raises:
        ConfigError: ``spark`` is not a live SparkSession.
        ClusterError: dynamic allocation is on, the cluster has fewer task slots than needed, or
            GPUs are asked for (``use_gpu=True`` or spark.task.resource.gpu.amount) that it cannot give.
    """
    _check_session(spark)
    gpu_per_task = float(_conf(spark, "spark.task.resource.gpu.amount", "0") or 0)
    if use_gpu and gpu_per_task <= 0:
        # Spark hands GPUs only to tasks that ask for them; without this conf every task would fail after launch.
        raise ClusterError(
            f"use_gpu=True but spark.task.resource.gpu.amount is {gpu_per_task:g} on this session, so Spark "
            "assigns the tasks no GPU; start the cluster with spark.task.resource.gpu.amount=1 and "
            "spark.executor.resource.gpu.amount (plus a GPU discovery script), or pass use_gpu=None to run "
            "on whatever the tasks get")
    if (_conf(spark, "spark.dynamicAllocation.enabled", "false") or "false").lower() == "true":
        raise ClusterError(
            "Spark barrier mode does not run with dynamic allocation; start the cluster with "
            "spark.dynamicAllocation.enabled=false (on Databricks: a fixed-size cluster, autoscaling off)"
        )
    master = _conf(spark, "spark.master", "") or ""
    # Local tasks get the driver's GPUs; a cluster's, the executors' (a Connect client may not see that conf).
    owner = "driver" if re.fullmatch(r"local(\[.*\])?", master) else "executor"
    have = _conf(spark, f"spark.{owner}.resource.gpu.amount")
    if gpu_per_task > 0 and float(have or 0) <= 0 and (owner == "driver" or not _is_connect(spark)):
        raise ClusterError(
            f"spark.task.resource.gpu.amount={gpu_per_task:g} but spark.{owner}.resource.gpu.amount is "
            f"{have or 'unset'} on {master}, so no task could ever be given its GPU; unset "
            f"spark.task.resource.gpu.amount, or give the {owner} GPUs (spark.{owner}.resource.gpu.amount and "
            f"spark.{owner}.resource.gpu.discoveryScript)")
    # Seconds to let executors register on a cluster master before judging the slot count.
    wait = setting("slot_wait", wait, 30.0, float)
    slots, master = _cluster_slots(spark, needed, wait)
    if slots is not None and slots < needed:
        raise ClusterError(
            f"the run needs {needed} task slots (num_workers + num_ps) but the cluster ({master}) has "
            f"{slots}; lower num_workers/num_ps or add executors/cores (spark.executor.instances, "
            f"spark.executor.cores; spark.task.cpus={_conf(spark, 'spark.task.cpus', '1')})"
        )


_SHARED_ROOTS = ("/dbfs", "/Volumes", "/Workspace")  # Databricks: FUSE views of shared storage on every node
_SHARED_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs",
                        "9p", "virtiofs", "fuse"})  # and every fuse.* (sshfs, s3fs, gcsfuse...)


def _under(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/")


def _mount_type(path: str, table: str = "/proc/mounts") -> str:
    """The filesystem type of the mount holding ``path`` (the longest mount point in ``table``), "" unknown."""
    best, kind = "", ""
    try:
        with open(table) as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])  # \040 is a space
                if _under(path, point) and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        pass
    return kind


def is_shared_path(path, shared_prefixes: Sequence[str] = ()) -> bool:
    """Whether every host of a cluster sees ``path`` as the driver does.

    Shared: URLs (``s3://``, ``gs://``, ``dbfs:/``...), ``/dbfs``, ``/Volumes``, ``/Workspace``, paths on a
    network or FUSE mount (per the driver's /proc/mounts), and paths under ``shared_prefixes``.
    """
    from ._storage import normalize

    text = normalize(path)
    if "://" in text:
        return True
    real = os.path.realpath(text)
    if any(_under(p, root) for p in (text, real) for root in (*_SHARED_ROOTS, *shared_prefixes)):
        return True
    kind = _mount_type(real)
    return kind in _SHARED_FS or kind.startswith("fuse.")


def check_dirs_shared(spark, **dirs) -> None:
    """Refuse directories (``model_dir=...``) on the driver's own disk when executors run on other hosts.

    Local masters pass (``local[N]``: the executor is the driver; ``local-cluster``: executors on its
    machine), and so does a cluster whose executors all run on the driver's host. Spark Connect sessions
    pass unchecked: a Connect client cannot ask where the executors run short of running a job.
    TFNB_SHARED_PATHS (comma-separated prefixes) declares shared disks tfnb cannot detect.

    Raises:
        ConfigError: names the directories, the executor hosts and the fix.
    """
    dirs = {k: v for k, v in dirs.items() if v}
    master = _conf(spark, "spark.master", "") or ""
    if not dirs or _is_connect(spark) or master.startswith("local"):
        return
    prefixes = [p.strip() for p in setting("shared_paths", None, "", str).split(",") if p.strip()]
    local = {k: v for k, v in dirs.items() if not is_shared_path(v, prefixes)}
    if not local:
        return
    executors = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()  # the driver's own included
    hosts = sorted({e.host() for e in executors} - {_conf(spark, "spark.driver.host"), socket.gethostname()})
    if not hosts:
        return
    named = " and ".join(f"{k}={os.fspath(v)!r}" for k, v in local.items())
    raise ConfigError(
        f"{named} {'is' if len(local) == 1 else 'are'} on the driver's own disk, but executors run on other hosts "
        f"({', '.join(hosts[:5])}{', ...' if len(hosts) > 5 else ''}), where train_fn would write to folders the "
        "driver never sees; use storage every host sees: a Unity Catalog Volume "
        "('/Volumes/<catalog>/<schema>/<volume>/...'), a dbfs:/-backed '/dbfs/...' path or an 's3://bucket/prefix' "
        "URL (for a disk every host mounts at the same path, list its prefix in TFNB_SHARED_PATHS)")


def _last_line(msg: dict) -> str:
    """The last line a log message carries (one line, or a run of ``lines``)."""
    lines = msg.get("lines")
    return str(lines[-1] if lines else "") if isinstance(lines, list) else str(msg.get("line", ""))


def _driver_host(spark) -> str:
    """Where tasks reach the driver: loopback for local masters, else spark.driver.host."""
    master = _conf(spark, "spark.master", "") or ""
    if master.startswith("local") and not master.startswith("local-cluster"):
        return "127.0.0.1"
    host = _conf(spark, "spark.driver.host")
    if master.startswith("local-cluster") or host in (None, "localhost"):
        return host or "127.0.0.1"
    return host or socket.gethostbyname(socket.gethostname())


# ---------------------------------------------------------------- the run


@dataclass(frozen=True)
class _Outcome:
    value: Any = None
    failure: TaskFailure | None = None
    others: tuple = ()
    retryable: bool = False
    cause: str = ""          # one readable line: who failed how, and at which epoch
    epoch: int | None = None  # the epoch the run had reached when it failed
    resumed_epoch: int | None = None  # the first epoch this attempt trained
    stall: dict | None = None  # WorkerStalledError's fields when a task stalled
    error: Exception | None = None  # raised as it is (tfnb could not start on an executor)


@dataclass
class _Life:
    """What the driver last heard from one task: input of the stall watchdog and of relaunch reasons."""

    job_name: str
    task_index: int
    host: str = ""
    seen: float = field(default_factory=time.monotonic)  # last message of any kind
    state: str = "starting"
    final: bool = False      # reported done, stopped or failed: its end is explained
    step: dict = field(default_factory=dict)  # last progress report's epoch/step
    first_epoch: int | None = None
    line: str = ""
    stack: str | None = None

    @property
    def label(self) -> str:
        return f"{self.job_name} {self.task_index}"


@dataclass(frozen=True)
class LaunchHooks:
    """Launcher hooks tfnb.compat (the TensorFlowOnSpark API) builds on; not part of tfnb's public API.

    Attributes:
        feeder: feeds ``data`` (already one partition per task) through its own spill instead of
            tfnb.feeding.
        all_results: return every task's value as a list indexed by rank.
        daemon_ranks: tasks stopped (not failed) once every other task is done.
        cancel: setting this event cancels the run (RunCancelledError).
        keep_port: keep the task's port reserved while train_fn runs (fd in env TFNB_KEPT_PORT_FD).
        task_cwd: run train_fn in the Spark task's working directory.
    """

    feeder: Any = None
    all_results: bool = False
    daemon_ranks: frozenset = frozenset()
    cancel: threading.Event | None = None
    keep_port: bool = False
    task_cwd: bool = False


def pickle_fn(train_fn: Callable, args: Sequence) -> bytes:
    """``(train_fn, args)`` pickled as the tasks receive them; launcher surface for add-ons (tfnb.compat).

    Raises:
        ConfigError: they cannot be pickled; the message says what to change.
    """
    import cloudpickle

    try:
        return cloudpickle.dumps((train_fn, tuple(args)))
    except Exception as e:  # noqa: BLE001 - pickling errors come in many types
        raise ConfigError(
            f"train_fn or args cannot be sent to the workers: {type(e).__name__}: {e}. Define train_fn so "
            "it captures only plain values (no SparkSession, DataFrame, lock, open file or model object); "
            "create those inside train_fn or pass paths/values through args"
        ) from e


class _Attempt:
    """One launch of the barrier job, watched from the driver's main thread."""

    def __init__(self, spark, spec_kwargs: dict, data, display: Callable[[RunEvent], None],
                 deadline: float | None, num_tasks: int, num_ps: int, *,
                 daemon_ranks: frozenset = frozenset(), cancel: threading.Event | None = None,
                 grace: float = 3.0, stall_timeout: float | None = None):
        self.spark = spark
        self.display = display
        self.deadline = deadline
        self.num_tasks = num_tasks
        self.num_ps = num_ps
        from ._channel import Inbox
        from ._runlog import RunLog

        self.q = Inbox()  # bounded for the tasks' messages; see Inbox
        self.runlog = RunLog.for_run(spec_kwargs["run_id"], spec_kwargs.get("model_dir"))
        self.runlog.note(f"attempt {spec_kwargs['attempt']} of {spec_kwargs['max_attempts']}")
        if spec_kwargs["attempt"] == 1 and self.runlog.path:
            display(RunEvent(events.STATE, "driver", 0, {"log_file": self.runlog.path}))
        self._dropped_shown = (0, time.monotonic())
        self.failures: list[TaskFailure] = []
        self.tag = f"tfnb-{spec_kwargs['run_id']}-{spec_kwargs['attempt']}"
        self.data = data
        self.spec_kwargs = spec_kwargs
        self.attempt = spec_kwargs["attempt"]
        self.daemon_ranks = daemon_ranks
        self.done_ranks: set[int] = set()
        self.cancel = cancel
        self.grace = grace  # seconds to collect reports after the first sign of failure before deciding
        self.stall_timeout = stall_timeout
        self.lives: dict[int, _Life] = {}
        self.lost: list[TaskFailure] = []  # tasks whose executor or Python worker vanished
        self.job_error: BaseException | None = None
        self.boot: dict | None = None  # why tfnb could not start in a task or its train_fn process
        self.first_bad: float | None = None  # when the first sign of failure arrived
        self.decided = False  # past this point, disconnects are tfnb's own stopping of the tasks
        self._batch: list | None = None  # events of the current _drain pass, for the display
        self._feed: dict[int, tuple[int, bool]] = {}  # rank -> (rows so far, whole) while data= streams
        self._addrs: dict[int, dict] = {}  # rank -> its TensorFlow server's address and rows, as tasks report
        self._feed_told = 0.0

    def _show(self, event: RunEvent) -> None:
        # inside _drain the display gets the pass's events as one batch (one redraw, one write)
        if self._batch is not None:
            self._batch.append(event)
        else:
            self.display(event)

    def _on_message(self, peer: dict, msg: dict) -> None:
        kind = msg.get("kind")
        if kind == "feed":  # answered here, in milliseconds: train_fn waits for these rows
            self._on_feed(peer, msg)
            return
        if kind == "addr":  # likewise: every task waits for the others' addresses to start train_fn
            self._addrs[int(peer.get("rank", -1))] = {"addr": msg.get("addr"), "rows": msg.get("rows", 0)}
            if len(self._addrs) == self.num_tasks and all(r in self._addrs for r in range(self.num_tasks)):
                self.channel.broadcast({"kind": "cluster", "tasks": [self._addrs[r] for r in range(self.num_tasks)]})
            return
        # the channel thread: the file gets every line even while the display is behind
        self.runlog.message(peer, msg)
        self.q.put_message(peer, msg)

    def _on_feed(self, peer: dict, msg: dict) -> None:
        from .feeding import agree_counts

        self._feed[int(peer.get("rank", -1))] = (int(msg.get("rows", 0)), bool(msg.get("done")))
        answer = agree_counts(self._feed, self.num_tasks - self.num_ps)
        now = time.monotonic()
        # the smallest count at most 20 times a second (every answer goes to every task); the final at once
        if answer is not None and ("counts" in answer or now - self._feed_told >= 0.05):
            self._feed_told = now
            self.channel.broadcast(answer)

    def _log(self, job: str, idx: int, msg: dict) -> None:
        lines = msg.get("lines")
        if type(lines) is not list:  # one line; a carriage-return update when partial
            lines = [msg.get("line", "")]
        stream, partial, now = msg.get("stream"), msg.get("partial"), time.time()
        for line in lines:
            line = line if type(line) is str else str(line)
            if len(line) > _MAX_SHOWN_LINE:
                line = f"{line[:_MAX_SHOWN_LINE]} … [{len(line) - _MAX_SHOWN_LINE} more characters in the run's log file]"
            # partial: a carriage-return update, which the next line of this task replaces
            data = {"stream": stream, "line": line, "partial": True} if partial else {"stream": stream, "line": line}
            self._show(RunEvent(events.LOG, job, idx, data, now))

    def _job(self, spec) -> None:
        import cloudpickle

        from . import __version__
        from ._deps import job_tag
        from ._worker import RESULT_SCHEMA, task_entry

        try:
            if self.data is not None and self.spec_kwargs.get("feeder") is not None:
                source = self.data  # a feeder's DataFrame already has one partition per task
            elif self.data is not None:
                from .feeding import split_for_workers

                source = split_for_workers(self.data, self.num_tasks - self.num_ps, self.num_ps)
            else:
                source = self.spark.range(0, self.num_tasks, 1, self.num_tasks)
            with job_tag(self.spark, self.tag):  # Spark 3.5 classic sessions have no tags: a job group then
                task = task_entry(cloudpickle.dumps(spec), __version__)
                rows = source.mapInArrow(task, RESULT_SCHEMA, barrier=True).collect()
            self.q.put(("done", rows))
        except BaseException as e:  # noqa: BLE001 - reported to the main thread
            self.q.put(("error", e))

    def _cancel(self) -> None:
        from ._deps import interrupt_jobs

        try:
            interrupt_jobs(self.spark, self.tag)
        except Exception as e:  # noqa: BLE001 - the session may already be gone
            log.debug("interruptTag failed: %s", e)

    def _handle(self, peer: dict, msg: dict) -> None:
        self._note(peer, msg)
        kind = msg.get("kind")
        job, idx = peer.get("job_name", "?"), int(peer.get("task_index", -1))
        if kind == "batch":  # what a task gathered over a short window, handled as one unit
            for m in msg.get("items") or ():
                if isinstance(m, dict) and m.get("kind") == "log":
                    self._log(job, idx, m)
                elif isinstance(m, dict):
                    self._handle(peer, m)
        elif kind == "log":
            self._log(job, idx, msg)
        elif kind == "event":
            self._show(RunEvent(msg.get("event", events.PROGRESS), job, idx, msg.get("data") or {}))
        elif kind == "state":
            self._show(RunEvent(events.STATE, job, idx, {k: v for k, v in msg.items() if k != "kind"}))
            if msg.get("state") == "done" and job == "chief" and self.num_ps > 0:
                # ps and worker tasks serve until the coordinator is finished
                self.channel.broadcast({"kind": "stop"})
            if msg.get("state") == "done":
                self.done_ranks.add(int(peer.get("rank", -1)))
                if self.daemon_ranks and \
                        len(self.done_ranks - self.daemon_ranks) == self.num_tasks - len(self.daemon_ranks):
                    # daemon tasks (tfnb.compat's ps/evaluator) serve until every other task is done
                    self.channel.broadcast({"kind": "stop"})
                elif len(self.done_ranks) == self.num_tasks and self.spec_kwargs.get("linger"):
                    # finished train_fn processes kept their TensorFlow servers up for the peers' last
                    # collectives; now that every task is done they may exit
                    self.channel.broadcast({"kind": "end"})
        elif kind == "failed":
            f = msg.get("failure") or {}
            failure = TaskFailure(job_name=job, task_index=idx, exc_type=f.get("exc_type", "Error"),
                                  message=f.get("message", ""), traceback=f.get("traceback", ""),
                                  exit_code=f.get("exit_code"), attempt=self.attempt, host=peer.get("host", ""))
            self.failures.append(failure)
            if f.get("boot"):  # the train_fn process could not import tfnb
                self.boot = self.boot or {**f, "host": failure.host, "child": True}
            self._show(RunEvent(events.FAILED, job, idx, {"exc_type": failure.exc_type, "message": failure.message}))
            self._trouble()  # the others keep running until _settled(): their reports decide the retry

    def run(self) -> _Outcome:
        from ._channel import DriverChannel
        from ._worker import TaskSpec

        self.channel = DriverChannel(_driver_host(self.spark), self._on_message)
        spec = TaskSpec(channel=self.channel.address, token=self.channel.token, **self.spec_kwargs)
        job = threading.Thread(target=self._job, args=(spec,), name="tfnb-job", daemon=True)
        try:
            job.start()
            return self._watch(job)
        finally:
            self.q.put(("closed",))  # lifts the queue's bound so the channel thread never waits on it
            self.channel.close()
            self.runlog.close()

    def _stop_everything(self, job: threading.Thread) -> None:
        self.channel.broadcast({"kind": "stop"})
        self._cancel()
        end = time.monotonic() + _CANCEL_WAIT
        while job.is_alive() and time.monotonic() < end:
            self._drain(0.2)
        self.channel.wait_disconnected(max(0.0, end - time.monotonic()))

    def _stop_quietly(self, job: threading.Thread) -> None:
        # A second press of the notebook's stop button must not cut the cleanup short.
        while True:
            try:
                self._stop_everything(job)
                return
            except KeyboardInterrupt:
                continue

    def _drain(self, timeout: float):
        """Handle the tasks' messages for up to _DRAIN_SLICE s; returns a driver item ("done", ...) if one came."""
        try:
            items = self.q.get_many(timeout)
        except queue.Empty:
            return None
        end = time.monotonic() + _DRAIN_SLICE
        self._batch, done = [], 0
        try:
            while True:
                for item in items:
                    if item[0] != "msg":
                        break  # the job's end: always the last of the items
                    done += 1  # an interrupted message is not handled twice
                    self._handle(item[1], item[2])
                    if len(self._batch) >= _SHOW_EVERY:
                        batch, self._batch = self._batch, []
                        show(self.display, batch)
                if item[0] != "msg" or time.monotonic() > end:
                    break
                try:
                    items, done = self.q.get_many(0), 0
                except queue.Empty:
                    break
        except BaseException:
            self.q.unget(items[done:])  # interrupted (Ctrl-C): the messages not reached wait for the next pass
            raise
        finally:
            batch, self._batch = self._batch, None
            show(self.display, batch)
        dropped, shown = self._dropped_shown
        if self.q.dropped > dropped and time.monotonic() - shown > 5.0:
            # progress reports merged while the driver was behind: say so, without repeating it often
            self._dropped_shown = (self.q.dropped, time.monotonic())
            self.display(RunEvent(events.PROGRESS, "driver", 0, {"dropped_progress": self.q.dropped}))
        return None if item[0] == "msg" else item

    def _watch(self, job: threading.Thread) -> _Outcome:
        try:
            while True:
                left = None if self.deadline is None else self.deadline - time.monotonic()
                if left is not None and left <= 0:
                    self._stop_everything(job)
                    raise RunTimeoutError(
                        "tfnb.run timed out; the job was cancelled and its processes stopped. Raise "
                        "timeout= (or TFNB_TIMEOUT), or checkpoint to model_dir and resume")
                if self.cancel is not None and self.cancel.is_set():
                    raise KeyboardInterrupt  # stopped and reported like the notebook's stop button
                if self.first_bad is not None and self._settled():
                    return self._failed(job)
                stalled = self._stalled()
                if stalled:
                    return self._on_stall(job, stalled)
                item = self._drain(0.5 if left is None else min(0.5, left))
                if item is None:
                    continue
                if item[0] == "done":
                    self.channel.wait_disconnected(10.0)
                    self._drain_rest()
                    if self.failures or self.lost:
                        return self._failed(job)
                    rows = item[1]
                    import cloudpickle

                    if self.spec_kwargs.get("all_results"):
                        values = [None] * self.num_tasks
                        for row in rows:
                            values[row["rank"]] = cloudpickle.loads(row["result"])
                        return _Outcome(value=values, resumed_epoch=self._resumed_epoch())
                    value = cloudpickle.loads(rows[0]["result"]) if rows else None
                    return _Outcome(value=value, resumed_epoch=self._resumed_epoch())
                # The job failed. Spark's verdict says whether an executor was lost; what the tasks
                # themselves report (collected until _settled) says more than Spark's wrapper text.
                self.job_error = item[1]
                self.boot = self.boot or _boot_report(str(item[1]))
                first = next((l for l in str(item[1]).splitlines() if l.strip()), type(item[1]).__name__)
                if _EXECUTOR_LOST.search(str(item[1])):
                    self.lost.append(self._lost_in_spark(str(item[1]), first))
                self._trouble()
        except KeyboardInterrupt:
            self._stop_quietly(job)
            raise RunCancelledError("tfnb.run was interrupted; the Spark job was cancelled and every "
                                    "process it started was stopped") from None

    # ------------------------------------------------------------ failure classification

    def _note(self, peer: dict, msg: dict) -> None:
        """Bookkeeping on every message from a task: its last sign of life, step, line and state."""
        rank = int(peer.get("rank", -1))
        life = self.lives.get(rank)
        if life is None:
            life = self.lives[rank] = _Life(peer.get("job_name", "?"), int(peer.get("task_index", -1)),
                                            peer.get("host", ""))
        kind = msg.get("kind")
        if kind == "disconnected":
            if not life.final and not self.decided and self.job_error is None and \
                    not any(not f.retryable for f in self.failures):
                # Gone without a word: its executor or Python worker died. (After the job failed, or
                # after a task raised, Spark itself kills the remaining tasks: that is no news.)
                life.final = True
                self.lost.append(TaskFailure(
                    job_name=life.job_name, task_index=life.task_index, exc_type="ExecutorLost",
                    message="the task ended without a report: its executor or Spark Python worker was lost",
                    attempt=self.attempt, host=life.host))
                self._trouble()
            life.final = True
            return
        life.seen = time.monotonic()
        if kind == "batch":  # its other items come back through _handle, its log lines do not
            for m in reversed(msg.get("items") or ()):
                if isinstance(m, dict) and m.get("kind") == "log":
                    life.line = _last_line(m)
                    break
        elif kind == "log":
            life.line = _last_line(msg)
        elif kind == "event" and msg.get("event", events.PROGRESS) == events.PROGRESS:
            data = msg.get("data") or {}
            step = {k: data[k] for k in ("epoch", "step") if data.get(k) is not None}
            if step:
                life.step = step
                if life.first_epoch is None and isinstance(step.get("epoch"), int):
                    life.first_epoch = step["epoch"]
        elif kind == "state":
            life.state = str(msg.get("state", ""))
            life.final = life.final or life.state in ("done", "stopped")
        elif kind == "failed":
            life.final = True
        elif kind == "stack":
            life.stack = str(msg.get("text", ""))

    def _lost_in_spark(self, text: str, first: str) -> TaskFailure:
        # "barrier task ResultTask(<stage>, <partition>) finished unsuccessfully": the partition is the rank
        m = re.search(r"ResultTask\(\d+, (\d+)\)", text)
        life = self.lives.get(int(m.group(1))) if m else None
        return TaskFailure(job_name=life.job_name if life else "spark", task_index=life.task_index if life else -1,
                           exc_type="ExecutorLost", message=first.strip()[:500], attempt=self.attempt,
                           host=life.host if life else "")

    def _trouble(self) -> None:
        if self.first_bad is None:
            self.first_bad = time.monotonic()

    def _settled(self) -> bool:
        """Enough is known to decide the attempt's outcome (or the failure grace is over)."""
        if self.boot or any(f.died for f in self.failures):
            return True  # tfnb cannot start somewhere, or a process died: whatever else arrives changes nothing
        if self.lost:
            # Let Spark declare the executor lost (the job fails) before cancelling, or the relaunch
            # may be scheduled on the executor that is gone.
            return self.job_error is not None or time.monotonic() >= self.first_bad + self.grace
        if self.lives and len(self.lives) >= self.num_tasks and all(l.final for l in self.lives.values()):
            return True
        return time.monotonic() >= self.first_bad + self.grace

    def _verdict(self) -> tuple[TaskFailure, bool]:
        """(the failure that explains the attempt, whether a relaunch may fix it).

        A dead task or lost executor wins: the other tasks' errors are its consequences. Otherwise a
        plain exception is a bug, even when peers then fail with collective errors; only when every
        report is a peer-loss error (the dead peer's own report never came) is it bad luck.
        """
        deaths = sorted((f for f in (*self.failures, *self.lost) if f.died),
                        key=lambda f: (f.task_index < 0, f.exc_type != "ProcessDied"))
        if deaths:
            return deaths[0], True
        bugs = [f for f in self.failures if not f.retryable]
        if bugs:
            return bugs[0], False
        if self.failures:
            return self.failures[0], True
        return _spark_failure(self.job_error, self.attempt), True

    def _epoch_of(self, failure: TaskFailure) -> int | None:
        own = next((l for l in self.lives.values() if (l.job_name, l.task_index) ==
                    (failure.job_name, failure.task_index)), None)
        if own is not None and isinstance(own.step.get("epoch"), int):
            return own.step["epoch"]
        epochs = [l.step["epoch"] for l in self.lives.values() if isinstance(l.step.get("epoch"), int)]
        return max(epochs) if epochs else None

    def _resumed_epoch(self) -> int | None:
        firsts = [l.first_epoch for l in self.lives.values() if l.first_epoch is not None]
        return min(firsts) if firsts else None

    def _failed(self, job: threading.Thread) -> _Outcome:
        failure, retryable = self._verdict()
        self.decided = True
        if job.is_alive() or self.channel.connected:
            self._stop_everything(job)
        self._drain_rest()
        others = tuple(f for f in self.failures if f is not failure)
        if self.boot:
            error = _boot_error(self.boot, self.spec_kwargs["max_attempts"])
            return _Outcome(failure=failure, others=others, error=error, cause=str(error).split(";")[0])
        if _PER_REPLICA.search(failure.message) and KERAS3_MWMS not in failure.message:
            # Keras 3 under MultiWorkerMirroredStrategy past tfnb._child's guard of fit (evaluate, predict...)
            said = re.sub(r"\(PerReplica:\{.*?\}\)", "(PerReplica:{...})", " ".join(failure.message.split()))[:200]
            failure = dataclasses.replace(failure, message=f"{KERAS3_MWMS} (TensorFlow said: {said})")
        epoch = self._epoch_of(failure)
        return _Outcome(failure=failure, others=others, retryable=retryable,
                        cause=_cause(failure, retryable, epoch), epoch=epoch,
                        resumed_epoch=self._resumed_epoch())

    # ------------------------------------------------------------ stall watchdog

    def _stalled(self) -> list[_Life]:
        """Tasks whose train_fn runs but has sent nothing (no progress, no output) for stall_timeout."""
        if not self.stall_timeout or self.first_bad is not None:
            return []
        now = time.monotonic()
        # ps servers and tfnb.compat's daemon tasks are silent by design
        silent = [l for rank, l in self.lives.items() if l.state == "training" and not l.final
                  and rank not in self.daemon_ranks and now - l.seen > self.stall_timeout]
        return sorted(silent, key=lambda l: l.seen)

    def _on_stall(self, job: threading.Thread, stalled: list[_Life]) -> _Outcome:
        now = time.monotonic()
        worst = stalled[0]
        seconds = now - worst.seen
        message = f"silent for {seconds:.0f} s (no progress event, no output line)"
        if len(stalled) > 1:  # peers of a hung collective go quiet together
            message += "; also silent: " + ", ".join(l.label for l in stalled[1:])
        failure = TaskFailure(job_name=worst.job_name, task_index=worst.task_index, exc_type=STALLED,
                              message=message, attempt=self.attempt, host=worst.host)
        epoch, stall = self._epoch_of(failure), {"seconds": seconds, "last_step": dict(worst.step),
                                                 "last_line": worst.line}
        for life in stalled:
            self.display(RunEvent(events.STATE, life.job_name, life.task_index,
                                  {"state": "stalled", "seconds": round(now - life.seen, 1)}))
        # Every train_fn process dumps its stack: in a hung collective the stalled task's peers tell as much.
        running = [l for l in self.lives.values() if not l.final]
        for life in running:
            life.stack = None
        self.channel.broadcast({"kind": "dump"})
        end = now + _STACK_WAIT
        while any(l.stack is None for l in running) and time.monotonic() < end:
            self._drain(0.1)
        self.decided = True
        stall["stacks"] = {l.label: l.stack for l in running if l.stack}
        failure = dataclasses.replace(failure, traceback=worst.stack or "")
        self._stop_everything(job)
        self._drain_rest()
        return _Outcome(failure=failure, retryable=True, cause=_cause(failure, True, epoch), epoch=epoch,
                        resumed_epoch=self._resumed_epoch(), stall=stall)


    def _drain_rest(self) -> None:
        while True:
            try:
                item = self.q.get_nowait()
            except queue.Empty:
                return
            if item[0] == "msg":
                self._handle(item[1], item[2])


_TASK_OWN = ("TFNB_RUN_ID", "TFNB_ATTEMPT", "TFNB_EVENT_FD", "TFNB_HELD_PORT_FD", "TFNB_KEPT_PORT_FD",
             "TFNB_PREIMPORT")


# env= keys tfnb itself sets in every train_fn process, and what to do instead
_OWN_ENV = {**dict.fromkeys(_TASK_OWN, "it is tfnb's own plumbing; leave it out"),
            "TFNB_RUN_ID": "read ctx.run_id instead", "TFNB_ATTEMPT": "read ctx.attempt instead",
            "TFNB_PREIMPORT": "pass preimport= instead",
            "TF_CONFIG": "tfnb writes it per task for the cluster it launched; read ctx.tf_config instead",
            "CUDA_VISIBLE_DEVICES": "pass use_gpu= instead (None: the GPUs Spark assigned, False: none)",
            "PYTHONUNBUFFERED": "tfnb needs it to stream train_fn's output as it is printed; leave it out"}


def _check_env(env: dict, legacy_keras: bool) -> None:
    """env= may not set what tfnb sets itself: the ConfigError names the key and the knob to use."""
    own = dict(_OWN_ENV)
    if legacy_keras:
        own["TF_USE_LEGACY_KERAS"] = "pass legacy_keras=False instead (True, the default, sets it to 1)"
    taken = [k for k in env if k in own]
    if taken:  # keys only: env values are often credentials
        raise ConfigError("; ".join(f"env= sets {k}, which tfnb sets in every train_fn process: {own[k]}"
                                    for k in taken))


def _driver_settings() -> dict:
    """The driver's TFNB_* settings, so tfnb calls inside train_fn (stage, EventSync) resolve them alike."""
    return {k: v for k, v in os.environ.items() if k.startswith("TFNB_") and k not in _TASK_OWN}


def run_with_hooks(train_fn: Callable, hooks: LaunchHooks, **kwargs: Any) -> Any:
    """:func:`run` with launcher hooks: the entry point add-ons such as tfnb.compat build on.

    Args:
        train_fn: as for :func:`run`.
        hooks: what the add-on changes in the launch (see :class:`LaunchHooks`).
        **kwargs: :func:`run`'s keyword arguments.

    Example:
        >>> run_with_hooks(node_fn, LaunchHooks(all_results=True), num_workers=2)
    """
    return run(train_fn, _hooks=hooks, **kwargs)


def _spark_failure(exc: BaseException, attempt: int) -> TaskFailure:
    """A TaskFailure for a job that failed without any task reporting why (a lost executor, say)."""
    text = str(exc).strip()
    first = next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
    return TaskFailure(job_name="spark", task_index=-1, exc_type="TaskLost",
                       message=first[:500], traceback="", attempt=attempt)


_INSTALL_FIX = ("on Databricks %pip install it in the notebook (as the tfnb notebooks' tfnb_install() does) or add "
                "it as a cluster library; elsewhere install it into the Python the executors run (PYSPARK_PYTHON)")


def _boot_report(text: str) -> dict | None:
    """What tfnb._worker.task_entry reported from a task that could not start tfnb, found in Spark's error."""
    import json

    from ._worker import BOOT_MARK

    m = re.search(f"<{BOOT_MARK}>(.*?)</{BOOT_MARK}>", text)
    try:
        return json.loads(m.group(1)) if m else None
    except ValueError:
        return None


def _boot_error(info: dict, max_attempts: int) -> ClusterError:
    """One error for an executor where tfnb cannot start: where, what, that it was not relaunched, the fix."""
    from . import __version__

    where = (f"executor {info.get('host') or '?'} (Python {info.get('python_version', '?')} at "
             f"{info.get('python', '?')})")
    again = f"it would fail alike on every launch, so tfnb did not relaunch it (max_attempts={max_attempts})"
    if info.get("exc_type"):
        module = info.get("module") or "tfnb"
        who = "the train_fn process" if info.get("child") else "the Spark task"
        text = (f"{who} on {where} cannot import {module}: {info['exc_type']}: {info.get('message', '')}; "
                f"{again}. Install {module} where that Python finds it: {_INSTALL_FIX}")
    else:
        text = (f"tfnb {info.get('version')} on {where} but tfnb {__version__} on this driver: the run was refused "
                f"before any train_fn started; {again}. Install tfnb {__version__} on the executors too: "
                f"{_INSTALL_FIX}")
    tail = "".join(str(info.get("traceback") or "").splitlines(True)[-12:]).rstrip()
    return ClusterError(text + (f"\n\nLast lines of the executor's traceback:\n{tail}" if tail else ""))


def _cause(failure: TaskFailure, retryable: bool, epoch: int | None) -> str:
    """One readable line for the progress panel, the status file and the error: who, what, when."""
    label = failure.label
    if failure.exc_type == "ExecutorLost":
        text = f"{label}'s executor lost" if failure.task_index >= 0 else f"executor lost ({failure.message})"
    elif failure.exc_type == "ProcessDied":
        what = re.split(r" without | \(| before ", failure.message.replace("the train_fn process ", ""))[0]
        text = f"{label}'s train_fn process {what}"
    elif failure.exc_type == STALLED:
        text = f"{label} stalled, {failure.message.split(' (')[0]}"
    elif failure.exc_type == "TaskLost":
        text = f"the Spark job failed ({failure.message})"
    else:
        short = failure.exc_type.rpartition(".")[2]
        first = (failure.message.strip().splitlines() or [""])[0][:200]
        text = f"{label} lost a peer ({short}: {first})" if retryable else f"{label} raised {short}: {first}"
    return text + (f" at epoch {epoch}" if epoch is not None else "")


def run(train_fn: Callable, *, num_workers: int, args: Sequence = (), num_ps: int = 0, spark=None,
        use_gpu: bool | None = None, timeout: float | None = None, model_dir: str | None = None,
        log_dir: str | None = None, data=None, max_attempts: int | None = None,
        stall_timeout: float | str | None = "auto", env: dict | None = None, legacy_keras: bool | None = None,
        preimport: Sequence[str] | None = None, warm: bool | None = None,
        display: Callable[[RunEvent], None] | bool | None = None, profile_steps: tuple | int | None = None,
        mlflow: bool | str | None = None,
        _hooks: LaunchHooks | None = None) -> Any:
    """Run ``train_fn(ctx, *args)`` on a TensorFlow cluster inside one barrier-mode Spark stage.

    Each of the ``num_workers`` (+ ``num_ps``) tasks gets TF_CONFIG, its role and GPUs, then runs
    ``train_fn`` in a fresh Python process, so any number of runs work in one Spark session.
    Logs and progress stream to the notebook as they happen.

    Args:
        train_fn: ``train_fn(ctx: WorkerContext, *args)``; the chief's return value is returned.
        num_workers: chief + worker tasks (>= 1). Without ps tasks this is MultiWorkerMirroredStrategy.
        args: extra positional arguments for ``train_fn`` (must pickle).
        num_ps: parameter-server tasks; with ps tasks the chief runs the ParameterServerStrategy
            coordinator (``train_fn``), and worker/ps tasks run TensorFlow servers until it finishes.
        spark: the SparkSession (classic or Spark Connect); default: active session or a local one.
        use_gpu: None uses GPUs Spark assigned (spark.task.resource.gpu.amount); False hides GPUs;
            True requires them.
        timeout: seconds before the run is cancelled (RunTimeoutError). Env: TFNB_TIMEOUT.
        model_dir: checkpoint directory passed to ``ctx.model_dir``; tfnb also writes the run's status
            there (``tfnb_status.json``) so an Evaluator knows when training ended.
        log_dir: TensorBoard directory passed to ``ctx.log_dir``. When executors run on other hosts than
            the driver, ``model_dir`` and ``log_dir`` must be storage every host sees (a URL, ``/Volumes``,
            ``/dbfs``, ``/Workspace``, a network or FUSE mount, or a prefix in TFNB_SHARED_PATHS); a
            driver-local path is refused before launch (not checked on Spark Connect).
        data: a Spark DataFrame split evenly across the workers; read it with ``ctx.dataset(...)``.
        max_attempts: launches at most. tfnb relaunches when a task's process or executor died, when
            train_fn failed because a peer vanished (TensorFlow's UnavailableError and kin from collective
            ops / gRPC) and after a stall; any other exception in train_fn is a bug and is not retried.
            Default 2. Env: TFNB_MAX_ATTEMPTS; TFNB_FAILURE_GRACE (default 3 s) is how long tfnb
            collects the other tasks' reports after a first failure before deciding.
        stall_timeout: seconds a train_fn process may stay alive without sending a progress event or an
            output line before tfnb dumps every worker's Python stack, cancels the job and relaunches
            it (WorkerStalledError on the last attempt). Default "auto": TFNB_STALL_TIMEOUT, else 30
            minutes; None or 0 turns the watchdog off.
        env: extra environment variables for the train_fn processes. It may not set what tfnb sets
            itself (TF_CONFIG, CUDA_VISIBLE_DEVICES, PYTHONUNBUFFERED, TFNB_RUN_ID and tfnb's other
            TFNB_* plumbing, and TF_USE_LEGACY_KERAS unless ``legacy_keras=False``): ConfigError names the
            knob to use instead (``use_gpu=``, ``legacy_keras=``...).
        legacy_keras: set TF_USE_LEGACY_KERAS=1 so ``tf.keras`` is tf-keras (default True), the Keras
            that trains under MultiWorkerMirroredStrategy.
        preimport: modules each train_fn process imports while the tasks exchange addresses,
            hiding their import time (default ``("tensorflow",)``; ``()`` for train_fns without
            TensorFlow). Env: TFNB_PREIMPORT (comma-separated).
        warm: after a successful run, leave per task a standby process with ``preimport`` already
            imported, so a rerun with the same settings skips that import (default True; ~600 MB per
            standby with TensorFlow; it exits after TFNB_WARM_IDLE seconds, default 600). Env: TFNB_WARM.
        display: a callable receiving every RunEvent; False for none; default: a live widget in
            notebooks, prefixed log lines and a progress line on the console.
        profile_steps: ``(first, last)`` training steps (from 1, across epochs) each worker traces with
            TensorFlow's profiler, from ``ctx.progress_callback()`` or ``ctx.profile(step)``, into
            ``<log_dir>/plugins/profile/<run>/<job_name>-<task_index>.xplane.pb`` (needs ``log_dir``).
        mlflow: True or an experiment name: log the run as one MLflow run from the driver (settings,
            the chief's per-epoch metrics, relaunches, status, the model saved in ``model_dir``);
            see :mod:`tfnb.tracking`. Needs ``pip install 'tfnb[mlflow]'``.

    ``_hooks`` is internal: tfnb.compat's TensorFlowOnSpark API builds on it (see LaunchHooks).

    Returns:
        What ``train_fn`` returned on the chief.

    Raises:
        ConfigError: bad arguments (message names the fix), also a driver-local ``model_dir``/``log_dir``
            on a multi-host cluster, or a call from inside train_fn or a Spark task.
        ClusterError: the cluster cannot host the run (slots, dynamic allocation), or tfnb cannot start
            on an executor (not installed, or another version than the driver's); never relaunched.
        WorkerError: train_fn failed on a worker; carries task index, exception type, worker traceback
            and the history of attempts (``.attempts``).
        WorkerStalledError: a worker stalled on the last attempt; carries its stack and last step.
        RunTimeoutError: ``timeout`` ran out.
        RunCancelledError: interrupted (a KeyboardInterrupt subclass).

    Example:
        >>> def train_fn(ctx, epochs):
        ...     import tensorflow as tf
        ...     strategy = tf.distribute.MultiWorkerMirroredStrategy()
        ...     with strategy.scope():
        ...         model = build_model()
        ...     model.fit(make_dataset(ctx), epochs=epochs)
        ...     return model.evaluate(val_ds, return_dict=True)
        >>> metrics = tfnb.run(train_fn, num_workers=2, args=(3,))
    """
    _refuse_in_task("tfnb.run")
    if not callable(train_fn):
        raise ConfigError(f"train_fn must be a function taking (ctx, *args), got {type(train_fn).__name__}")
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
        raise ConfigError(f"num_workers={num_workers!r} but it must be an int >= 1; pass num_workers=2 for two workers")
    if not isinstance(num_ps, int) or num_ps < 0:
        raise ConfigError(f"num_ps={num_ps!r} but it must be an int >= 0; num_ps=0 runs MultiWorkerMirroredStrategy")
    if num_ps > 0 and num_workers < 2:
        raise ConfigError(f"num_ps={num_ps} needs a chief and at least one worker; set num_workers >= 2 or num_ps=0")
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise ConfigError(f"args must be a tuple of positional arguments, got {type(args).__name__}; "
                          f"write args=(value,)")
    timeout = setting("timeout", timeout, None, float)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ConfigError(f"timeout={timeout!r} must be a number of seconds > 0 (or None for no limit)")
    max_attempts = setting("max_attempts", max_attempts, 2, int)
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ConfigError(f"max_attempts={max_attempts!r} must be an int >= 1 (1 = never relaunch)")
    legacy_keras = setting("legacy_keras", legacy_keras, True, bool)
    stall_timeout = _stall_timeout(stall_timeout)
    grace = setting("failure_grace", None, 3.0, float)
    if grace < 0:
        raise ConfigError(f"TFNB_FAILURE_GRACE={grace} must be >= 0 seconds")
    if preimport is None:
        preimport = tuple(filter(None, setting("preimport", None, "tensorflow", str).split(",")))
    elif isinstance(preimport, str):
        raise ConfigError(f"preimport={preimport!r} must be a sequence of module names; write preimport=({preimport!r},)")
    elif not all(isinstance(m, str) for m in preimport):
        raise ConfigError(f"preimport={preimport!r} must name modules as strings, e.g. preimport=('tensorflow',)")
    if env is not None:
        bad = {k: v for k, v in env.items() if not (isinstance(k, str) and isinstance(v, str))} \
            if isinstance(env, dict) else env
        if bad:
            # name the entries by key and type only: env values are often credentials
            what = ({k: type(v).__name__ for k, v in bad.items()} if isinstance(bad, dict)
                    else type(bad).__name__)
            raise ConfigError(f"env must be a dict of str to str, not {what}; convert values with str()")
        _check_env(env, legacy_keras)
    if data is not None and num_ps > 0:
        raise ConfigError(
            f"data= feeds MultiWorkerMirroredStrategy workers, but num_ps={num_ps}; with parameter servers "
            "stage files per worker (tfnb.stage) and build the dataset in train_fn, or set num_ps=0")
    from .tracking import check_option, track

    tracked = check_option(mlflow)  # a bad value or a missing MLflow fails here, before Spark starts
    warm = setting("warm", warm, True, bool)
    warm_idle = setting("warm_idle", None, 600.0, float)
    from .profiling import check_profile_steps

    profile_steps = check_profile_steps(profile_steps, log_dir)
    payload = pickle_fn(train_fn, args)
    num_tasks = num_workers + num_ps
    spark = get_spark(spark, num_tasks)
    check_cluster(spark, num_tasks, use_gpu=use_gpu)
    check_dirs_shared(spark, model_dir=model_dir, log_dir=log_dir)
    feed = None
    hooks = _hooks or LaunchHooks()
    if data is not None and hooks.feeder is None:
        from .feeding import feed_spec

        feed = feed_spec(data)
    sink = make_display(display, num_workers, num_ps, max_attempts)
    run_id = uuid.uuid4().hex[:12]
    deadline = None if timeout is None else time.monotonic() + timeout
    if model_dir:
        from ._status import write_status

        write_status(model_dir, "running", run_id=run_id, attempt=1, attempts=[])
    if tracked:
        sink = track(sink, mlflow, run_id=run_id, spark=spark, num_workers=num_workers, num_ps=num_ps,
                     max_attempts=max_attempts, args=args, model_dir=model_dir, log_dir=log_dir, timeout=timeout)
    final_state = "failed"
    history: list[dict] = []  # one entry per launch; in the status file and on WorkerError.attempts
    try:
        for attempt in range(1, max_attempts + 1):
            started = time.time()
            spec_kwargs = dict(run_id=run_id, attempt=attempt, max_attempts=max_attempts,
                               num_workers=num_workers, num_ps=num_ps, payload=payload,
                               model_dir=model_dir, log_dir=log_dir, use_gpu=use_gpu,
                               env=tuple(sorted({**_driver_settings(), **(env or {})}.items())),
                               legacy_keras=legacy_keras,
                               preimport=tuple(preimport), feed=feed, feeder=hooks.feeder,
                               all_results=hooks.all_results, keep_port=hooks.keep_port,
                               task_cwd=hooks.task_cwd, warm=warm, warm_idle=warm_idle,
                               profile_steps=profile_steps,
                               # the profile plugin's run folder: TensorFlow's timestamp format, one per attempt
                               profile_run=time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime(started)),
                               # MultiWorkerMirroredStrategy: no process leaves while a peer may still
                               # need it for a last collective (ps and daemon tasks never "finish")
                               linger=num_tasks > 1 and num_ps == 0 and not hooks.daemon_ranks)
            outcome = _Attempt(spark, spec_kwargs, data, sink, deadline, num_tasks, num_ps,
                               daemon_ranks=hooks.daemon_ranks, cancel=hooks.cancel, grace=grace,
                               stall_timeout=stall_timeout).run()
            entry = {"attempt": attempt, "started": round(started, 3), "seconds": round(time.time() - started, 1),
                     "resumed_epoch": outcome.resumed_epoch}
            history.append(entry)
            if outcome.failure is None:
                final_state = "succeeded"
                entry["outcome"] = "succeeded"
                sink(RunEvent(events.STATE, "driver", 0, {"state": "succeeded", "attempt": attempt, "max_attempts": max_attempts}))
                return outcome.value
            relaunch = outcome.retryable and attempt < max_attempts
            entry.update(outcome="stalled" if outcome.stall else "failed", cause=outcome.cause,
                         retryable=outcome.retryable, epoch=outcome.epoch, relaunched=relaunch)
            if relaunch:
                log.info("tfnb: attempt %d of %d failed: %s; relaunching", attempt, max_attempts, outcome.cause)
                sink(RunEvent(events.ATTEMPT, "driver", 0, {
                    "attempt": attempt + 1, "max_attempts": max_attempts, "reason": outcome.cause,
                    "epoch": outcome.epoch, "retryable": True}))
                if model_dir:
                    from ._status import write_status

                    write_status(model_dir, "running", run_id=run_id, attempt=attempt + 1, attempts=history)
                _wait_for_slots(spark, num_tasks)
                continue
            sink(RunEvent(events.STATE, "driver", 0, {"state": "failed", "attempt": attempt, "max_attempts": max_attempts}))
            if outcome.error is not None:
                raise outcome.error
            if outcome.stall:
                raise WorkerStalledError(outcome.failure, outcome.others, tuple(history), **outcome.stall)
            raise WorkerError(outcome.failure, outcome.others, tuple(history))
    except KeyboardInterrupt:
        final_state = "cancelled"
        raise
    except RunTimeoutError:
        final_state = "timed out"  # only in the history: the status file's state stays "failed"
        raise
    finally:
        close = getattr(sink, "close", None)
        if close:
            close()
        if len(history) < attempt:  # interrupted or timed out mid-attempt
            history.append({"attempt": attempt, "started": round(started, 3),
                            "seconds": round(time.time() - started, 1), "outcome": final_state})
            final_state = "failed" if final_state == "timed out" else final_state
        if model_dir:
            from ._status import write_status

            write_status(model_dir, final_state, run_id=run_id, attempts=history)


def _stall_timeout(value) -> float | None:
    """stall_timeout= resolved: "auto" -> TFNB_STALL_TIMEOUT or 30 min; None/0/"off" -> no watchdog."""
    if isinstance(value, str) and value == "auto":
        raw = os.environ.get("TFNB_STALL_TIMEOUT")
        if raw is None:
            return _STALL_DEFAULT
        value = None if raw.strip().lower() in ("", "none", "off") else raw
        where = f"TFNB_STALL_TIMEOUT={raw!r}"
    else:
        where = f"stall_timeout={value!r}"
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if isinstance(value, bool) or not seconds >= 0:
        raise ConfigError(f"{where} must be a number of seconds >= 0 (None or 0 turns the stall watchdog off)")
    return seconds or None


def _wait_for_slots(spark, needed: int) -> None:
    """Before a relaunch, give a lost executor's replacement time to register (Spark would otherwise
    wait its barrier slot-check interval, 15 s by default, before even scheduling the job)."""
    if _is_connect(spark):
        return
    try:
        _cluster_slots(spark, needed, setting("slot_wait", None, 30.0, float))
    except Exception as e:  # noqa: BLE001 - the relaunch itself reports a cluster that cannot host it
        log.debug("slot check before relaunch failed: %s", e)

