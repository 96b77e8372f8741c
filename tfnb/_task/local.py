"""A ps task on the driver (``tfnb.run(..., ps_placement="driver")``): the barrier task's body without Spark.

The launcher (tfnb.launcher.jobs.DriverPs) starts ``python -m tfnb._task.local`` and writes the pickled
``(TaskSpec, rank, host)`` to its stdin, never to argv or a file, since the spec holds the run's secret.
The process then runs :func:`tfnb._task.entry.run_task` as an executor's task would: it connects to the
run's channel, starts its TensorFlow server process and serves until the driver says stop. The launcher
keeps stdin open: end-of-file means the launcher is gone, and the process stops its TensorFlow server
and exits.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import signal
import struct
import sys
import threading


def _read(fd: int, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError("the launcher closed stdin before sending the task")
        buf += chunk
    return buf


def _watch_launcher(fd: int) -> None:
    """On end-of-file, SIGTERM this process: run_task unwinds and stops its TensorFlow server."""
    with contextlib.suppress(OSError):
        while os.read(fd, 1024):
            pass
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    (size,) = struct.unpack(">Q", _read(0, 8))
    spec, rank, host = pickle.loads(_read(0, size))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    threading.Thread(target=_watch_launcher, args=(0,), name="tfnb-launcher-watch", daemon=True).start()
    from .entry import run_task

    for _ in run_task(spec, iter(()), place=(rank, host, {})):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
