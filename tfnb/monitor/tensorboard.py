"""TensorBoard processes on the driver: start one, find and reuse one, clean stale ones, stop one.

Core only: every function returns a typed outcome (:class:`Launched`, :class:`Reused`,
:class:`Failed`, :class:`TimedOut`) and never prints; :mod:`tfnb.notebook.tensorboard` renders them.
The bookkeeping told below, and signalling and awaiting the processes, is :mod:`tfnb.monitor.tb_registry`.

Security: TensorBoard has no authentication; anyone who can reach its port reads everything under
``log_dir``. Binding to loopback (``127.0.0.1``, the default) is what protects it: only processes on
the driver machine (other users of it included) and a notebook proxy running there (which adds its
own login) can reach it. Any other address makes the outcome carry a ``warning`` (also logged).

Bookkeeping: one JSON info file per instance, in a private per-user folder (``tfnb-tensorboard-<uid>``
under ``TFNB_STATE_DIR`` or the temp dir; ``TFNB_TENSORBOARD_DIR`` names another), checked on every
use (else :class:`~tfnb.errors.UnsafePathError` and nothing in it is read, killed or deleted). An
entry is stale when its process is gone or is not the TensorBoard recorded (start time, owner,
command line, own process group), when its URL is not the host and port it was launched on, or when
it no longer answers; listing instances removes stale entries (killing a hung TensorBoard of ours).
Only log files tfnb created inside the folder are ever deleted. TensorBoard's own record of itself
(``tensorboard.manager``, read by ``%tensorboard``) goes to the same folder, not to the temp dir shared by all
users; ``tensorboard.manager`` itself is not used, since it trusts any record in that shared folder (writable
by all) and reuses one whose process is gone.

Lifetime: each TensorBoard runs in its own session, so interrupting the kernel does not hit it. An
``atexit`` hook stops the instances this process launched when it exits normally (a kernel shut down
or restarted from the UI does). After a SIGKILLed kernel its TensorBoard keeps running, and the next
:func:`ensure_tensorboard` for that log_dir reuses it (or finds it stale and removes it).
"""
from __future__ import annotations

import atexit
import contextlib
import ipaddress
import logging
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Union
from urllib.parse import urlsplit

from .._config import setting
from .._deps import require
from ..errors import ConfigError
from .tb_registry import (_STOP_GRACE, TensorBoardInstance, _await_exit, _await_ready, _info_path, _interrupt_held,
                          _is_ours, _kill_group, _live_instances, _locked, _new_log_path, _proc_start, _read_info,
                          _remove_entry, _terminate_group, _unlink, _write_info)

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_RELOAD_INTERVAL = 5.0   # seconds; TensorBoard's own default
DEFAULT_TIMEOUT = 90.0          # TensorBoard imports TensorFlow at start: ~7 s idle, much more on a busy driver

_EXIT_GRACE = 2.0       # seconds the atexit hook waits before SIGKILL
_TAIL_LINES = 20
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b")


@dataclass(frozen=True)
class _Serving:
    """A TensorBoard that answers: its ``instance`` (whose ``url``, ``port``, ``pid``, ``log_dir`` it shows)
    and a ``warning`` (also logged) saying what is exposed and how to avoid it when it is bound to a
    non-loopback host, reachable from the network."""

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
    """A TensorBoard already serving the same log_dir on the same host was found alive and answering."""


@dataclass(frozen=True)
class Failed:
    """TensorBoard could not be started for ``log_dir``: ``error`` says why and ``fix`` what to change;
    ``exit_code`` and ``output`` (its last lines) are set when TensorBoard ran and exited."""

    log_dir: str
    error: str
    fix: str
    exit_code: int | None = None
    output: str = ""


@dataclass(frozen=True)
class TimedOut:
    """TensorBoard (process ``pid``) did not serve ``log_dir`` within ``timeout`` seconds and was stopped;
    ``output`` holds the last lines it printed, ``fix`` what to change."""

    log_dir: str
    timeout: float
    pid: int
    output: str = ""
    fix: str = ""


Outcome = Union[Launched, Reused, Failed, TimedOut]


