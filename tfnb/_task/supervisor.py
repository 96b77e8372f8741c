"""The task's supervisor of its train_fn process (:class:`TrainFnProcess`: fresh, or forked by a warm standby):
forward its output and events, answer the driver's requests (stop, stacks, the cluster's addresses), read its
outcome."""
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

from .. import _protocol as events
from .._protocol import (CONTEXT, DUMP_SIGNAL, END, ENV_HELD_PORT_FD, ENV_KEPT_PORT_FD, ERROR, FINISHED, GO, PAYLOAD,
                         STACKS, Msg)
from ..storage import atomic_write
from .context import WorkerContext
from .resize import RESIZE
from .setup import ENV_SUPERVISOR, TaskSpec, child_env, is_startup_noise
from .warm import alive

_MAX_STACK = 64 << 10  # characters of a stack dump sent to the driver
_MAX_LINE = 64 << 10    # characters of one output line sent; longer ones are cut with a marker
_PARTIAL_EVERY = 1.0    # seconds between two updates of a carriage-return line (a progress bar)
_LINE_END = re.compile(rb"[\r\n]")


class _Lines:
    """Splits output into lines for ``emit(line, partial=False)``. Carriage-return rewrites (a progress bar) are
    sent as ``partial`` at most every _PARTIAL_EVERY seconds, and the state at the newline as the line; backspaces
    are dropped."""

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
            self._send(self._buf if self._buf.strip(b"\x08") else self._latest, False)
        self._buf, self._latest = b"", None

    def _send(self, seg: bytes, partial: bool) -> None:
        line = seg.replace(b"\x08", b"").decode("utf-8", "replace")
        if len(line) > _MAX_LINE:
            line = f"{line[:_MAX_LINE]} … [{len(line) - _MAX_LINE} more characters cut]"
        self._emit(*(line, True) if partial else (line,))  # the events pipe's handler takes the line alone


# The standard library alone until tfnb._task.child is imported: a failing import reaches the driver from
# error.json like any other error.
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
child.main(sys.argv[1:])
"""


UNKNOWN_EXIT = -1000  # a claimed standby's process died without saying how (a signal or a crash in native code)


def _readline(sock: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


class TrainFnProcess:
    """The train_fn process, as the part of ``subprocess.Popen`` the supervisor uses: forked by the warm standby at
    the other end of ``conn`` (tfnb._task.warm), else started fresh, as when that standby ends before it forks.
    Until then this keeps its ends of the pipes and the held port for a fresh process. Nothing is written to
    ``stdin`` before :attr:`pid` is read (the supervisor reads it before ``go``), so a fresh process' stdin replaces
    the connection's with nothing lost."""

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
        self.stdin = conn.makefile("wb") if conn is not None else None
        self.stdout = os.fdopen(out_r, "rb")
        self.stderr = os.fdopen(err_r, "rb")
        self.returncode: int | None = None
        self._pid: int | None = None
        if conn is None:
            self.pid  # noqa: B018 - starts it

    @property
    def pid(self) -> int:
        """The pid a standby sends once it forked (after its imports), else a fresh process'; ProcessLookupError
        when the standby ended first and no fresh process can start."""
        with self._lock:
            if self._pid is None:
                try:
                    forked = int(_readline(self.conn)) if self.conn is not None else None
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
                    self.returncode = self._fresh.wait() if self._fresh is not None else int(_readline(self.conn))
                except (OSError, ValueError):
                    self.returncode = UNKNOWN_EXIT
                self._reap()
        return self.returncode

    def _reap(self) -> None:
        # A standby's process is not our child (the standby reaps it, then sends its code): make "ended" mean ended.
        for _ in range(100):
            if self._pid is None or self._fresh is not None or not alive(self._pid):
                return
            time.sleep(0.02)

    def close(self) -> None:
        """Close this end of the standby's connection (its process then ends) or the fresh process' stdin."""
        for f in (self.stdin, self.conn):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


