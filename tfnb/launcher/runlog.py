"""The run's log file: every line every task printed, with states and failures, uncut, in one local file.

``<model_dir>/tfnb-logs/run-<run_id>.log`` when model_dir is a local path, else the user's private run folder
(``<tmp>/tfnb-runs-<uid>/<run_id>/run.log``, the newest 100 runs kept). Every attempt appends to it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
import time

from .._protocol import Msg

log = logging.getLogger(__name__)

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")  # s3://, gs://, dbfs:/, hdfs://... (not C:/)
_KEEP_RUNS = 100    # run folders kept in the private run folder; older ones are removed
_FLUSH_EVERY = 1.0  # seconds: someone may be reading the file while the run goes on


def run_log_path(run_id: str, model_dir: str | None) -> str:
    model_dir = (model_dir or "").removeprefix("file://")
    if model_dir and not _URL.match(model_dir):
        return os.path.join(model_dir, "tfnb-logs", f"run-{run_id}.log")
    from .._private import private_dir

    base = private_dir("runs")
    _prune(base, run_id)
    return os.path.join(base, run_id, "run.log")


def _prune(base: str, current: str) -> None:
    with contextlib.suppress(OSError):
        runs = [e for e in os.scandir(base) if e.is_dir(follow_symlinks=False) and e.name != current]
        runs.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime)
        for e in runs[:max(0, len(runs) - _KEEP_RUNS + 1)]:
            shutil.rmtree(e.path, ignore_errors=True)


class RunLog:
    """Appends the messages the driver receives to the run's log file; thread-safe, never raises."""

    def __init__(self, path: str | None):
        self.path = path
        self._lock = threading.RLock()  # a failed write closes the file while holding it
        self._flushed = time.monotonic()
        self._file = None
        if path is None:
            return
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._file = open(path, "a", encoding="utf-8", errors="replace", buffering=1 << 16)
        except OSError as e:
            log.warning("tfnb: cannot write the run's log file %s (%s); the display still shows the logs", path, e)

    @classmethod
    def for_run(cls, run_id: str, model_dir: str | None) -> RunLog:
        from ..errors import UnsafePathError

        try:
            runlog = cls(run_log_path(run_id, model_dir))
            if runlog._file is None and model_dir:
                runlog = cls(run_log_path(run_id, None))
        except (OSError, UnsafePathError) as e:
            log.warning("tfnb: no log file for this run: %s", e)
            runlog = cls(None)
        return runlog

    def note(self, text: str) -> None:
        self._write(f"{_stamp()} tfnb: {text}\n")

    def message(self, peer: dict, msg: dict) -> None:
        if self._file is None:
            return
        items = msg.get("items") if msg.get("kind") == Msg.BATCH else (msg,)
        out = []
        for m in items if isinstance(items, (list, tuple)) else ():
            kind = m.get("kind") if isinstance(m, dict) else None
            if kind == Msg.LOG and ("lines" in m or not m.get("partial")):  # a partial one: the whole follows
                lines = (m["lines"] or ()) if "lines" in m else [m.get("line", "")]
                out.extend(f"{m.get('stream', '')}: {line}" for line in lines)
            elif kind == Msg.STATE:
                out.append(f"state: {m.get('state', '')}")
            elif kind == Msg.FAILED:
                f = m.get("failure") or {}
                out.append(f"FAILED {f.get('exc_type', 'Error')}: {f.get('message', '')}")
                out.extend(f"traceback: {t}" for t in str(f.get("traceback") or "").rstrip("\n").splitlines())
            elif kind == Msg.EVENT and (m.get("data") or {}).get("epoch_end"):
                fields = " ".join(f"{k}={v}" for k, v in m["data"].items() if k not in ("epoch_end", "time"))
                out.append(f"epoch end: {fields}")
        if out:
            prefix = f"{_stamp()} {peer.get('job_name', '?')} {peer.get('task_index', '?')}"
            self._write("".join(f"{prefix} {line}\n" for line in out))

    def _write(self, text: str) -> None:
        with self._lock:
            if self._file is None:
                return
            try:
                self._file.write(text)
                now = time.monotonic()
                if now - self._flushed >= _FLUSH_EVERY:
                    self._file.flush()
                    self._flushed = now
            except (OSError, ValueError) as e:
                log.warning("tfnb: stopped writing the run's log file %s: %s", self.path, e)
                self.close()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None


_second = (0, "")  # the last second stamped and its text: a large run stamps thousands of batches a second


def _stamp() -> str:
    """2026-11-23 16:22:24.123, local time."""
    global _second
    now = time.time()
    second = int(now)
    if second != _second[0]:
        _second = (second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second)))
    return f"{_second[1]}.{int((now - second) * 1000):03d}"
