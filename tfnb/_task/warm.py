"""Warm standbys: a process that imported the run's ``preimport`` modules (TensorFlow) once and forks a train_fn
process per claim, handed the task's pipes, port and environment over a Unix socket (SCM_RIGHTS). Its settings
must match the run's: CUDA_VISIBLE_DEVICES and the rest are fixed before TensorFlow is imported. A ``preimport``
module that starts threads makes forking unsafe: set ``warm=False``."""
from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from .._private import private_dir, state_dir
from .._protocol import ENV_FD, ENV_HELD_PORT_FD
from ..errors import UnsafePathError

_FOLDER = "warm"
_MAX_MSG = 1 << 20
_MAX_SOCKET_PATH = 107  # bytes of a Unix socket's path (sun_path holds 108 with the closing NUL)
TRAIN_FN = b"tfnb-train_fn"  # what a forked process calls itself (its /proc/PID/comm), keeping the standby's cmdline
_HANGUP = getattr(select, "POLLRDHUP", 0)  # the peer closed (Linux); elsewhere poll's POLLHUP alone says it


class Unavailable(Exception):
    """No standby can serve this executor's tasks (the message says why and the fix): they start fresh."""


def _path(want: str) -> str:
    """The socket of this executor's standby keyed ``want``; Unavailable when no such socket can be made."""
    try:
        folder = private_dir(_FOLDER)
    except UnsafePathError as e:
        raise Unavailable(str(e)) from e
    path = os.path.join(folder, f"{want}-{_owner()}.sock")
    size = len(os.fsencode(path + ".part"))
    if size > _MAX_SOCKET_PATH:
        base = state_dir()
        where = "TFNB_STATE_DIR" if os.environ.get("TFNB_STATE_DIR") else "the temporary folder (TFNB_STATE_DIR unset)"
        raise Unavailable(
            f"{where} {base!r} is too long for the standbys' Unix sockets: {path}.part is {size} bytes, over "
            f"the {_MAX_SOCKET_PATH} a socket's path may hold; set TFNB_STATE_DIR on the executors to a folder "
            f"of at most {len(os.fsencode(base)) - (size - _MAX_SOCKET_PATH)} bytes (e.g. /tmp/tfnb)")
    return path


def key(preimport: tuple, legacy_keras: bool, env: tuple, gpus: tuple) -> str:
    """``<settings>.<GPUs>``: what a standby must share with a run, all fixed before TensorFlow is imported. The GPUs
    are ``none``, short plain addresses joined by ``_`` (a task tells a sibling's standby from a stale one), else a
    hash (``@...``) whose overlap cannot be told (a Unix socket's path holds at most 107 bytes)."""
    fixed = [sys.executable, list(preimport), legacy_keras, [list(kv) for kv in env],
             os.environ.get("TF_CPP_MIN_LOG_LEVEL", ""), os.environ.get("PYTHONPATH", "")]
    tag = "_".join(gpus) or "none"
    if gpus and not all(re.fullmatch(r"[A-Za-z0-9]{1,12}", g) for g in gpus) or len(tag) > 40:
        tag = "@" + hashlib.sha256(json.dumps(list(gpus)).encode()).hexdigest()[:10]
    return hashlib.sha256(json.dumps(fixed).encode()).hexdigest()[:16] + "." + tag


def _stale(want: str, other: str) -> bool:
    """Whether the standby keyed ``other`` is useless once ``want`` runs: other settings, or GPUs overlapping ours
    (dealt anew); a sibling's standby on disjoint GPUs is left alone."""
    mine, theirs = want.split("."), other.split(".")
    if len(theirs) != 2 or mine[0] != theirs[0]:
        return True
    a, b = mine[1], theirs[1]
    if "none" in (a, b):
        return a != b
    if a.startswith("@") or b.startswith("@"):
        return False  # cannot tell: it waits out TFNB_WARM_IDLE
    return bool(set(a.split("_")) & set(b.split("_")))


def _sockets() -> list[str]:
    """Standbys' sockets: the warm ones (``.sock``) first, then those still importing (``.sock.part``)."""
    folder = private_dir(_FOLDER)
    return sorted(glob.glob(os.path.join(folder, "*.sock"))) + sorted(glob.glob(os.path.join(folder, "*.sock.part")))


def _connect(path: str) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(2.0)
        conn.connect(path)
        conn.settimeout(None)
        return conn
    except ConnectionRefusedError:
        Path(path).unlink(missing_ok=True)  # its standby is gone (or was just claimed, and unlinks it itself)
    except OSError:
        pass
    conn.close()
    return None


def claim(want: str) -> Iterator[socket.socket]:
    """Connections to this executor's standbys keyed ``want``, warm ones first; stale ones are told to exit."""
    mine = []
    for path in _sockets():
        name, owner = _name_of(path)
        if name == want:
            if owner == _owner():  # another executor's, on this host, is left to it
                mine.append(path)
        elif _stale(want, name) and (other := _connect(path)):
            other.sendall(b'{"exit": true}\n')
            other.close()
    for path in mine:
        if conn := _connect(path):  # a refused one was taken already
            yield conn


def _owner() -> str:  # this executor: its Python daemon, the parent of the worker a task runs in
    return str(os.getppid())


def _name_of(path: str) -> tuple[str, str]:  # (key, owner) of ``<key>-<owner>.sock[.part]``
    key, _, owner = os.path.basename(path).split(".sock", 1)[0].partition("-")
    return key, owner


