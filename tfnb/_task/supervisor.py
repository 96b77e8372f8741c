"""The task's supervisor of its train_fn process (fresh, or forked by a warm standby): forwards its output and
events, answers the driver's requests (stop, stacks, the cluster's addresses), reads its outcome."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import cloudpickle

from .. import _protocol as events
from .._protocol import (CONTEXT, DUMP_SIGNAL, END, ENV_HELD_PORT_FD, ENV_KEPT_PORT_FD, ERROR, FINISHED, GO, PAYLOAD,
                         STACKS, Msg)
from ..storage import atomic_write
from .context import WorkerContext
from .resize import RESIZE
from .setup import ENV_SUPERVISOR, TaskSpec, child_env
from .warm import alive

_MAX_STACK = 64 << 10  # characters of a stack dump sent to the driver
_MAX_LINE = 64 << 10    # characters of one output line sent; longer ones are cut with a marker
_PARTIAL_EVERY = 1.0    # seconds between two updates of a carriage-return line (a progress bar)
_LINE_END = re.compile(rb"[\r\n]")
# What TensorFlow's C++ logging prints before it reads TF_CPP_MIN_LOG_LEVEL, never actionable: dropped unless it is 0
_TF_STARTUP_NOISE = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    r"|^[IWE]\d{4} [\d:.]+\s+\d+ (port\.cc|cudart_stub\.cc|cpu_feature_guard\.cc|cuda_platform\.cc|"
    r"cuda_executor\.cc|cuda_dnn\.cc|cuda_fft\.cc|cuda_blas\.cc)(:\d+)?\] "
    r"|^To enable the following instructions: .* in other operations, rebuild TensorFlow")


class _Lines:
    """Splits output into lines for ``emit(line, partial=False)``: a progress bar's carriage-return states go as
    ``partial`` at most every _PARTIAL_EVERY seconds, its state at the newline as the line; backspaces are dropped."""

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
            self._send(self._buf, False)
            self._buf = b""

    def end(self) -> None:
        if self._buf.strip(b"\x08") or self._latest is not None:
            self.feed(b"\n")

    def _send(self, seg: bytes, partial: bool) -> None:
        line = seg.replace(b"\x08", b"").decode("utf-8", "replace")
        if len(line) > _MAX_LINE:
            line = f"{line[:_MAX_LINE]} … [{len(line) - _MAX_LINE} more characters cut]"
        self._emit(*(line, True) if partial else (line,))  # the events pipe's handler takes the line alone


# the standard library alone until tfnb._task.child imports: a failing import reaches the driver from error.json
_CHILD_MAIN = f"""import sys
try:
    import tfnb._task.child as child
except BaseException as e:
    import json, traceback
    with open(sys.argv[1] + "/{ERROR}", "w") as f:
        json.dump({{"exc_type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc(),
                   "module": getattr(e, "name", None), "python": sys.executable,
                   "python_version": sys.version.split()[0], "boot": True}}, f)
    raise
