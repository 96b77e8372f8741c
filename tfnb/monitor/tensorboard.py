"""TensorBoard processes on the driver: start, reuse, clean stale ones, stop, as typed outcomes. Loopback unless told
otherwise; records in a private per-user folder, trusted only while their process is the TensorBoard recorded
(docs/security.md). Not ``tensorboard.manager``: its folder is writable by all, it trusts records of processes gone,
and it neither kills a start that timed out nor starts TensorBoard in its own process group."""
from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Union
from urllib.parse import urlsplit

from .._config import setting
from .._deps import require
from .._private import check_private, private_dir
from ..errors import ConfigError
from ..storage import atomic_write, locked
from .._config import check_seconds

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_RELOAD_INTERVAL = 5.0   # seconds; TensorBoard's own default
DEFAULT_TIMEOUT = 90.0          # TensorBoard imports TensorFlow at start: ~7 s idle, much more on a busy driver

_INFO_FORMAT = 1
_PROBE_TIMEOUT = 5.0    # seconds an alive instance gets to answer /data/environment before it counts as hung
_STOP_GRACE = 10.0      # seconds between SIGTERM and SIGKILL; TensorBoard takes 3-5 s to exit on SIGTERM
_EXIT_GRACE = 2.0       # the atexit hook's grace: Jupyter SIGKILLs a kernel that takes over 5 s to exit
_POLL = 0.1             # seconds between looks at a starting or exiting process
_TAIL_LINES = 20
_FIELD_TYPES = {"int": int, "float": (int, float), "str": str}
_LOG_NAME = re.compile(r"tb-[0-9a-f]{12}\.log")
_READY_LINE = re.compile(r"TensorBoard (\S+) at (https?://\S+) \(Press CTRL\+C")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b")
_children: dict[int, subprocess.Popen] = {}  # the TensorBoards this process launched, reaped once stopped


@dataclass(frozen=True)
class TensorBoardInstance:
    """One TensorBoard process as its info file records it. ``pid`` is also its process group's id, ``url`` where it
    answers from the driver, ``launched_by`` the pid whose atexit hook stops it, ``log_path`` its output, and
    ``proc_start`` its start in clock ticks since boot (0 where unknown), which a recycled pid does not share."""

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


@dataclass(frozen=True)
class _Serving:
    """A TensorBoard that answers; ``warning`` (also logged) when the network can reach it."""

    instance: TensorBoardInstance
    warning: str = ""

    url = property(lambda self: self.instance.url)
    port = property(lambda self: self.instance.port)
    pid = property(lambda self: self.instance.pid)
    log_dir = property(lambda self: self.instance.log_dir)


@dataclass(frozen=True)
class Launched(_Serving):
    """A new TensorBoard was started and answers at ``url``; this process stops it at exit."""


@dataclass(frozen=True)
class Reused(_Serving):
    """A TensorBoard serving the same log_dir on the same host was found alive and answering."""


@dataclass(frozen=True)
class Failed:
    """TensorBoard could not be started: ``error`` says why, ``fix`` what to change; ``exit_code`` and ``output``
    (its last lines) are set when TensorBoard ran and exited."""

    log_dir: str
    error: str
    fix: str
    exit_code: int | None = None
    output: str = ""


@dataclass(frozen=True)
class TimedOut:
    """TensorBoard ``pid`` did not serve within ``timeout`` seconds and was stopped; ``output``: its last lines."""

    log_dir: str
    timeout: float
    pid: int
    output: str = ""
    fix: str = ""


Outcome = Union[Launched, Reused, Failed, TimedOut]


