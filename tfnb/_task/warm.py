"""Warm standbys: a train_fn process that already imported TensorFlow, waiting for the next run on this host.

Every run still gets a fresh process (one per task and attempt, never reused after train_fn ran); a
standby only moves the ``import tensorflow`` of the *next* run off its critical path. When a task of a
successful run ends, it leaves a standby that imports the run's ``preimport`` modules and then waits on
a Unix socket in this user's private folder. The next task whose settings match (same Python,
``preimport``, legacy Keras, ``env=``, GPU addresses: a run given other GPUs gets a fresh process, as
CUDA_VISIBLE_DEVICES must be set before TensorFlow is imported) connects, hands over the run's pipes,
port and environment with SCM_RIGHTS, and from then on the process behaves exactly like a freshly
started one: the connection is its parent-death watch and carries ``go`` and the exit code. A standby is
claimable while it still imports (its socket is then named ``.sock.part``; warm ones are preferred), so
a rerun right after a run waits only for the rest of that import instead of paying a whole one.

An unclaimed standby exits after ``TFNB_WARM_IDLE`` seconds (default 600), when the executor's Python
daemon that its creator belonged to exits (session stopped, executor lost), or when a task with other
settings, or GPUs that overlap its own, discards it (a sibling task's standby, on other GPUs of the
host, is left alone). Spark kills idle Python workers after one minute, so tying a standby to the worker
that made it would make it vanish before most reruns; the daemon lives as long as the executor.
"""
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
import threading
import time
from typing import Iterator

from .._private import private_dir

_FOLDER = "warm"
UNKNOWN_EXIT = -1000  # a claimed standby died without saying how (a signal or a crash in native code)
_MAX_MSG = 1 << 20


def key(preimport: tuple, legacy_keras: bool, env: tuple, gpus: tuple) -> str:
    """What a standby must share with a run to serve it (all of it fixed before TensorFlow is imported;
    PYTHONPATH too, since the standby's sys.path was built from it): ``<settings>.<GPUs>``, the GPU
    addresses it was started with readable, so a task can tell a sibling's standby from a stale one."""
    fixed = [sys.executable, list(preimport), legacy_keras, [list(kv) for kv in env],
             os.environ.get("TF_CPP_MIN_LOG_LEVEL", ""), os.environ.get("PYTHONPATH", "")]
    return hashlib.sha256(json.dumps(fixed).encode()).hexdigest()[:16] + "." + _gpu_tag(gpus)


def _gpu_tag(gpus: tuple) -> str:
    """``none``, the addresses joined by ``_`` when they are short and plain (Spark's usual 0, 1, ...), else a
    hash (``@...``) whose overlap with another set cannot be told."""
    if not gpus:
        return "none"
    if all(re.fullmatch(r"[A-Za-z0-9]{1,12}", g) for g in gpus) and len("_".join(gpus)) <= 40:
        return "_".join(gpus)  # (a Unix socket's path holds at most 107 bytes)
    return "@" + hashlib.sha256(json.dumps(list(gpus)).encode()).hexdigest()[:10]


def _stale(want: str, other: str) -> bool:
    """Whether the standby keyed ``other`` can serve no task of this host once one keyed ``want`` runs:
    other settings, or another GPU set that shares a GPU with ours (the host's GPUs were dealt anew).
    A sibling task's standby, holding GPUs disjoint from ours, is left for that sibling."""
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


def _unlink(*paths: str) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _connect(path: str) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(2.0)
        conn.connect(path)
        conn.settimeout(None)
        return conn
    except ConnectionRefusedError:
        _unlink(path)  # its standby is gone (or was just claimed, and unlinks it itself)
    except OSError:
        pass
    conn.close()
    return None


def claim(want: str) -> Iterator[socket.socket]:
    """Connections to the idle standbys with key ``want``, warm ones first; standbys with other keys
    are told to exit when stale (other settings, or GPUs that overlap ours: see :func:`_stale`). A standby
    serves one connection, and two tasks of a host may reach the same one at once (the second waits in
    its listen queue until the first is taken): when handing the run over fails, the caller tries the next."""
    mine = []
    for path in _sockets():
        name = os.path.basename(path)
        if name.startswith(want + "-"):
            mine.append(path)
        elif _stale(want, name.split("-", 1)[0]) and (other := _connect(path)):
            other.sendall(b'{"exit": true}\n')
            other.close()
    for path in mine:
        if conn := _connect(path):  # a refused one was taken already
            yield conn


def count(want: str) -> int:
    return sum(os.path.basename(p).startswith(want + "-") for p in _sockets())


