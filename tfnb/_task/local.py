"""A ps task on the driver (``ps_placement="driver"``): run_task without Spark, given the pickled ``(TaskSpec, rank,
host)`` on stdin (it holds the run's secret), which tfnb.launcher.jobs.DriverPs keeps open until the task must stop."""
from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import threading


def _watch_launcher(fd: int) -> None:
    """On end-of-file, SIGTERM this process: run_task unwinds and stops its TensorFlow server."""
    with contextlib.suppress(OSError):
        while os.read(fd, 1024):
            pass
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    sys.stdin.buffer.read(8)  # the launcher's length prefix: pickle finds the end by itself
    spec, rank, host = pickle.load(sys.stdin.buffer)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    threading.Thread(target=_watch_launcher, args=(0,), name="tfnb-launcher-watch", daemon=True).start()
    from .entry import run_task

    list(run_task(spec, iter(()), place=(rank, host, {})))  # a ps task yields nothing
    return 0


if __name__ == "__main__":
    sys.exit(main())