def ensure_tensorboard(log_dir, *, host: str | None = None, port: int | None = None,
                       reload_interval: float | None = None, timeout: float | None = None) -> Outcome:
    """Reuse the TensorBoard serving ``log_dir`` on ``host`` (with that ``reload_interval`` when given), or start
    one; arguments as for :func:`tfnb.tensorboard`. Raises ConfigError, MissingDependencyError, UnsafePathError (the
    bookkeeping folder is not private); a Failed or TimedOut outcome carries the fix."""
    log_dir = _normalize_logdir(log_dir)
    host = setting("tensorboard_host", host, DEFAULT_HOST, str)
    if not isinstance(host, str) or not host.strip():
        raise ConfigError(f"host={host!r} is not an address; use '127.0.0.1' (default, this machine "
                          f"only) or '0.0.0.0' to expose TensorBoard on the network")
    host = host.strip()
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
        raise ConfigError(f"port={port!r} is not a TCP port (0-65535); pass port=None to pick a free one")
    asked_interval = setting("tensorboard_reload_interval", reload_interval, None, float)
    must = "a positive number of seconds"
    interval = check_seconds("reload_interval", asked_interval, must, optional=True) or DEFAULT_RELOAD_INTERVAL
    timeout = check_seconds("timeout", setting("tensorboard_timeout", timeout, DEFAULT_TIMEOUT, float), must)
    require("tensorboard", "tfnb.tensorboard")
    if problem := _logdir_problem(log_dir):
        return problem
    with _locked():
        live = _live_instances()
        for inst in live:
            if (inst.log_dir == log_dir and inst.host == host and port in (None, 0, inst.port)
                    and asked_interval in (None, inst.reload_interval)):
                return _serving(Reused, inst)
        if port and not _port_free(host, port):
            owner = next((i for i in live if i.port == port), None)
            user = (f"the TensorBoard pid {owner.pid} serving {owner.log_dir} (reload_interval="
                    f"{owner.reload_interval:g})" if owner else "another program")
            return Failed(log_dir, f"port {port} on {host} is already in use by {user}",
                          "pass port=None to let TensorBoard pick a free port, or stop what uses the port")
        return _launch(log_dir, host, port or 0, interval, timeout)


def instances() -> list[TensorBoardInstance]:
    """The TensorBoards tfnb runs for this user, alive and answering; stale entries are removed."""
    with _locked():
        return _live_instances()


def stop(target) -> bool:
    """Stop a TensorBoard (an instance or a Launched/Reused outcome) and its data server, and remove its info file;
    False when it was already gone."""
    inst = target.instance if isinstance(target, _Serving) else target
    if not isinstance(inst, TensorBoardInstance):
        raise ConfigError(f"stop() takes a TensorBoardInstance or a Launched/Reused outcome, not "
                          f"{type(target).__name__}; a Failed or TimedOut outcome has nothing to stop")
    return _stop(inst, _STOP_GRACE)


def _stop(inst: TensorBoardInstance, grace: float) -> bool:
    with _locked():
        # only the process our info file still describes: after a stop, its pid may be an unrelated process's
        mine = _read_info(_info_path(inst.pid)) == inst
        running = mine and _is_ours(inst)
        if running:
            _terminate(inst.pid)
        if mine:
            _remove_entry(inst)
    if running:
        _await_exit(inst.pid, grace)  # outside the lock: other kernels need not wait for it
    return running


def _stop_at_exit(inst: TensorBoardInstance) -> None:
    # sent SIGTERM, TensorBoard exits on its own even if the kernel is SIGKILLed after the short grace
    with contextlib.suppress(Exception):
        _stop(inst, _EXIT_GRACE)


def _normalize_logdir(log_dir) -> str:
    fix = "pass the directory holding the event files, e.g. tfnb.tensorboard('/tmp/run1/logs')"
    try:
        text = os.fsdecode(log_dir)
    except TypeError as e:
        raise ConfigError(f"log_dir={log_dir!r} is not a path; {fix}") from e
    if not text.strip():
        raise ConfigError(f"log_dir is empty; {fix}")
    return text if "://" in text else os.path.abspath(os.path.expanduser(text))