child.run(sys.argv[1], 0, fresh=True)
"""
UNKNOWN_EXIT = -1000  # a claimed standby's process died without saying how (a signal or a crash in native code)


class TrainFnProcess:
    """The train_fn process, as the part of ``subprocess.Popen`` the supervisor uses: forked by the warm standby at
    the other end of ``conn``, else (or when that standby ends before it forks) started fresh. Nothing is written to
    ``stdin`` before :attr:`pid` is read, so a fresh process' stdin replaces the connection's with nothing lost."""

    def __init__(self, conn: socket.socket | None, workdir: str, cwd: str, env: dict, held_fd: int,
                 keep_port: bool = False):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.events, ev_w = os.pipe()
        if conn is not None:
            body = json.dumps({"workdir": workdir, "cwd": cwd, "env": env}).encode() + b"\n"
            try:
                socket.send_fds(conn, [body], [out_w, err_w, ev_w, held_fd])
            except BaseException:
                for fd in (out_r, out_w, err_r, err_w, self.events, ev_w):
                    os.close(fd)
                raise
        self._spare = [out_w, err_w, ev_w, os.dup(held_fd)]  # the process' ends: closed here once it has its own
        self._fresh_args = (workdir, cwd, env, keep_port)
        self._fresh: subprocess.Popen | None = None
        self._lock, self._waiting = threading.Lock(), threading.Lock()
        self.conn = conn
        self.stdin = conn.makefile("rwb") if conn is not None else None  # go, end; from a standby: pid, exit code
        self.stdout, self.stderr = os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb")
        self.returncode: int | None = None
        self._pid: int | None = None
        if conn is None:
            self.pid  # noqa: B018 - starts it

    @property
    def pid(self) -> int:
        """The pid a standby sends once it forked, else a fresh process' (ProcessLookupError if none can start)."""
        with self._lock:
            if self._pid is None:
                try:
                    forked = int(self.stdin.readline()) if self.conn is not None else None
                except (OSError, ValueError):
                    forked = None
                try:
                    self._pid = forked or self._start_fresh()
                finally:
                    for fd in self._spare:
                        os.close(fd)
                    self._spare = []
            return self._pid

    def _start_fresh(self) -> int:
        out_w, err_w, ev_w, held = self._spare
        workdir, cwd, env, keep_port = self._fresh_args
        env = dict(env, **{events.ENV_FD: str(ev_w), ENV_HELD_PORT_FD: str(held)})
        pass_fds = (ev_w, held)
        if self.conn is None:  # the thread starting it lives as long as the task (tfnb._task.child)
            env[ENV_SUPERVISOR] = str(os.getpid())
        if keep_port:
            self._spare.append(os.dup(held))
            env[ENV_KEPT_PORT_FD] = str(self._spare[-1])
            pass_fds += (self._spare[-1],)
        try:
            self._fresh = subprocess.Popen(
                [sys.executable, "-c", _CHILD_MAIN, workdir], stdin=subprocess.PIPE, stdout=out_w, stderr=err_w,
                env=env, pass_fds=pass_fds, start_new_session=True, cwd=cwd)
        except OSError:
            if self.conn is None:
                raise
            self.returncode = UNKNOWN_EXIT
            raise ProcessLookupError("the warm standby ended before it forked this task's process, and no fresh "
                                     "process could start") from None
        self.close()
        self.stdin = self._fresh.stdin
        return self._fresh.pid

    def wait(self) -> int:
        """The exit code, or UNKNOWN_EXIT when a standby's process died without sending one."""
        with self._waiting:  # one reader of the connection at a time
            if self.returncode is None:
                try:
                    self.pid  # noqa: B018 - its line comes first
                    self.returncode = self._fresh.wait() if self._fresh is not None else int(self.stdin.readline())
                except (OSError, ValueError):
                    self.returncode = UNKNOWN_EXIT
                # a standby's process is not our child (the standby reaps it): make "ended" mean ended
                end = time.monotonic() + 2.0
                while self._fresh is None and self._pid and alive(self._pid) and time.monotonic() < end:
                    time.sleep(0.02)
        return self.returncode

    def close(self) -> None:  # a standby's process ends with its connection
        for f in (self.stdin, self.conn):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


