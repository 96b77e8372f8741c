"""What runs inside one barrier task: learn the peers, set TF_CONFIG, run train_fn in a child process.

Everything here executes on an executor, in Spark's Python worker. It receives a
:class:`TaskSpec` of plain values (no SparkContext, nothing of the driver's) and
the task's Arrow batches, and yields one Arrow batch (the chief's pickled result).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from . import events
from ._child import (CONTEXT, DUMP_SIGNAL, END, ENV_HELD_PORT_FD, ENV_PREIMPORT, ERROR, FINISHED, GO, PAYLOAD,
                     RESULT, STACKS)
from .context import WorkerContext

RESULT_SCHEMA = "rank int, result binary"
# With TaskSpec.keep_port, a second descriptor of the reserved port's socket, which the child does
# not close before train_fn (tfnb.compat hands it to map_fun as ctx.tmp_socket).
ENV_KEPT_PORT_FD = "TFNB_KEPT_PORT_FD"
_MAX_STACK = 64 << 10  # characters of a stack dump sent to the driver


@dataclass(frozen=True)
class TaskSpec:
    """Everything a barrier task needs, as plain values the driver fixed before launch."""

    run_id: str
    attempt: int
    max_attempts: int
    num_workers: int
    num_ps: int
    channel: tuple
    token: str = field(repr=False)
    payload: bytes = field(repr=False)  # cloudpickle of (train_fn, args)
    model_dir: str | None = None
    log_dir: str | None = None
    use_gpu: bool | None = None
    env: tuple = field(default=(), repr=False)  # ((name, value), ...) for the train_fn process; often credentials
    legacy_keras: bool = True
    preimport: tuple = ("tensorflow",)  # imported by the child while the tasks exchange addresses
    feed: Any = None  # feeding.FeedSpec when tfnb.run(data=df)
    profile_steps: tuple | None = None  # (first, last) steps each worker traces (tfnb.profiling)
    profile_run: str = ""  # the profile plugin's run folder for this attempt
    stop_grace: float = 5.0
    # Internal options for tfnb.compat (TensorFlowOnSpark API); the defaults keep tfnb.run's behaviour.
    feeder: Any = None  # replaces tfnb.feeding: .spill(batches, workdir) -> .rows; .finish(spilled, rows) -> ctx.feed
    all_results: bool = False  # every task returns its train_fn value, not only the chief
    keep_port: bool = False  # the child also gets ENV_KEPT_PORT_FD, open while train_fn runs
    task_cwd: bool = False  # the child runs in the Spark task's working directory, not in its scratch dir
    warm: bool = False  # hand the payload to a warm standby when one matches, leave one after success
    warm_idle: float = 600.0  # seconds an unclaimed standby waits before it exits
    linger: bool = False  # a finished train_fn process waits until every task's train_fn has returned


# Start-up lines TensorFlow's C++ logging prints before it reads TF_CPP_MIN_LOG_LEVEL: on every
# import, in every process, and never actionable. Dropped unless TF_CPP_MIN_LOG_LEVEL is 0.
_TF_STARTUP_NOISE = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    r"|^[IWE]\d{4} [\d:.]+\s+\d+ (port\.cc|cudart_stub\.cc|cpu_feature_guard\.cc|cuda_platform\.cc|"
    r"cuda_executor\.cc|cuda_dnn\.cc|cuda_fft\.cc|cuda_blas\.cc)(:\d+)?\] "
    r"|^To enable the following instructions: .* in other operations, rebuild TensorFlow")


def is_startup_noise(line: str, min_log_level: str) -> bool:
    return min_log_level not in ("", "0") and bool(_TF_STARTUP_NOISE.match(line))


_MAX_LINE = 64 << 10    # characters of one output line sent to the driver; longer ones are cut with a marker
_PARTIAL_EVERY = 1.0    # seconds between two updates of a carriage-return line (a progress bar) sent on
_LINE_END = re.compile(rb"[\r\n]")


class _Lines:
    """Splits a child's output into lines for ``emit(line, partial=False)``.

    A carriage return rewrites the current line (Keras' ``verbose=1`` bar, tqdm): those updates are
    folded to the latest state, sent as ``partial`` at most every _PARTIAL_EVERY seconds, and the
    state the line ends in (at its newline) is sent as the line. Backspaces are dropped; lines past
    _MAX_LINE characters are cut with a marker.
    """

    def __init__(self, emit, clock=time.monotonic):
        self._emit = emit
        self._clock = clock
        self._buf = b""
        self._latest: bytes | None = None   # the last carriage-return state of the current line
        self._shown = float("-inf")

    def feed(self, data: bytes) -> None:
        buf = self._buf + data
        pos = 0
        for m in _LINE_END.finditer(buf):
            seg = buf[pos:m.start()]
            pos = m.end()
            if m.group() == b"\n":
                if not seg.strip(b"\x08") and self._latest is not None:
                    seg = self._latest
                self._latest = None
                self._send(seg, False)
            elif seg.strip(b"\x08"):
                self._latest = seg
                now = self._clock()
                if now - self._shown >= _PARTIAL_EVERY:
                    self._shown = now
                    self._send(seg, True)
        self._buf = buf[pos:]
        if len(self._buf) > 4 * _MAX_LINE:
            # no line end in sight: don't hold an unbounded line
            self._send(self._buf, False)
            self._buf = b""

    def end(self) -> None:
        if self._buf.strip(b"\x08") or self._latest is not None:
            self._send(self._buf if self._buf.strip(b"\x08") else self._latest, False)
        self._buf, self._latest = b"", None

    def _send(self, seg: bytes, partial: bool) -> None:
        line = seg.replace(b"\x08", b"").decode("utf-8", "replace")
        if len(line) > _MAX_LINE:
            line = f"{line[:_MAX_LINE]} … [{len(line) - _MAX_LINE} more characters cut]"
        if partial:
            self._emit(line, True)
        else:
            self._emit(line)  # the events pipe's handler takes the line alone


class TaskFailed(RuntimeError):
    """Raised in the Spark task so the barrier stage fails; the driver already has the details."""


# ---------------------------------------------------------------- small pure functions


def assign_role(rank: int, num_workers: int, num_ps: int) -> tuple[str, int]:
    """(job_name, task_index) for barrier partition ``rank``: chief first, then workers, then ps."""
    if rank < num_workers:
        return ("chief" if rank == 0 else "worker"), rank
    return "ps", rank - num_workers


def build_cluster(addresses: list[str], num_workers: int, num_ps: int) -> dict[str, list[str]]:
    """TF cluster spec for the ordered task addresses.

    Without ps tasks every task is a ``worker`` (worker 0 acts as chief), the layout
    MultiWorkerMirroredStrategy expects. With ps tasks the chief gets its own job.
    """
    if num_ps == 0:
        return {"worker": list(addresses)}
    return {
        "chief": [addresses[0]],
        "worker": list(addresses[1:num_workers]),
        "ps": list(addresses[num_workers:]),
    }


def tf_config_for(cluster: dict, job_name: str, task_index: int, num_ps: int) -> dict:
    if num_ps == 0:
        task = {"type": "worker", "index": task_index}
    elif job_name == "worker":
        task = {"type": "worker", "index": task_index - 1}
    else:
        task = {"type": job_name, "index": task_index if job_name == "ps" else 0}
    return {"cluster": cluster, "task": task}


def assigned_gpus(resources: dict, use_gpu: bool | None) -> tuple[str, ...]:
    """GPU addresses Spark gave this task (``spark.task.resource.gpu.amount``), honouring ``use_gpu``."""
    info = resources.get("gpu")
    gpus = tuple(info.addresses) if info is not None else ()
    if use_gpu and not gpus:
        raise RuntimeError(
            "use_gpu=True but Spark assigned this task no GPU; set spark.task.resource.gpu.amount "
            "(and spark.executor.resource.gpu.amount with a discovery script), or pass use_gpu=False"
        )
    return gpus if use_gpu is not False else ()


def child_env(base: dict, spec: TaskSpec, gpus: tuple) -> dict:
    """The train_fn process environment; TF_CONFIG is added by the child once the cluster is known."""
    env = dict(base)
    # With no GPU assigned the process sees none, even on a GPU host: Spark did not give it one.
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    if spec.legacy_keras:
        # Keras 3 model.fit fails under MultiWorkerMirroredStrategy; tf-keras works (see README).
        env.setdefault("TF_USE_LEGACY_KERAS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.pop("TF_CONFIG", None)
    env["PYTHONUNBUFFERED"] = "1"
    env["TFNB_RUN_ID"] = spec.run_id
    env["TFNB_ATTEMPT"] = str(spec.attempt)
    env[ENV_PREIMPORT] = ",".join(spec.preimport)
    env.update(dict(spec.env))
    return env


# How the train_fn process starts: the standard library alone until tfnb._child is imported, so that a
# failing import reaches the driver from error.json like any other error (with -m it was an exit code 1).
_CHILD_MAIN = f"""import sys
try:
    import tfnb._child as child
except BaseException as e:
    import json, traceback
    with open(sys.argv[1] + "/{ERROR}", "w") as f:
        json.dump({{"exc_type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc(),
                   "module": getattr(e, "name", None), "python": sys.executable,
                   "python_version": sys.version.split()[0], "boot": True}}, f)
    raise
child.main(sys.argv[1:])
"""


def reserve_port() -> socket.socket:
    """A socket bound to a free port on all interfaces, held until the child is about to start TF."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    sock.set_inheritable(True)
    return sock


def _spark_local_dir() -> str | None:
    # Spark deletes its local dirs when the application ends: nothing is left behind even if a
    # task is killed before its cleanup runs.
    dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    first = dirs.split(",")[0] if dirs else ""
    return first if first and os.path.isdir(first) else None


# ---------------------------------------------------------------- supervision


class _Supervisor:
    """Runs the child process, forwards its output and events, and stops it on request."""

    def __init__(self, spec: TaskSpec, chan, workdir: str):
        self.spec = spec
        self.chan = chan
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.stop_requested = threading.Event()
        self._threads: list[threading.Thread] = []
        self._settled = threading.Event()  # the child exited, or train_fn returned and it lingers
        self.released = threading.Event()  # the driver's "end" (every train_fn returned) or a stop
        self.feed = None  # the FeedStream that hears the driver's row counts (tfnb.run(data=df))
        self.tasks: list | None = None  # every task's address and rows, from the driver
        self.gathered = threading.Event()  # set with tasks, or by a stop
        self._code: int | None = None
        self._waiter: threading.Thread | None = None

    # messages from the driver
    def on_driver(self, msg: dict) -> None:
        if msg.get("kind") == "stop":
            self.stop()
        elif msg.get("kind") == "end":
            self.released.set()
        elif msg.get("kind") == "cluster":
            self.tasks = msg.get("tasks")
            self.gathered.set()
        elif msg.get("kind") == "feed" and self.feed is not None:
            self.feed.heard(msg)
        elif msg.get("kind") == "dump":
            # off the channel's reader thread: a stop may follow while the dump is being written
            threading.Thread(target=self.send_stacks, name="tfnb-dump", daemon=True).start()

    def send_stacks(self) -> None:
        """Send the driver the Python stack of every thread of the train_fn process (stall watchdog)."""
        p, path = self.proc, os.path.join(self.workdir, STACKS)
        before = os.path.getsize(path) if os.path.exists(path) else 0
        try:
            os.kill(p.pid, DUMP_SIGNAL)
            os.kill(p.pid, signal.SIGCONT)  # a stopped process handles the signal only once continued
        except (AttributeError, ProcessLookupError):
            self.chan.send("stack", text="(the train_fn process is not running)")
            return
        # faulthandler writes from its signal handler without buffering: done once the file stops growing
        size, end = before, time.monotonic() + 3.0
        while time.monotonic() < end:
            time.sleep(0.1)
            now = os.path.getsize(path) if os.path.exists(path) else 0
            if before < now == size:
                break
            size = now
        try:
            with open(path, errors="replace") as f:
                f.seek(before)
                text = f.read()
        except OSError:
            text = ""
        self.chan.send("stack", text=text[-_MAX_STACK:] or "(the train_fn process did not answer)")

    def on_driver_lost(self) -> None:
        # The notebook went away: nobody will read the result, so don't train on.
        self.stop()

    def stop(self) -> None:
        self.stop_requested.set()
        self.released.set()
        self.gathered.set()
        if self.feed is not None:
            self.feed.abort()
        self._signal(signal.SIGTERM)
        t = threading.Timer(self.spec.stop_grace, self._signal, args=(signal.SIGKILL,))
        t.daemon = True
        t.start()

    def _signal(self, sig: int) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _pump_lines(self, stream, handle) -> None:
        lines = _Lines(handle)
        fd = stream.fileno()
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            lines.feed(chunk)
        lines.end()
        stream.close()

    def _pump(self, stream, handle) -> None:
        t = threading.Thread(target=self._pump_lines, args=(stream, handle), daemon=True)
        t.start()
        self._threads.append(t)

    def _claim_standby(self, env: dict, gpus: tuple, held: socket.socket):
        """A warm standby that matches this run, now running as this task's child; None to start one."""
        if not self.spec.warm or self.spec.keep_port:
            return None
        from . import _warm

        cwd = os.getcwd() if self.spec.task_cwd else self.workdir
        try:
            for conn in _warm.claim(_warm.key(self.spec.preimport, self.spec.legacy_keras, self.spec.env, gpus)):
                try:
                    return _warm.Claimed(conn, self.workdir, cwd, env, held.fileno())
                except OSError:
                    conn.close()  # another task of this host took that standby first
        except OSError:
            pass
        return None  # none to take, or whatever went wrong: a fresh process does the same job

    def start(self, mode: str, gpus: tuple, held: socket.socket) -> None:
        """Start the child now; it imports TensorFlow while the tasks exchange addresses."""
        import cloudpickle

        fn, args = cloudpickle.loads(self.spec.payload) if mode == "train" else (None, ())
        with open(os.path.join(self.workdir, PAYLOAD), "wb") as f:
            cloudpickle.dump({"fn": fn, "args": args, "mode": mode, "linger": self.spec.linger and mode == "train"}, f)
        env = child_env(os.environ, self.spec, gpus)
        claimed = self._claim_standby(env, gpus, held) if mode == "train" else None
        if claimed is not None:
            self.proc = claimed
            held.close()
            self._start_pumps(env, claimed.events)
            return
        ev_read, ev_write = os.pipe()
        env[events.ENV_FD] = str(ev_write)
        env[ENV_HELD_PORT_FD] = str(held.fileno())
        pass_fds = (ev_write, held.fileno())
        kept = None
        if self.spec.keep_port:
            kept = os.dup(held.fileno())
            env[ENV_KEPT_PORT_FD] = str(kept)
            pass_fds += (kept,)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD_MAIN, self.workdir],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, pass_fds=pass_fds, start_new_session=True,
                cwd=os.getcwd() if self.spec.task_cwd else self.workdir,
            )
        finally:
            if kept is not None:
                os.close(kept)
        os.close(ev_write)
        held.close()
        self._start_pumps(env, ev_read)

    def _start_pumps(self, env: dict, ev_read: int) -> None:
        level = env.get("TF_CPP_MIN_LOG_LEVEL", "")

        def forward(stream):
            def send(line, partial=False):
                if partial:  # a progress bar's latest state: replaces the one still waiting to be sent
                    self.chan.post("log", merge=stream, stream=stream, line=line, partial=True)
                elif not is_startup_noise(line, level):
                    self.chan.post_line(stream, line)
            return send

        self._pump(self.proc.stdout, forward("stdout"))
        self._pump(self.proc.stderr, forward("stderr"))
        self._pump(os.fdopen(ev_read, "rb"), self._forward_event)
        if self.stop_requested.is_set():
            self.stop()

    def release(self, ctx: WorkerContext, mode: str) -> None:
        """Hand the child its context and let it run train_fn."""
        import cloudpickle

        path = os.path.join(self.workdir, CONTEXT)
        with open(path + ".part", "wb") as f:
            cloudpickle.dump(ctx, f)
        os.replace(path + ".part", path)
        try:
            self.proc.stdin.write(GO)
            self.proc.stdin.flush()
        except OSError:
            pass  # the child is already gone; wait() reports how it ended
        self.chan.send("state", state="training" if mode == "train" else "serving", pid=self.proc.pid)

    def _forward_event(self, line: str) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            return
        kind = msg.pop("kind", events.PROGRESS)
        if kind == FINISHED:
            self._settled.set()
            return
        # progress: only the latest values matter, merged while a batch gathers; an epoch's end is kept
        merge = "progress" if kind == events.PROGRESS and not msg.get("epoch_end") else None
        self.chan.post("event", merge=merge, event=kind, data=msg)

    def wait(self) -> int | None:
        """The child's exit code; None when train_fn returned and the child lingers until :meth:`end`."""
        assert self.proc is not None
        self._waiter = threading.Thread(target=self._await_exit, name="tfnb-child-wait", daemon=True)
        self._waiter.start()
        self._settled.wait()
        return None if self._code is None else self._ended()

    def end(self) -> int:
        """Let a lingering child exit; its exit code."""
        try:
            self.proc.stdin.write(END)
            self.proc.stdin.flush()
        except OSError:
            pass  # already gone: its exit code says how
        self._waiter.join()
        return self._ended()

    def _await_exit(self) -> None:
        self._code = self.proc.wait()
        self._settled.set()

    def _ended(self) -> int:
        # Take down anything the child left in its group, so the pipes close and no process outlives us.
        self._signal_group_anyway()
        for t in self._threads:
            t.join(timeout=5)
        return self._code

    def _signal_group_anyway(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._signal(signal.SIGKILL)
            self.proc.wait()
        if self.proc is not None:
            self._signal_group_anyway()
            if self.proc.stdin:
                self.proc.stdin.close()
            close = getattr(self.proc, "conn", None)
            if close is not None:
                close.close()


def _failure_from_child(workdir: str, code: int | None) -> dict:
    path = os.path.join(workdir, ERROR)
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    from ._warm import UNKNOWN_EXIT

    if code == UNKNOWN_EXIT:
        return {"exc_type": "ProcessDied", "message": "the train_fn process died without an exit status "
                "(killed by a signal, a crash in native code, or out of memory)", "traceback": "", "exit_code": None}
    if code is None:
        return {"exc_type": "ProcessDied", "message": "the train_fn process exited with code 0 before train_fn "
                "returned (os._exit or sys.exit from another thread)", "traceback": "", "exit_code": 0}
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return {"exc_type": "ProcessDied", "message": f"the train_fn process was killed by {name}",
                "traceback": "", "exit_code": code}
    return {"exc_type": "ProcessDied", "message": f"the train_fn process exited with code {code} "
            "without raising an exception (os._exit, a crash in native code, or out of memory)",
            "traceback": "", "exit_code": code}


BOOT_MARK = "tfnb-boot"  # <tfnb-boot>{json}</tfnb-boot>: why a task could not start, in Spark's job error


def task_entry(spec_blob: bytes, version: str):
    """The run's ``mapInArrow`` function: ``run_task`` behind a bootstrap that Spark can always unpickle.

    The closure holds plain values and imports what it needs itself, so cloudpickle ships it by value:
    an executor whose Python lacks tfnb (or has another version) still runs it, and it fails with one
    line the driver finds in the job's error (tfnb.cluster reads it) instead of a ModuleNotFoundError
    inside Spark's unpickling. ``spec_blob`` is the pickled TaskSpec; ``version`` the driver's tfnb version.
    """
    def tfnb_task(batches):
        info = None
        try:
            import tfnb

            if tfnb.__version__ != version:
                info = {"version": tfnb.__version__}
            else:
                import pickle

                from tfnb._worker import run_task
                spec = pickle.loads(spec_blob)
        except BaseException as e:  # noqa: BLE001 - whatever stops tfnb loading goes to the driver
            import traceback

            info = {"exc_type": type(e).__name__, "message": str(e)[:1000], "module": getattr(e, "name", None),
                    "traceback": "".join(traceback.format_exc().splitlines(True)[-12:])}
        if info is not None:
            import json
            import socket
            import sys

            try:
                from pyspark import BarrierTaskContext

                bctx = BarrierTaskContext.get()
                host = bctx.getTaskInfos()[bctx.partitionId()].address.rsplit(":", 1)[0]
            except Exception:  # noqa: BLE001 - the hostname says as much
                host = socket.gethostname()
            info.update(host=host, python=sys.executable, python_version=sys.version.split()[0])
            raise RuntimeError(f"<{BOOT_MARK}>{json.dumps(info)}</{BOOT_MARK}>")  # a str: pickled by value
        yield from run_task(spec, batches)

    return tfnb_task


def run_task(spec: TaskSpec, batches: Iterator) -> Iterator:
    """The barrier task body (``mapInArrow`` function): one TensorFlow task of the cluster."""
    import pyarrow as pa
    from pyspark import BarrierTaskContext

    from ._channel import TaskChannel, batch_window

    bctx = BarrierTaskContext.get()
    rank = bctx.partitionId()
    job_name, task_index = assign_role(rank, spec.num_workers, spec.num_ps)
    infos = bctx.getTaskInfos()
    host = infos[rank].address.rsplit(":", 1)[0]
    workdir = tempfile.mkdtemp(prefix=f"tfnb-{spec.run_id}-a{spec.attempt}-{rank}-", dir=_spark_local_dir())
    chan = None
    sup = None
    held = None
    warm_after = None  # (gpus, tasks of this run on this host) once train_fn succeeded
    try:
        peer = {"job_name": job_name, "task_index": task_index, "rank": rank, "host": host}
        holder: dict = {}
        chan = TaskChannel(
            spec.channel, spec.token, peer, window=batch_window(spec.num_workers + spec.num_ps),
            on_message=lambda m: holder["sup"].on_driver(m) if "sup" in holder else None,
            on_lost=lambda: holder["sup"].on_driver_lost() if "sup" in holder else None,
        )
        sup = holder["sup"] = _Supervisor(spec, chan, workdir)
        chan.send("state", state="starting", pid=os.getpid())
        gpus = assigned_gpus(bctx.resources(), spec.use_gpu)
        mode = "serve" if spec.num_ps > 0 and job_name != "chief" else "train"
        held = reserve_port()
        port = held.getsockname()[1]
        sup.start(mode, gpus, held)
        held = None
        fed = stream = feed_info = None
        if spec.feeder is not None:
            fed = spec.feeder.spill(batches, workdir)  # tfnb.compat: the whole partition before train_fn
        elif spec.feed is None:
            for _ in batches:
                pass
        # Every task's address through the driver, which answers once all of them reported: Spark's
        # allGather answers at its next one-second poll, a second of every launch and rerun.
        chan.send("addr", addr=f"{host}:{port}", rows=fed.rows if fed is not None else 0)
        sup.gathered.wait()
        if sup.tasks is None:  # stopped first
            chan.send("state", state="stopped")
            return
        gathered = sup.tasks
        cluster = build_cluster([g["addr"] for g in gathered], spec.num_workers, spec.num_ps)
        if spec.feeder is not None:
            feed_info = spec.feeder.finish(fed, [g["rows"] for g in gathered])
        elif spec.feed is not None:
            from .feeding import FeedStream

            # Streamed: train_fn starts now and reads the partition while this task receives it.
            stream = sup.feed = FeedStream(spec.feed, workdir, spec.num_workers)
            if sup.stop_requested.is_set():
                stream.abort()
            feed_info = stream.info
        ctx = WorkerContext(
            task_index=task_index, num_workers=spec.num_workers, num_ps=spec.num_ps, job_name=job_name,
            cluster_spec=cluster, tf_config=tf_config_for(cluster, job_name, task_index, spec.num_ps),
            gpus=gpus, model_dir=spec.model_dir, log_dir=spec.log_dir, attempt=spec.attempt,
            max_attempts=spec.max_attempts, run_id=spec.run_id, host=host, local_dir=workdir, feed=feed_info,
            profile_steps=spec.profile_steps, profile_run=spec.profile_run,
        )
        sup.release(ctx, mode)
        if stream is not None:
            stream.pump(batches, lambda rows, done: chan.send_apart("feed", rows=rows, done=done))
        code = sup.wait()
        done_sent = code is None
        if code is None:  # train_fn returned; its TensorFlow server stays up for the peers' last collectives
            chan.send("state", state="done")
            sup.released.wait()  # the driver says "end" once every task is done, "stop" if one failed
            code = sup.end()
        if sup.stop_requested.is_set() and code != 0:
            chan.send("state", state="stopped")
            return
        if code == 0 and mode == "train" and not os.path.exists(os.path.join(workdir, RESULT)):
            code = None  # os._exit(0) before train_fn returned: a death, not a success
        if code != 0:
            failure = _failure_from_child(workdir, code)
            if chan.send("failed", failure=failure):
                # The driver has the details and stops the other tasks; ending quietly spares the
                # executor log a second, longer copy of the same traceback.
                return
            raise TaskFailed(f"{job_name} {task_index}: {failure['exc_type']}: {failure['message']}")
        if not done_sent:
            chan.send("state", state="done")
        if mode == "train":
            warm_after = (gpus, sum(g["addr"].rsplit(":", 1)[0] == host for g in gathered))
        if rank == 0 or spec.all_results:
            with open(os.path.join(workdir, RESULT), "rb") as f:
                data = f.read()
            yield pa.RecordBatch.from_pydict(
                {"rank": [rank], "result": [data]},
                schema=pa.schema([("rank", pa.int32()), ("result", pa.binary())]),
            )
    except TaskFailed:
        raise
    except BaseException as e:
        if chan is not None:
            import traceback

            chan.send("failed", failure={"exc_type": type(e).__name__, "message": str(e),
                                         "traceback": traceback.format_exc()})
        raise
    finally:
        if sup is not None:
            sup.kill()
        if held is not None:
            held.close()
        if chan is not None:
            chan.close()
        shutil.rmtree(workdir, ignore_errors=True)
        if spec.warm and warm_after is not None:
            _leave_standby(spec, *warm_after)


def _leave_standby(spec: TaskSpec, gpus: tuple, local_tasks: int) -> None:
    """Keep one TensorFlow-imported process per task of this run on this host for the next run."""
    from . import _warm

    try:
        want = _warm.key(spec.preimport, spec.legacy_keras, spec.env, gpus)
        if _warm.count(want) < local_tasks:
            _warm.spawn(want, child_env(os.environ, spec, gpus), spec.warm_idle)
    except OSError:
        pass  # no standby: the next run starts its processes as usual