class _Supervisor:
    """Runs the child process, forwards its output and events, and stops it on request."""

    def __init__(self, spec: TaskSpec, workdir: str):
        self.spec, self.workdir = spec, workdir
        self.chan = None  # the TaskChannel, set once connected
        self.proc: TrainFnProcess | None = None
        self.stop_requested = threading.Event()
        self._threads: list[threading.Thread] = []
        self._settled = threading.Event()  # the child exited, or train_fn returned and it lingers
        self.released = threading.Event()  # the driver's "end" (every train_fn returned) or a stop
        self.feed = None  # the FeedStream that hears the driver's row counts (tfnb.run(data=df))
        self.tasks: list | None = None  # every task's address and rows, from the driver
        self.counts: list | None = None
        self.gathered = threading.Event()  # set with tasks, or by a stop
        self._waiter: threading.Thread | None = None
        self._progressed = False  # a progress report was sent

    def on_driver(self, msg: dict) -> None:
        kind = msg.get("kind")
        if kind == Msg.STOP:
            self.stop()
        elif kind == Msg.END:
            self.released.set()
        elif kind == Msg.CLUSTER:
            self.tasks = msg.get("tasks")
            self.counts = msg.get("counts")  # every worker's rows, when the driver counted them before launch
            if msg.get("resize"):  # asked before this task connected
                self._ask_resize()
            self.gathered.set()
        elif kind == Msg.FEED and self.feed is not None:
            self.feed.heard(msg)
        elif kind == Msg.RESIZE:
            self._ask_resize()
        elif kind == Msg.DUMP:
            # off the reader thread: a stop may follow while the dump is written
            threading.Thread(target=self.send_stacks, name="tfnb-dump", daemon=True).start()

    def _ask_resize(self) -> None:
        with contextlib.suppress(OSError):
            open(os.path.join(self.workdir, RESIZE), "w").close()

    def send_stacks(self) -> None:
        """Send the driver every thread's stack of the train_fn process (stall watchdog)."""
        p, path = self.proc, os.path.join(self.workdir, STACKS)
        before = os.path.getsize(path) if os.path.exists(path) else 0
        try:
            os.kill(p.pid, DUMP_SIGNAL)
            os.kill(p.pid, signal.SIGCONT)  # a stopped process handles the signal only once continued
        except (AttributeError, ProcessLookupError):
            self.chan.send(Msg.STACK, text="(the train_fn process is not running)")
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
        t = threading.Timer(self.spec.stop_grace, self._signal, args=(signal.SIGKILL,))
        t.daemon = True
        t.start()

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.returncode is None:  # not reaped yet: its pid is still its own
            self._kill_group(sig)

    def _pump(self, stream, handle) -> None:
        def pump():
            lines = _Lines(handle)
            while chunk := os.read(stream.fileno(), 1 << 16):
                lines.feed(chunk)
            lines.end()
            stream.close()

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        self._threads.append(t)

    def _claim_standby(self, env: dict, gpus: tuple, held: socket.socket, cwd: str):
        """A matching warm standby's process, now this task's child; None to start one."""
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
        import cloudpickle

        fn, args, kwargs = cloudpickle.loads(self.spec.payload) if mode == "train" else (None, (), {})
        with open(os.path.join(self.workdir, PAYLOAD), "wb") as f:
            cloudpickle.dump({"fn": fn, "args": args, "kwargs": kwargs, "mode": mode,
                              "linger": self.spec.linger and mode == "train"}, f)
        env = child_env(os.environ, self.spec, gpus)
        cwd = os.getcwd() if self.spec.hooks.task_cwd else self.workdir
        claimed = self._claim_standby(env, gpus, held, cwd) if mode == "train" else None
        self.proc = claimed or TrainFnProcess(None, self.workdir, cwd, env, held.fileno(),
                                              keep_port=self.spec.hooks.keep_port)
        held.close()
        self._start_pumps(env)

    def _start_pumps(self, env: dict) -> None:
        level = env.get("TF_CPP_MIN_LOG_LEVEL", "")

        def forward(stream):
            def send(line, partial=False):
                if partial:  # a progress bar's latest state: replaces the one still waiting to be sent
                    self.chan.post(Msg.LOG, merge=stream, stream=stream, line=line, partial=True)
                elif not is_startup_noise(line, level):
                    self.chan.post_line(stream, line)
            return send

        self._pump(self.proc.stdout, forward("stdout"))
        self._pump(self.proc.stderr, forward("stderr"))
        self._pump(os.fdopen(self.proc.events, "rb"), self._forward_event)
        if self.stop_requested.is_set():
            self.stop()

    def release(self, ctx: WorkerContext, mode: str) -> None:
        """Hand the child its context and let it run train_fn."""
        import cloudpickle

        atomic_write(os.path.join(self.workdir, CONTEXT), cloudpickle.dumps(ctx))
        try:  # before go: a claim's pid closes its spare copy of the held port, which TF binds after go
            pid = self.proc.pid
        except ProcessLookupError:
            pid = None  # the standby ended before it forked: wait() reports it
        with contextlib.suppress(OSError):  # the child is already gone; wait() reports how it ended
            self.proc.stdin.write(GO)
            self.proc.stdin.flush()
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
        # progress merges while a batch gathers; an epoch's end and the first report (a relaunch's resumed
        # epoch) are kept
        if kind == events.PROGRESS and not self._progressed:
            self._progressed = True
            self.chan.send(Msg.EVENT, event=kind, data=msg, first=True)  # in order, and never merged away
            return
        merge = "progress" if kind == events.PROGRESS and not msg.get("epoch_end") else None
        self.chan.post(Msg.EVENT, merge=merge, event=kind, data=msg)

    def wait(self) -> int | None:
        """The child's exit code; None when train_fn returned and the child lingers until :meth:`end`."""
        assert self.proc is not None
        self._waiter = threading.Thread(target=self._await_exit, name="tfnb-child-wait", daemon=True)
        self._waiter.start()
        self._settled.wait()
        return None if self.proc.returncode is None else self._ended()

    def end(self) -> int:
        """Let a lingering child exit; its exit code."""
        with contextlib.suppress(OSError):  # already gone: its exit code says how
            self.proc.stdin.write(END)
            self.proc.stdin.flush()
        self._waiter.join()
        return self._ended()

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


def _failure_from_child(workdir: str, code: int | None, what: str = "train_fn process") -> dict:
    """How the child ended, as the failure the driver gets; ``what`` names it ("TensorFlow server process")."""
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