class _Supervisor:
    """Runs the train_fn process, forwards its output and events, and stops it on request."""

    def __init__(self, spec: TaskSpec, workdir: str):
        self.spec, self.workdir = spec, workdir
        self.chan = None  # the TaskChannel, set once connected
        self.proc: TrainFnProcess | None = None
        self.stop_requested = threading.Event()
        self._threads: list[threading.Thread] = []
        self._settled = threading.Event()  # the child exited, or train_fn returned and it lingers
        self.released = threading.Event()  # the driver's "end" (every train_fn returned) or a stop
        self.feed = None  # the FeedStream that hears the driver's row counts (tfnb.run(data=df))
        self.cluster: dict = {}  # the driver's CLUSTER: every task's address and rows, maybe every worker's count
        self.gathered = threading.Event()  # set with tasks, or by a stop
        self._waiter: threading.Thread | None = None
        self._progressed = False  # a progress report was sent

    def on_driver(self, msg: dict) -> None:
        kind = msg.get("kind")
        if kind == Msg.RESIZE or kind == Msg.CLUSTER and msg.get("resize"):  # a CLUSTER's: before this task connected
            with contextlib.suppress(OSError):
                open(os.path.join(self.workdir, RESIZE), "w").close()
        if kind == Msg.STOP:
            self.stop()
        elif kind == Msg.END:
            self.released.set()
        elif kind == Msg.CLUSTER:
            self.cluster = msg
            self.gathered.set()
        elif kind == Msg.FEED and self.feed is not None:
            self.feed.heard(msg)
        elif kind == Msg.DUMP:
            # off the reader thread: a stop may follow while the dump is written
            threading.Thread(target=self.send_stacks, name="tfnb-dump", daemon=True).start()

    def send_stacks(self) -> None:
        """Send the driver every thread's stack of the train_fn process (stall watchdog)."""
        try:
            with open(os.path.join(self.workdir, STACKS), "a+", errors="replace") as f:
                before = size = f.seek(0, os.SEEK_END)
                os.kill(self.proc.pid, DUMP_SIGNAL)
                os.kill(self.proc.pid, signal.SIGCONT)  # a stopped process handles the signal only once continued
                # faulthandler writes from its signal handler without buffering: done once the file stops growing
                end = time.monotonic() + 3.0
                while time.monotonic() < end:
                    time.sleep(0.1)
                    if before < (now := os.fstat(f.fileno()).st_size) == size:
                        break
                    size = now
                f.seek(before)
                text = f.read()
        except (AttributeError, ProcessLookupError):
            text = "(the train_fn process is not running)"
        except OSError:
            text = ""
        self.chan.send(Msg.STACK, text=text[-_MAX_STACK:] or "(the train_fn process did not answer)")

    def stop(self) -> None:
        self.stop_requested.set()
        self.released.set()
        self.gathered.set()
        if self.feed is not None:
            self.feed.abort()
        self._signal(signal.SIGTERM)
        # a stopped process (SIGSTOP) holds SIGTERM until continued, and Spark may kill us before the SIGKILL
        self._signal(signal.SIGCONT)
        t = threading.Timer(5.0, self._signal, args=(signal.SIGKILL,))  # 5 s to end cleanly
        t.daemon = True
        t.start()

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.returncode is None:  # not reaped yet: its pid is still its own
            self._kill_group(sig)

    @staticmethod
    def _pump(stream, handle) -> None:
        lines = _Lines(handle)
        while chunk := os.read(stream.fileno(), 1 << 16):
            lines.feed(chunk)
        lines.end()
        stream.close()

    def _claim_standby(self, env: dict, gpus: tuple, held: socket.socket, cwd: str):  # None: start a fresh one
        if not self.spec.warm or self.spec.hooks.keep_port:
            return None
        from . import warm as _warm

        want = _warm.key(self.spec.preimport, self.spec.legacy_keras, self.spec.env, gpus)
        try:
            _warm.ensure(want, env, self.spec.warm_idle)  # the first run on this executor starts the standby
            for conn in _warm.claim(want):
                try:
                    return TrainFnProcess(conn, self.workdir, cwd, env, held.fileno())
                except OSError:
                    conn.close()  # another task of this host took that standby first
        except _warm.Unavailable as e:  # the run goes on in fresh processes: say why and the fix
            self.chan.post_line("stderr", f"tfnb: no warm standby on this executor, train_fn starts fresh: {e}")
        except OSError:
            pass
        return None  # none to take, or whatever went wrong: a fresh process does the same job

    def start(self, mode: str, gpus: tuple, held: socket.socket) -> None:
        """Start the child now; it imports TensorFlow while the tasks exchange addresses."""
        from .child import serve_forever

        fn, args, kwargs = cloudpickle.loads(self.spec.payload) if mode == "train" else (serve_forever, (), {})
        atomic_write(os.path.join(self.workdir, PAYLOAD), cloudpickle.dumps(
            {"fn": fn, "args": args, "kwargs": kwargs, "linger": self.spec.linger and mode == "train"}))
        env = child_env(os.environ, self.spec, gpus)
        cwd = os.getcwd() if self.spec.hooks.task_cwd else self.workdir
        claimed = self._claim_standby(env, gpus, held, cwd) if mode == "train" else None
        self.proc = claimed or TrainFnProcess(None, self.workdir, cwd, env, held.fileno(),
                                              keep_port=self.spec.hooks.keep_port)
        held.close()
        noise = _TF_STARTUP_NOISE if env.get("TF_CPP_MIN_LOG_LEVEL", "") not in ("", "0") else None

        def forward(stream):
            def send(line, partial=False):
                if partial:  # a progress bar's latest state: replaces the one still waiting to be sent
                    self.chan.post(Msg.LOG, merge=stream, stream=stream, line=line, partial=True)
                elif not (noise and noise.match(line)):
                    self.chan.post_line(stream, line)
            return send

        for pair in ((self.proc.stdout, forward("stdout")), (self.proc.stderr, forward("stderr")),
                     (os.fdopen(self.proc.events, "rb"), self._forward_event)):
            self._threads.append(threading.Thread(target=self._pump, args=pair, daemon=True))
            self._threads[-1].start()
        if self.stop_requested.is_set():
            self.stop()

    def release(self, ctx: WorkerContext, mode: str) -> None:
        atomic_write(os.path.join(self.workdir, CONTEXT), cloudpickle.dumps(ctx))
        try:  # before go: a claim's pid closes its spare copy of the held port, which TF binds after go
            pid = self.proc.pid
        except ProcessLookupError:
            pid = None  # the standby ended before it forked: wait() reports it
        self._tell(GO)
        self.chan.send(Msg.STATE, state="training" if mode == "train" else "serving", pid=pid)

    def _forward_event(self, line: str) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            return
        kind = msg.pop("kind", events.PROGRESS)
        if kind == FINISHED:
            self._settled.set()
            return
        # progress merges while a batch gathers; an epoch's end and the first report (a resumed epoch) are kept
        if kind == events.PROGRESS and not self._progressed:
            self._progressed = True
            self.chan.send(Msg.EVENT, event=kind, data=msg, first=True)  # in order, and never merged away
            return
        merge = "progress" if kind == events.PROGRESS and not msg.get("epoch_end") else None
        self.chan.post(Msg.EVENT, merge=merge, event=kind, data=msg)

    def wait(self) -> int | None:
        """The child's exit code; None when train_fn returned and the child lingers until :meth:`end`."""
        self._waiter = threading.Thread(target=self._await_exit, name="tfnb-child-wait", daemon=True)
        self._waiter.start()
        self._settled.wait()
        return None if self.proc.returncode is None else self._ended()

    def end(self) -> int:  # a lingering child's exit code
        self._tell(END)
        self._waiter.join()
        return self._ended()

    def _tell(self, word: bytes) -> None:
        with contextlib.suppress(OSError):  # the child is already gone; wait() reports how it ended
            self.proc.stdin.write(word)
            self.proc.stdin.flush()

    def _await_exit(self) -> None:
        self.proc.wait()
        self._settled.set()

    def _ended(self) -> int:
        self._kill_group()  # what the child left in its group: the pipes close, no process outlives us
        for t in self._threads:
            t.join(timeout=5)
        return self.proc.returncode

    def _kill_group(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc is not None:
            self._kill_group()
            self.proc.wait()
            self.proc.close()


def _failure_from_child(workdir: str, code: int | None, mode: str) -> dict:
    """How the child ended, as the failure the driver gets."""
    what = "TensorFlow server process" if mode == "serve" else "train_fn process"
    path = os.path.join(workdir, ERROR)
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    if code == UNKNOWN_EXIT:
        code, how = None, "died without an exit status (killed by a signal, a crash in native code, or out of memory)"
    elif code is None:
        code, how = 0, "exited with code 0 before train_fn returned (os._exit or sys.exit from another thread)"
    elif code < 0:
        how = f"was killed by {signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else -code}"
    else:
        how = (f"exited with code {code} without raising an exception (os._exit, a crash in native code, or out "
               "of memory)")
    return {"exc_type": "ProcessDied", "message": f"the {what} {how}", "traceback": "", "exit_code": code}