def _logdir_problem(log_dir: str) -> Failed | None:
    if "://" in log_dir or os.path.isdir(log_dir):
        return None  # a remote store (gs://, s3://) is TensorBoard's to check
    if os.path.exists(log_dir):
        return Failed(log_dir, f"log_dir {log_dir} is a file, not a directory",
                      "pass the directory that holds the event files (e.g. the run's log_dir)")
    return Failed(log_dir, f"log_dir {log_dir} does not exist",
                  "check the path, or create it first (os.makedirs(log_dir, exist_ok=True)): TensorBoard picks up "
                  "runs as they appear")


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s, contextlib.suppress(OSError):
        s.bind((host, port))
        return True
    return False


def _serving(kind: type[_Serving], inst: TensorBoardInstance) -> _Serving:
    """A Launched/Reused outcome, carrying (and logging) a warning when the network can reach it."""
    host = inst.host.strip("[]")
    with contextlib.suppress(ValueError):  # a host name: it may well resolve to a network address
        if host.lower() == "localhost" or ipaddress.ip_address(host).is_loopback:
            return kind(inst)
    warning = (f"TensorBoard listens on {inst.host} port {inst.port}, reachable from the network: anyone who can "
               f"connect to it reads everything under {inst.log_dir} (TensorBoard has no login). Use "
               f"host='127.0.0.1' (the default) unless the network is trusted.")
    log.warning("%s", warning)
    return kind(inst, warning=warning)


def _launch(log_dir: str, host: str, port: int, reload_interval: float, timeout: float) -> Outcome:
    folder = _info_dir()
    log_path = os.path.join(folder, f"tb-{uuid.uuid4().hex[:12]}.log")  # as _remove_entry recognizes it
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", log_dir, "--host", host,
           "--port", str(port), "--reload_interval", f"{reload_interval:g}"]
    # TensorBoard's own record (read by %tensorboard) goes to $TMPDIR/.tensorboard-info: not the shared temp dir
    os.makedirs(os.path.join(folder, ".tensorboard-info"), mode=0o700, exist_ok=True)
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ, "TMPDIR": folder}
    proc = ready = None
    try:
        # An interrupt during Popen would lose the child's pid: held until `proc` is set. In its own session,
        # TensorBoard is not hit by a kernel interrupt, and signals to its group reach its data server too.
        with _interrupt_held(), open(log_path, "wb") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
        log.info("starting TensorBoard pid %d for %s", proc.pid, log_dir)
        ready, code, text = _await_ready(proc, log_path, timeout)
    except OSError as e:
        if proc is not None:
            raise
        return Failed(log_dir, f"could not run {sys.executable} -m tensorboard.main: {e}",
                      "check that this Python can run TensorBoard (pip install tensorboard)")
    finally:
        # not serving (exited, timed out, interrupted): no info file names it, so nothing else would ever stop it
        if ready is None:
            if proc is not None and proc.returncode is None:
                _terminate(proc.pid)
                _await_exit(proc.pid, _STOP_GRACE, proc)
            _unlink(log_path)
    if code is not None:
        return _exit_failure(log_dir, host, port, code, text)
    if ready is None:
        return TimedOut(log_dir, timeout, proc.pid, _tail(text),
                        f"TensorBoard did not serve within {timeout:g} s and was stopped; it imports "
                        f"TensorFlow at start, which is slow on a busy machine: raise timeout= "
                        f"(or TFNB_TENSORBOARD_TIMEOUT)")
    version, url = ready.group(1), ready.group(2)
    inst = TensorBoardInstance(pid=proc.pid, port=urlsplit(url).port or port, host=host, log_dir=log_dir, url=url,
                               reload_interval=reload_interval, start_time=time.time(),
                               launched_by=os.getpid(), tensorboard_version=version, log_path=log_path,
                               proc_start=_proc_start(proc.pid) or 0)
    atomic_write(_info_path(inst.pid), json.dumps({"format": _INFO_FORMAT, **asdict(inst)}, indent=1).encode())
    _children[proc.pid] = proc
    # after a SIGKILLed kernel instead, the next ensure_tensorboard reuses it, or finds it stale and removes it
    atexit.register(_stop_at_exit, inst)
    return _serving(Launched, inst)