def ensure_tensorboard(log_dir, *, host: str | None = None, port: int | None = None,
                       reload_interval: float | None = None, timeout: float | None = None) -> Outcome:
    """Reuse the TensorBoard serving ``log_dir``, or start one.

    TensorBoard has no authentication: it is bound to loopback unless ``host`` says otherwise, and
    anyone who can reach the port reads all of ``log_dir``.

    Args:
        log_dir: directory (or ``gs://``-style URL) holding event files; local paths are made absolute.
        host: address to bind; default ``127.0.0.1`` (env ``TFNB_TENSORBOARD_HOST``).
        port: port to serve on; default: a free port chosen by the OS.
        reload_interval: seconds between log_dir scans; default 5 (env ``TFNB_TENSORBOARD_RELOAD_INTERVAL``).
            When given, only an instance with that interval is reused; when not, any for the log_dir.
        timeout: seconds to wait for a new TensorBoard to serve; default 90 (env ``TFNB_TENSORBOARD_TIMEOUT``).

    Returns:
        :class:`Reused` or :class:`Launched` with its url/port/pid, else :class:`Failed` (bad log_dir,
        port in use, TensorBoard exited) or :class:`TimedOut` (the process was stopped), each with
        the fix.

    Raises:
        ConfigError: an argument has the wrong type or range.
        MissingDependencyError: the ``tensorboard`` package is not installed.
        UnsafePathError: the bookkeeping folder is not private to this user (see the module docs).

    Example:
        >>> outcome = ensure_tensorboard("/tmp/run1/logs")
        >>> if isinstance(outcome, (Launched, Reused)):
        ...     print(outcome.url)
    """
    log_dir = _normalize_logdir(log_dir)
    host = setting("tensorboard_host", host, DEFAULT_HOST, str)
    if not isinstance(host, str) or not host.strip():
        raise ConfigError(f"host={host!r} is not an address; use '127.0.0.1' (default, this machine "
                          f"only) or '0.0.0.0' to expose TensorBoard on the network")
    host = host.strip()
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
        raise ConfigError(f"port={port!r} is not a TCP port (0-65535); pass port=None to pick a free one")
    asked_interval = setting("tensorboard_reload_interval", reload_interval, None, float)
    interval = _positive("reload_interval", DEFAULT_RELOAD_INTERVAL if asked_interval is None else asked_interval)
    timeout = _positive("timeout", setting("tensorboard_timeout", timeout, DEFAULT_TIMEOUT, float))
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
    """TensorBoard instances recorded by tfnb that are alive and answering; stale entries are removed.

    Example:
        >>> for inst in instances():
        ...     print(inst.log_dir, inst.url, inst.pid)
    """
    with _locked():
        return _live_instances()


def stop(target) -> bool:
    """Stop a TensorBoard (and its data-server helper) and remove its info file.

    Args:
        target: a :class:`TensorBoardInstance`, or a :class:`Launched` / :class:`Reused` outcome.

    Returns:
        True when a running TensorBoard was stopped; False when it was already gone.

    Raises:
        ConfigError: ``target`` is not an instance or a running outcome.

    Example:
        >>> outcome = ensure_tensorboard("/tmp/run1/logs")
        >>> stop(outcome)
        True
    """
    inst = target.instance if isinstance(target, _Serving) else target
    if not isinstance(inst, TensorBoardInstance):
        raise ConfigError(f"stop() takes a TensorBoardInstance or a Launched/Reused outcome, not "
                          f"{type(target).__name__}; a Failed or TimedOut outcome has nothing to stop")
    return _stop(inst, _STOP_GRACE)


def _stop(inst: TensorBoardInstance, grace: float) -> bool:
    with _locked():
        # Only the process our info file still describes is signalled: after a stop, its pid may
        # belong to an unrelated process.
        mine = _read_info(_info_path(inst.pid)) == inst
        running = mine and _is_ours(inst)
        if running:
            _terminate_group(inst.pid)
        if mine:
            _remove_entry(inst)
    if running:
        _await_exit(inst.pid, grace)  # outside the lock: other kernels need not wait for it
    return running