def ensure(want: str, env: dict, idle: float, wait: float = 60.0) -> None:
    """Start a standby keyed ``want`` unless one is there, and wait until it listens: as long as it starts (a fresh
    process would start no sooner), at most ``wait`` seconds, or until it exits (another got there first)."""
    _path(want)
    deadline, started = time.monotonic() + wait, None
    while not any(_name_of(p) == (want, _owner()) for p in _sockets()) and time.monotonic() < deadline:
        if started is None:
            started = spawn(want, env, idle)
        elif started.poll() is not None:
            break
        time.sleep(0.02)


def spawn(want: str, env: dict, idle: float) -> subprocess.Popen:
    """Start a standby keyed ``want`` in its own session; of two started at once, one stays."""
    path = _path(want)
    return subprocess.Popen(
        [sys.executable, "-m", "tfnb._task.warm", path, str(idle), _owner()],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=dict(env, PYTHONUNBUFFERED="1"), start_new_session=True, cwd=private_dir(_FOLDER))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _rename(src: str, dst: str) -> None:
    """Move a listening socket's name to ``dst``, or exit when another standby holds it (its tasks fall back to
    fresh processes)."""
    try:
        os.link(src, dst)
    except OSError:
        Path(src).unlink(missing_ok=True)
        os._exit(0)
    Path(src).unlink(missing_ok=True)


def standby(path: str, idle: float, watch_pid: int):
    """Import, then fork a train_fn process per claim (returning ``(connection to the task, workdir)`` in it) and
    send its exit code. Stops taking claims after ``idle`` seconds idle, once ``watch_pid`` (the executor's Python
    daemon: Spark kills idle Python workers after a minute) exits, or when a task of other settings discards it."""
    import signal

    from . import child

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    own = os.path.join(os.path.dirname(path), f"{os.getpid()}.new")
    Path(own).unlink(missing_ok=True)  # a dead process' of this pid
    listener.bind(own)
    os.chmod(own, 0o600)
    listener.listen(16)
    # named only once it listens (a refused connect is taken for a dead standby's, whose name is unlinked), and
    # claimable at once: a task that connects meanwhile waits for the rest of the import only
    _rename(own, path + ".part")  # the name while it imports; exits if one with these settings is starting
    child.prepare()
    child._preimport()
    _rename(path + ".part", path)  # warm: claimed before standbys still importing; exits if one became warm meanwhile
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a child's end wakes the select below
    running: dict[int, socket.socket] = {}  # pid -> its task's connection
    hung: set[int] = set()  # pids whose task hung up: killed, not yet reaped
    deadline, open_, stale = time.monotonic() + idle, True, False
    while open_ or running:
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                with contextlib.suppress(OSError):
                    running[pid].sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                running.pop(pid).close()
                hung.discard(pid)
                deadline = time.monotonic() + idle
        if open_ and (stale or time.monotonic() > deadline and not running or not alive(watch_pid)):
            open_ = False
            Path(path).unlink(missing_ok=True)
            listener.close()
        poller = select.poll()
        poller.register(wake_r, select.POLLIN)
        if open_:
            poller.register(listener, select.POLLIN)
        for pid, conn in running.items():
            if pid not in hung:  # its task's end of the connection: a hang-up, never its data (the process reads it)
                poller.register(conn, _HANGUP)
        ready = dict(poller.poll(1000))
        if wake_r in ready:
            os.read(wake_r, 512)
        for pid, conn in running.items():
            if pid not in hung and ready.get(conn.fileno(), 0) & (_HANGUP | select.POLLHUP):
                # the task is gone while its process runs: a stopped process (SIGSTOP) ends by SIGKILL only
                hung.add(pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        if not open_ or not ready.get(listener.fileno(), 0) & select.POLLIN:
            continue
        conn, _ = listener.accept()
        try:
            conn.settimeout(10.0)
            msg, fds, _flags, _addr = socket.recv_fds(conn, _MAX_MSG, 4)
            conn.settimeout(None)
        except OSError:
            conn.close()
            continue
        info = json.loads(msg.split(b"\n", 1)[0] or b"{}")
        stale = stale or bool(info.get("exit"))  # a task of other settings: none of this executor can use it
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (wake_r, wake_w, listener.fileno(), *(c.fileno() for c in running.values())):
                with contextlib.suppress(OSError):
                    os.close(fd)
            # its own session, name and random state; the run's pipes, environment, port and folder (cmdline kept)
            os.setsid()
            child.prctl(15, TRAIN_FN)  # PR_SET_NAME
            if "numpy.random" in sys.modules:  # Python's random reseeds itself in a forked child; numpy's does not
                sys.modules["numpy.random"].seed()
            out_w, err_w, ev_w, held = fds
            for fd, std in ((out_w, 1), (err_w, 2)):
                os.dup2(fd, std)
                os.close(fd)
            os.environ.clear()
            os.environ.update(info["env"], **{ENV_FD: str(ev_w), ENV_HELD_PORT_FD: str(held)})
            os.chdir(info["cwd"])
            return conn, info["workdir"]
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):  # the task went away: the process sees its connection closed and ends
            conn.sendall(f"{pid}\n".encode())
        running[pid] = conn
    os._exit(0)


if __name__ == "__main__":
    _conn, _workdir = standby(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]))
    from .child import run

    run(_workdir, _conn.fileno())