@contextlib.contextmanager
def _interrupt_held():
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
    """(the "serving at URL" match, None, output); on exit (None, code, output); on timeout (None, None, output)."""
    def output() -> str:
        with contextlib.suppress(OSError):
            return Path(log_path).read_bytes().decode("utf-8", errors="replace")
        return ""

    _wait(lambda: proc.poll() is not None or _READY_LINE.search(output()), timeout)
    text, code = output(), proc.poll()
    return (_READY_LINE.search(text) if code is None else None), code, text


def _wait(done, timeout: float):
    """Poll ``done()`` until it is true or ``timeout`` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while not (result := done()) and time.monotonic() < deadline:
        time.sleep(_POLL)
    return result


def _exit_failure(log_dir: str, host: str, port: int, code: int, text: str) -> Failed:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # TensorBoard's "ERROR: ..." line, else an exception's last line: not TensorFlow's start-up chatter
    errors = [ln for ln in lines if ln.startswith("ERROR:") or _EXCEPTION_LINE.match(ln)]
    reason = (errors or lines or ["no output"])[-1]
    if "could not bind" in text or "already in use" in text or "Cannot assign requested address" in text:
        where = f"{host} port {port}" if port else host
        fix = (f"TensorBoard could not listen on {where}; use host='127.0.0.1' (default) or an address "
               f"of this machine, and port=None for a free port")
    else:
        fix = "read TensorBoard's output below; run `python -m tensorboard.main --logdir ...` by hand to retry"
    return Failed(log_dir, f"TensorBoard exited with code {code} before serving: {reason}", fix,
                  exit_code=code, output=_tail(text))


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-_TAIL_LINES:])


def _info_dir() -> str:
    """The bookkeeping folder, verified private on every call (UnsafePathError otherwise)."""
    path = setting("tensorboard_dir", None, None, str)
    if not path:
        return private_dir("tensorboard", setting="TFNB_TENSORBOARD_DIR")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return check_private(path, "TFNB_TENSORBOARD_DIR")


def _info_path(pid: int) -> str:
    return os.path.join(_info_dir(), f"{pid}.json")


def _locked():
    """Find-or-launch one kernel at a time, so two cells do not both launch."""
    return locked(os.path.join(_info_dir(), ".lock"))


def _read_info(path: str) -> TensorBoardInstance | None:
    """The instance an info file records; None when unreadable or a field has the wrong type."""
    try:
        raw = json.loads(Path(path).read_text())
        if raw.pop("format", None) != _INFO_FORMAT:
            return None
        inst = TensorBoardInstance(**raw)
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    typed = all(not isinstance(v := getattr(inst, f.name), bool) and isinstance(v, _FIELD_TYPES[f.type])
                for f in fields(inst))
    return inst if typed and inst.pid > 0 else None


def _live_instances() -> list[TensorBoardInstance]:
    """The entries whose process is the TensorBoard recorded, at its launch URL, answering; the others are removed
    (a hung TensorBoard of ours is killed)."""
    live = []
    folder = _info_dir()
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".json")):
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
            _terminate(inst.pid)
            _await_exit(inst.pid, _STOP_GRACE)
        else:
            live.append(inst)
            continue
        _remove_entry(inst)
    return live


def _remove_entry(inst: TensorBoardInstance) -> None:
    folder = _info_dir()
    _unlink(_info_path(inst.pid))
    real = os.path.realpath(inst.log_path)  # links and ".." resolved: only a tb-*.log directly in the folder
    own = os.path.dirname(real) == os.path.realpath(folder) and _LOG_NAME.fullmatch(os.path.basename(real))
    if inst.log_path and own:
        _unlink(inst.log_path)
    elif inst.log_path:
        log.warning("not deleting %s named as a TensorBoard log by an info file: tfnb only deletes the "
                    "tb-*.log files it created in %s", inst.log_path, folder)
    _drop_tensorboard_record(inst.pid)


def _drop_tensorboard_record(pid: int) -> None:
    """Remove TensorBoard's own record of a dead pid, left when it was SIGKILLed (not a live pid's: maybe recycled)."""
    if not _alive(pid):
        with contextlib.suppress(OSError):  # a folder found unsafe (UnsafePathError) is left as it is
            os.unlink(os.path.join(_info_dir(), ".tensorboard-info", f"pid-{pid}.info"))


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _url_matches(inst: TensorBoardInstance) -> bool:
    """The recorded URL is the one TensorBoard prints for the host and port it was launched on."""
    host = f"[{inst.host}]" if ":" in inst.host and not inst.host.startswith("[") else inst.host
    return inst.url == f"http://{host}:{inst.port}/"


def _is_ours(inst: TensorBoardInstance) -> bool:
    """The entry's process is alive and still the TensorBoard tfnb launched: its recorded start time (pids get
    recycled), this user's, "tensorboard" in its command line, leader of its process group (which tfnb signals)."""
    if not os.path.isdir("/proc/self"):
        return _alive(inst.pid)  # not Linux: nothing better to check with than "alive"
    stat = _proc_stat(inst.pid)  # state, parent, process group, ..., start time (index 19)
    try:
        owner = os.stat(f"/proc/{inst.pid}").st_uid
        cmdline = Path(f"/proc/{inst.pid}/cmdline").read_bytes()
    except OSError:
        return False
    return (len(stat) > 19 and stat[0] != b"Z" and int(stat[2]) == inst.pid and owner == os.getuid()
            and b"tensorboard" in cmdline and inst.proc_start != 0 and int(stat[19]) == inst.proc_start)