def _normalize_logdir(log_dir) -> str:
    try:
        text = os.fsdecode(log_dir)
    except TypeError as e:
        raise ConfigError(f"log_dir={log_dir!r} is not a path; pass the directory holding the event "
                          f"files, e.g. tfnb.tensorboard('/tmp/run1/logs')") from e
    if not text.strip():
        raise ConfigError("log_dir is empty; pass the directory holding the event files, "
                          "e.g. tfnb.tensorboard('/tmp/run1/logs')")
    return text if "://" in text else os.path.abspath(os.path.expanduser(text))


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name}={value!r} must be a positive number of seconds")
    return float(value)


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
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _serving(kind: type[_Serving], inst: TensorBoardInstance) -> _Serving:
    """A Launched/Reused outcome, carrying (and logging) a warning when the network can reach it."""
    host = inst.host.strip("[]")
    try:
        loopback = host.lower() == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may well resolve to a network address
        loopback = False
    warning = "" if loopback else (
        f"TensorBoard listens on {inst.host} port {inst.port}, reachable from the network: anyone who can "
        f"connect to it reads everything under {inst.log_dir} (TensorBoard has no login). Use "
        f"host='127.0.0.1' (the default) unless the network is trusted.")
    if warning:
        log.warning("%s", warning)
    return kind(inst, warning=warning)


def _launch(log_dir: str, host: str, port: int, reload_interval: float, timeout: float) -> Outcome:
    log_path = _new_log_path()
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", log_dir, "--host", host,
           "--port", str(port), "--reload_interval", f"{reload_interval:g}"]
    # TensorBoard writes its own record under $TMPDIR/.tensorboard-info: the private folder's (module docs)
    folder = os.path.dirname(log_path)
    os.makedirs(os.path.join(folder, ".tensorboard-info"), mode=0o700, exist_ok=True)
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ, "TMPDIR": folder}
    proc = None
    try:
        # An interrupt (a notebook's "stop") while Popen runs would lose the started child's pid:
        # hold it until `proc` is set, then raise it here, where the process is stopped.
        with _interrupt_held(), open(log_path, "wb") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
        log.info("starting TensorBoard pid %d for %s", proc.pid, log_dir)
        ready, code, text = _await_ready(proc, log_path, timeout)
    except BaseException as e:
        # Interrupted cell (KeyboardInterrupt) or any other error while waiting: no info file
        # names this process yet, so nothing else would ever stop it.
        if proc is not None:
            _kill_group(proc.pid, proc)
        _unlink(log_path)
        if proc is None and isinstance(e, OSError):
            return Failed(log_dir, f"could not run {sys.executable} -m tensorboard.main: {e}",
                          "check that this Python can run TensorBoard (pip install tensorboard)")
        raise
    if code is not None:
        _unlink(log_path)
        return _exit_failure(log_dir, host, port, code, text)
    if ready is None:
        _kill_group(proc.pid, proc)
        _unlink(log_path)
        return TimedOut(log_dir, timeout, proc.pid, _tail(text),
                        f"TensorBoard did not serve within {timeout:g} s and was stopped; it imports "
                        f"TensorFlow at start, which is slow on a busy machine: raise timeout= "
                        f"(or TFNB_TENSORBOARD_TIMEOUT)")
    version, url = ready.group(1), ready.group(2)
    inst = TensorBoardInstance(pid=proc.pid, port=urlsplit(url).port or port, host=host, log_dir=log_dir, url=url,
                               reload_interval=reload_interval, start_time=time.time(),
                               launched_by=os.getpid(), tensorboard_version=version, log_path=log_path,
                               proc_start=_proc_start(proc.pid) or 0)
    _write_info(inst)
    # Holding `proc` here also keeps Popen from warning that a child it never waited for still runs.
    atexit.register(_stop_at_exit, inst, proc)
    return _serving(Launched, inst)


def _exit_failure(log_dir: str, host: str, port: int, code: int, text: str) -> Failed:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # TensorBoard's own "ERROR: ..." line, else a Python exception's last line; TensorFlow's
    # start-up chatter (CUDA probes etc.) is not the reason.
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


def _stop_at_exit(inst: TensorBoardInstance, proc: subprocess.Popen) -> None:
    del proc
    # Short grace: Jupyter SIGKILLs a kernel that takes over 5 s to exit; TensorBoard, already
    # sent SIGTERM, exits on its own even if that happens. Interpreter shutdown: never let cleanup raise.
    with contextlib.suppress(Exception):
        _stop(inst, _EXIT_GRACE)


def _tail(text: str, lines: int = _TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


__all__ = ["TensorBoardInstance", "Launched", "Reused", "Failed", "TimedOut", "Outcome",
           "ensure_tensorboard", "instances", "stop", "DEFAULT_HOST"]