def spawn(want: str, env: dict, idle: float) -> None:
    """Start a standby with key ``want`` in the background (it lives in its own session)."""
    path = os.path.join(private_dir(_FOLDER), f"{want}-{os.getpid()}-{time.monotonic_ns()}.sock")
    subprocess.Popen(
        [sys.executable, "-m", "tfnb._task.warm", path, str(idle), str(os.getppid())],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=dict(env, PYTHONUNBUFFERED="1"), start_new_session=True, cwd=private_dir(_FOLDER))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _readline(sock: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


class Claimed:
    """A claimed standby seen through the small part of ``subprocess.Popen`` the supervisor uses."""

    def __init__(self, conn: socket.socket, workdir: str, cwd: str, env: dict, held_fd: int):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ev_r, ev_w = os.pipe()
        body = json.dumps({"workdir": workdir, "cwd": cwd, "env": env}).encode() + b"\n"
        try:
            socket.send_fds(conn, [body], [out_w, err_w, ev_w, held_fd])
            self.pid = int(_readline(conn))
        except BaseException:
            for fd in (out_r, err_r, ev_r):
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w, ev_w):
                os.close(fd)
        self.conn = conn
        self.stdin = conn.makefile("wb")
        self.stdout = os.fdopen(out_r, "rb")
        self.stderr = os.fdopen(err_r, "rb")
        self.events = ev_r
        self.returncode: int | None = None

    def wait(self) -> int:
        """The exit code the process sent before exiting, or UNKNOWN_EXIT when it died without one."""
        if self.returncode is None:
            try:
                self.returncode = int(_readline(self.conn))
            except (ConnectionError, OSError, ValueError):
                self.returncode = UNKNOWN_EXIT
            self._reap()
        return self.returncode

    def _reap(self) -> None:
        # The process is not our child: wait until its pid is gone so "ended" means ended.
        for _ in range(100):
            if not _alive(self.pid):
                return
            time.sleep(0.02)

    def poll(self) -> int | None:
        if self.returncode is None and not _alive(self.pid):
            self.wait()
        return self.returncode


# ---------------------------------------------------------------- the standby's side


def nanny(path: str, idle: float, watch_pid: int) -> None:
    """The standby's parent: a small process that holds the socket, and once a task claims the standby,
    relays ``go``, forwards the stack-dump signals and reports how the process exited, as a parent can."""
    import signal

    inner_end, outer = socket.socketpair()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".part")  # the name while it imports; path once warm
    os.chmod(path + ".part", 0o600)
    inner = subprocess.Popen([sys.executable, "-m", "tfnb._task.child", "--standby", str(inner_end.fileno())],
                             pass_fds=[inner_end.fileno()], stdin=subprocess.DEVNULL)
    inner_end.close()

    def leave(*_):
        _unlink(path, path + ".part")
        inner.kill()
        os._exit(0)

    # Claimable from the start: a task that connects while the standby still imports hands over its
    # payload at once and waits only for the rest of the import, never longer than a fresh process.
    listener.listen(1)
    deadline = time.monotonic() + idle
    ready = False
    while True:
        if time.monotonic() > deadline or not _alive(watch_pid) or inner.poll() is not None:
            leave()
        readable, _, _ = select.select([listener] if ready else [listener, outer], [], [], 1.0)
        if outer in readable:
            if outer.recv(64) != b"ready\n":
                leave()
            ready = True
            os.replace(path + ".part", path)  # warm: claimed before standbys still importing
        if listener in readable:
            conn, _ = listener.accept()
            break
    listener.close()
    _unlink(path, path + ".part")
    try:
        msg, fds, _flags, _addr = socket.recv_fds(conn, _MAX_MSG, 4)
        if json.loads(msg.split(b"\n", 1)[0] or b"{}").get("exit") or len(fds) != 4:
            leave()
        socket.send_fds(outer, [msg], fds)
    except (OSError, ValueError):
        leave()
    for fd in fds:
        os.close(fd)
    # Claimed. The supervisor signals this process group (SIGTERM, SIGKILL) and this pid (the stack dump).
    for sig in (signal.SIGUSR1, signal.SIGCONT):
        signal.signal(sig, lambda n, _f: os.kill(inner.pid, n))
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM reaches the process itself
    conn.sendall(f"{os.getpid()}\n".encode())

    def relay():
        # "go" and the parent-death watch: the supervisor's end of the connection closing ends the process
        with contextlib.suppress(OSError):
            while chunk := conn.recv(1024):
                outer.sendall(chunk)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=relay, daemon=True).start()
    code = inner.wait()
    with contextlib.suppress(OSError):
        conn.sendall(f"{code}\n".encode())
    os._exit(0)


def serve(fd: int, preimport) -> tuple[socket.socket, str]:
    """The standby itself (in tfnb._child): import, then take over the run's fds and environment;
    returns (connection to the nanny, workdir), or exits when the nanny goes away first."""
    sock = socket.socket(fileno=fd)
    preimport()
    try:
        sock.sendall(b"ready\n")
        msg, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MSG, 4)
    except OSError:
        os._exit(0)
    if len(fds) != 4:
        os._exit(0)  # the nanny went away first
    info = json.loads(msg.split(b"\n", 1)[0])
    out_w, err_w, ev_w, held = fds
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, std in ((out_w, 1), (err_w, 2)):
        os.dup2(fd, std)
        os.close(fd)
    os.environ.clear()
    os.environ.update(info["env"], TFNB_EVENT_FD=str(ev_w), TFNB_HELD_PORT_FD=str(held))
    os.chdir(info["cwd"])
    return sock, info["workdir"]


if __name__ == "__main__":
    nanny(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]))