def _answers(inst: TensorBoardInstance) -> bool:
    import urllib.request  # only needed once an instance exists

    host = "127.0.0.1" if inst.host in ("", "0.0.0.0", "::") else f"[{inst.host}]" if ":" in inst.host else inst.host
    url = f"http://{host}:{inst.port}/data/environment"
    # no proxy: an HTTP(S)_PROXY must not see (or break) loopback requests
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=_PROBE_TIMEOUT) as resp:
            env = json.loads(resp.read().decode("utf-8"))
    except (OSError, ValueError) as e:
        log.debug("TensorBoard probe %s failed: %s", url, e)
        return False
    return env.get("data_location") == inst.log_dir


def _alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie (an exited child not reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    parts = _proc_stat(pid)
    return parts[0] != b"Z" if parts else not os.path.isdir("/proc/self")


def _proc_stat(pid: int) -> list[bytes]:
    """The fields of ``/proc/PID/stat`` after the command name; [] where unreadable."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _proc_start(pid: int) -> int | None:
    parts = _proc_stat(pid)
    return int(parts[19]) if len(parts) > 19 else None


def _terminate(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGCONT):  # SIGCONT: a stopped process only acts on SIGTERM once resumed
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def _await_exit(pid: int, grace: float, proc: subprocess.Popen | None = None) -> None:
    """Wait ``grace`` seconds for ``pid`` to exit, else SIGKILL its group (TensorBoard and its data server)."""
    proc = proc or _children.pop(pid, None)

    def gone() -> bool:
        return proc.poll() is not None if proc else not _alive(pid)

    if not _wait(gone, grace):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        _wait(gone, _STOP_GRACE)
    _drop_tensorboard_record(pid)


__all__ = ["TensorBoardInstance", "Launched", "Reused", "Failed", "TimedOut", "Outcome",
           "ensure_tensorboard", "instances", "stop", "DEFAULT_HOST"]
