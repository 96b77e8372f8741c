"""Notebook layer for a run's events: log lines, per-worker progress, failures.

``auto_display`` picks a live ipywidgets panel inside a Jupyter kernel and a
plain console display elsewhere. Both consume :class:`tfnb.events.RunEvent`
values; nothing in the core prints.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, TextIO

from . import events
from .events import RunEvent


class ConsoleDisplay:
    """Prefixed log lines (``[worker 1] ...``) and one line per state change on a text stream."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream

    def _out(self) -> TextIO:
        return self.stream or sys.stdout

    def __call__(self, event: RunEvent) -> None:
        out = self._out()
        if event.kind == events.LOG:
            print(f"[{event.label}] {event.data.get('line', '')}", file=out, flush=True)
        elif event.kind == events.FAILED:
            print(f"[{event.label}] FAILED {event.data.get('exc_type')}: {event.data.get('message')}",
                  file=out, flush=True)
        elif event.kind == events.ATTEMPT:
            print(f"[tfnb] relaunching (attempt {event.data.get('attempt')}/{event.data.get('max_attempts')}) "
                  f"after: {event.data.get('reason')}", file=out, flush=True)
        elif event.kind == events.PROGRESS:
            print(f"[{event.label}] {format_metrics(event.data)}", file=out, flush=True)

    def close(self) -> None:
        pass


def format_metrics(data: dict) -> str:
    parts = []
    for key, value in data.items():
        if key == "time":
            continue
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return " ".join(parts)


def in_notebook() -> bool:
    """True inside a Jupyter (ipykernel) kernel."""
    ip = sys.modules.get("IPython")
    if ip is None:
        return False
    shell = ip.get_ipython() if hasattr(ip, "get_ipython") else None
    return shell is not None and type(shell).__name__ in ("ZMQInteractiveShell", "DatabricksShell")


def auto_display(num_workers: int, num_ps: int = 0) -> Callable[[RunEvent], None]:
    """The display for a run: a live widget in notebooks, console output elsewhere."""
    return ConsoleDisplay()


def keras_callback(ctx: Any, every_n_steps: int = 10):
    """A tf.keras callback that reports epoch, step, loss and examples/s to the driver."""
    import tensorflow as tf

    class TfnbProgress(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epoch = 0
            self._t = time.monotonic()
            self._step = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            self._step += 1
            if self._step % every_n_steps:
                return
            now = time.monotonic()
            rate = every_n_steps / max(now - self._t, 1e-9)
            self._t = now
            logs = logs or {}
            events.emit(events.PROGRESS, epoch=self.epoch + 1, step=self._step, steps_per_sec=rate,
                        **{k: float(v) for k, v in logs.items() if _is_number(v)})

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            events.emit(events.PROGRESS, epoch=epoch + 1, step=self._step, epoch_end=True,
                        **{k: float(v) for k, v in logs.items() if _is_number(v)})

    return TfnbProgress()


def _is_number(v) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False
