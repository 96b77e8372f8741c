"""Events from the train_fn process to the driver: one JSON object per line on the descriptor ``TFNB_EVENT_FD``,
forwarded by the supervising task. Outside a tfnb task, :func:`emit` does nothing."""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any

from .._protocol import ENV_FD, PIPE_KINDS

_lock = threading.Lock()
_stream = None  # opened at the first emit, not at import: a warm standby gets ENV_FD once claimed


def emit(kind: str, **data: Any) -> None:
    """Send one event (``kind`` plus JSON-serialisable fields) to the driver; no-op outside a tfnb task."""
    global _stream
    if kind not in PIPE_KINDS:
        raise ValueError(f"event kind {kind!r} is not one of tfnb._protocol.EventKind "
                         f"({', '.join(sorted(PIPE_KINDS))}); add it there")
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
