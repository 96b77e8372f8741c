"""Events of a run, both ends.

Inside the train_fn process, :func:`emit` writes one JSON object per line to the
file descriptor named by ``TFNB_EVENT_FD``; the supervising Spark task forwards
it to the driver over the run's authenticated channel. On the driver every
message becomes a typed :class:`RunEvent` handed to the display (log panel,
progress widget, CLI line). Outside a tfnb task, ``emit`` does nothing.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

ENV_FD = "TFNB_EVENT_FD"

# kinds of RunEvent
LOG = "log"            # data: stream ("stdout"/"stderr"), line
PROGRESS = "progress"  # data: whatever train_fn reported (epoch, step, loss, examples_per_sec, ...)
STATE = "state"        # data: state ("starting", "training", "done", "stopped", "failed")
FAILED = "failed"      # data: the TaskFailure fields
ATTEMPT = "attempt"    # data: attempt, max_attempts, reason (driver-side, job_name "driver")


@dataclass(frozen=True)
class RunEvent:
    """One thing that happened in a run, as the driver's display receives it."""

    kind: str
    job_name: str
    task_index: int
    data: Mapping[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    @property
    def label(self) -> str:
        return f"{self.job_name} {self.task_index}" if self.job_name != "driver" else "tfnb"


_lock = threading.Lock()
_stream = None  # opened at the first emit, not at import: a warm standby gets ENV_FD once claimed


def emit(kind: str, **data: Any) -> None:
    """Send one event (``kind`` plus JSON-serialisable fields) to the driver; no-op outside a tfnb task.

    Example:
        >>> from tfnb.events import emit
        >>> emit("progress", epoch=1, step=100, loss=0.25)
    """
    global _stream
    if _stream is None:
        fd = os.environ.get(ENV_FD)
        if not fd:
            return
        try:
            _stream = os.fdopen(int(fd), "w", buffering=1, closefd=False)
        except OSError:
            return
    line = json.dumps({"kind": kind, "time": time.time(), **data}, default=str)
    with _lock, contextlib.suppress(OSError, ValueError):  # the supervisor is gone: nobody to tell
        _stream.write(line + "\n")
