"""The TensorBoards tfnb launched on this machine: one info file per instance in a private per-user folder,
whether each instance still is what its file records, and its process: its "serving" line, its process
group's signals, its exit.

The rules (which folder, when an entry is stale, what is ever deleted) are told in
:mod:`tfnb.monitor.tensorboard`; every function here keeps them. Each TensorBoard runs in its own session,
so its pid is also its process group's id: signals go to the group (TensorBoard and its data-server helper).
Waiting for an exit uses a pidfd where the kernel has one; an exited child of this process is reaped, and a
dead pid's record in TensorBoard's own folder (kept inside the private folder) is removed.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import select
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import asdict, dataclass, fields
from typing import Iterator
from urllib.parse import urlsplit

from .._config import setting
from .._private import check_private, private_dir
from ..storage import atomic_write, locked

log = logging.getLogger(__name__)

_INFO_FORMAT = 1
_PROBE_TIMEOUT = 5.0    # seconds an alive instance gets to answer /data/environment before it counts as hung
_WILDCARDS = ("", "0.0.0.0", "::")
_LOG_NAME = re.compile(r"tb-[0-9a-f]{12}\.log")
_READY_POLL = 0.1       # seconds between looks at the starting process's log for its "serving" line
_STOP_GRACE = 10.0      # seconds between SIGTERM and SIGKILL; TensorBoard takes 3-5 s to exit on SIGTERM
_READY_LINE = re.compile(r"TensorBoard (\S+) at (https?://\S+) \(Press CTRL\+C")


@dataclass(frozen=True)
class TensorBoardInstance:
    """One TensorBoard process serving a log_dir, as recorded in its info file.

    Attributes:
        pid: process id (also its process group id: it runs in its own session).
        port: TCP port it serves on.
        host: address it is bound to.
        log_dir: absolute path (or URL) it reads.
        url: where it answers from the driver, e.g. ``http://127.0.0.1:6006/``.
        reload_interval: seconds between its log_dir scans.
        start_time: ``time.time()`` when it became ready.
        launched_by: pid of the process that started it (its atexit hook stops it).
        tensorboard_version: version TensorBoard reported.
        log_path: file receiving its stdout/stderr.
        proc_start: the process's start time in clock ticks since boot (Linux; 0 where unknown),
            so a recycled pid is not taken for this TensorBoard.
    """

    pid: int
    port: int
    host: str
    log_dir: str
    url: str
    reload_interval: float
    start_time: float
    launched_by: int
    tensorboard_version: str = ""
    log_path: str = ""
    proc_start: int = 0


def _info_dir() -> str:
    """The bookkeeping folder, verified private on every call (raises UnsafePathError otherwise)."""
    path = setting("tensorboard_dir", None, None, str)
    if not path:
        return private_dir("tensorboard", setting="TFNB_TENSORBOARD_DIR")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return check_private(path, "TFNB_TENSORBOARD_DIR")


def _info_path(pid: int) -> str:
    return os.path.join(_info_dir(), f"{pid}.json")


def _new_log_path() -> str:
    """A fresh file for a TensorBoard's output, named as :func:`_own_log` recognizes it."""
    return os.path.join(_info_dir(), f"tb-{uuid.uuid4().hex[:12]}.log")


def _locked():
    """Serialize find-or-launch between kernels on this machine, so two cells do not both launch."""
    return locked(os.path.join(_info_dir(), ".lock"))


def _write_info(inst: TensorBoardInstance) -> None:
    atomic_write(_info_path(inst.pid), json.dumps({"format": _INFO_FORMAT, **asdict(inst)}, indent=1).encode())


_FIELD_TYPES = {"int": int, "float": (int, float), "str": str}


def _read_info(path: str) -> TensorBoardInstance | None:
    """The instance an info file records, or None when it is unreadable or any field has the wrong type."""
    try:
        with open(path) as fh:
            raw = json.load(fh)
        if raw.pop("format", None) != _INFO_FORMAT:
            return None
        inst = TensorBoardInstance(**raw)
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    for f in fields(inst):
        value = getattr(inst, f.name)
        if isinstance(value, bool) or not isinstance(value, _FIELD_TYPES.get(f.type, object)):
            return None
    return inst if inst.pid > 0 else None


def _remove_entry(inst: TensorBoardInstance, info_path: str | None = None) -> None:
    folder = _info_dir()
    _unlink(info_path or _info_path(inst.pid))
    if inst.log_path:
        if _own_log(inst.log_path, folder):
            _unlink(inst.log_path)
        else:
            log.warning("not deleting %s named as a TensorBoard log by an info file: tfnb only deletes the "
                        "tb-*.log files it created in %s", inst.log_path, folder)
    _drop_tensorboard_record(inst.pid)


def _own_log(path: str, folder: str) -> bool:
    """True for a log file tfnb names and places directly in ``folder``, after resolving links and ``..``."""
    real = os.path.realpath(path)
    return (os.path.dirname(real) == os.path.realpath(folder)
            and _LOG_NAME.fullmatch(os.path.basename(real)) is not None)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _live_instances() -> list[TensorBoardInstance]:
    live = []
    folder = _info_dir()
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(folder, name)
        inst = _read_info(path)
        if inst is None or name != f"{inst.pid}.json":
            log.info("removing unreadable TensorBoard info file %s", path)
            _unlink(path)
            continue
        if not _is_ours(inst):
            log.info("removing stale TensorBoard entry for %s: pid %d is gone or is not that TensorBoard",
                     inst.log_dir, inst.pid)
        elif not _url_matches(inst):
            # never show it: an iframe pointed elsewhere would hand the page to whoever serves there
            log.warning("removing TensorBoard entry %s: its url %s is not host %s port %d it was launched on",
                        path, inst.url, inst.host, inst.port)
        elif not _answers(inst):
            log.warning("TensorBoard pid %d for %s does not answer on port %d; stopping it",
                        inst.pid, inst.log_dir, inst.port)
            _kill_group(inst.pid)
        else:
            live.append(inst)
            continue
        _remove_entry(inst, path)
    return live


def _url_matches(inst: TensorBoardInstance) -> bool:
    """The recorded URL is ``http://<host>:<port>/`` for the host and port the instance was launched on."""
    try:
        u = urlsplit(inst.url)
        port = u.port
    except ValueError:
        return False
    return (u.scheme == "http" and u.hostname == inst.host.strip("[]").lower() and port == inst.port
            and u.path in ("", "/") and not u.query and not u.username)


def _is_ours(inst: TensorBoardInstance) -> bool:
    """True when the entry's process is alive and is still the TensorBoard tfnb launched. Every check must hold
    before tfnb signals its process group or shows its URL: the recorded start time (pids get recycled), this user
    as owner, "tensorboard" in the command line, and leader of its own process group (tfnb starts it in a new
    session and signals the group)."""
    if not _alive(inst.pid):
        return False
    if not os.path.isdir("/proc/self"):
        return True  # not Linux: nothing better to check with than "alive"
    try:
        owner = os.stat(f"/proc/{inst.pid}").st_uid
        with open(f"/proc/{inst.pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
        group = os.getpgid(inst.pid)
    except OSError:
        return False
    return (owner == os.getuid() and b"tensorboard" in cmdline and group == inst.pid
            and inst.proc_start != 0 and _proc_start(inst.pid) == inst.proc_start)


def _answers(inst: TensorBoardInstance, timeout: float = _PROBE_TIMEOUT) -> bool:
    """True when the instance serves ``/data/environment`` for its log_dir."""
    import urllib.request  # only needed once an instance exists; keeps this module light to import

    host = "127.0.0.1" if inst.host in _WILDCARDS else f"[{inst.host}]" if ":" in inst.host else inst.host
    url = f"http://{host}:{inst.port}/data/environment"
    # No proxy: an HTTP(S)_PROXY in the environment must not see (or break) loopback requests.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            env = json.loads(resp.read().decode("utf-8"))
    except (OSError, ValueError) as e:
        log.debug("TensorBoard probe %s failed: %s", url, e)
        return False
    return env.get("data_location") == inst.log_dir


@contextlib.contextmanager
def _interrupt_held() -> Iterator[None]:
    """Delay SIGINT (KeyboardInterrupt) to the end of the block; a no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list = []
    previous = signal.signal(signal.SIGINT, lambda *frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(*caught[0])


def _await_ready(proc: subprocess.Popen, log_path: str, timeout: float):
    """Wait for TensorBoard's "serving at URL" line: (match, None, text), exit (None, code, text) or timeout."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_READY_POLL)
        text = ""
        with contextlib.suppress(OSError), open(log_path, "rb") as fh:
            text = fh.read().decode("utf-8", errors="replace")
        ready = _READY_LINE.search(text)
        if proc.returncode is not None:
            return None, proc.returncode, text
        if ready is not None or time.monotonic() >= deadline:
            return ready, None, text


def _kill_group(pid: int, proc: subprocess.Popen | None = None) -> None:
    """SIGTERM the process group (TensorBoard and its data server), then SIGKILL what is left."""
    _terminate_group(pid)
    _await_exit(pid, _STOP_GRACE, proc)


def _terminate_group(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGCONT):  # SIGCONT: a stopped process only acts on SIGTERM once resumed
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def _await_exit(pid: int, grace: float, proc: subprocess.Popen | None = None) -> None:
    if not _wait_gone(pid, grace, proc):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        _wait_gone(pid, _STOP_GRACE, proc)
    _drop_tensorboard_record(pid)


def _wait_gone(pid: int, timeout: float, proc: subprocess.Popen | None) -> bool:
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
        return proc.returncode is not None
    deadline = time.monotonic() + timeout
    fd = None
    with contextlib.suppress(AttributeError, OSError):  # no pidfd on macOS, nor on Linux before 5.3
        fd = os.pidfd_open(pid)
    try:
        while _reap(pid) and time.monotonic() < deadline:
            if fd is not None:
                # a pidfd turns readable when the process exits: no sleep loop needed
                select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            else:
                time.sleep(0.05)
        return not _reap(pid)
    finally:
        if fd is not None:
            os.close(fd)


def _reap(pid: int) -> bool:
    """True while ``pid`` is alive; reaps it when it is our exited child (launched in an earlier call)."""
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return _alive(pid)


def _alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie (an exited child its parent has not reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    parts = _proc_stat(pid)
    return parts[0] != b"Z" if parts else not os.path.isdir("/proc/self")


def _proc_stat(pid: int) -> list[bytes]:
    """The fields of ``/proc/PID/stat`` after the command name (state first); [] where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _proc_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), which a recycled pid does not share."""
    parts = _proc_stat(pid)
    return int(parts[19]) if len(parts) > 19 else None


def _drop_tensorboard_record(pid: int) -> None:
    """Remove TensorBoard's own record of a dead pid, which it deletes on SIGTERM but not when SIGKILLed. tfnb starts
    TensorBoard with TMPDIR set to the private folder, so that record is written there (``.tensorboard-info``), not
    in the temp dir shared by all users. A live pid's record is left alone: the pid may have been recycled."""
    if not _alive(pid):
        with contextlib.suppress(OSError):  # a folder found unsafe (UnsafePathError) is left as it is
            os.unlink(os.path.join(_info_dir(), ".tensorboard-info", f"pid-{pid}.info"))
