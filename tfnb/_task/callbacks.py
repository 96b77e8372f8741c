"""``ctx.progress_callback()``: progress events to the driver's display, and ``profile_steps``' trace in ``fit``."""
from __future__ import annotations

import time
from typing import Any

from .._protocol import PROGRESS
from .._protocol import number as _number
from ..errors import ConfigError
from .events import emit


def _emit(**data: Any) -> None:
    emit(PROGRESS, **{k: v for k, v in data.items() if v is not None})


def keras_callback(ctx: Any = None, *, batch_size: int | None = None, interval: float = 0.5,
                   every_n_steps: int | None = None):
    """A Keras callback (tf-keras and Keras 3 alike) that reports epoch, step, loss, metrics and throughput to the
    driver's display: at most once per ``interval`` seconds (or ``every_n_steps`` batches), and at each epoch end.

    Args:
        ctx: the WorkerContext (optional; reports go to the run this process belongs to).
        batch_size: examples one step consumes on this worker; the display then shows examples/s (Keras does
            not tell callbacks the batch size: without it, steps/s only).
        interval: minimum seconds between two step updates.
        every_n_steps: report every N batches instead of by time.

    Raises:
        ConfigError: a bad batch_size, interval or every_n_steps.
    """
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ConfigError(f"batch_size={batch_size!r} must be an int >= 1 (examples per step on this worker)")
    if _number(interval) is None or interval < 0:
        raise ConfigError(f"interval={interval!r} must be a number of seconds >= 0")
    if every_n_steps is not None and (not isinstance(every_n_steps, int) or every_n_steps < 1):
        raise ConfigError(f"every_n_steps={every_n_steps!r} must be an int >= 1, or None to report by time")
    from .._deps import require
    from .profiling import Tracer

    tf = require("tensorflow", "the tfnb Keras progress callback")
    tracer = ctx._tracer if ctx is not None else Tracer(None)  # without profile_steps it traces nothing
    try:  # tf.keras's Callback (tf-keras's also serves Keras 3's fit)
        base = tf.keras.callbacks.Callback
    except (ImportError, AttributeError):  # TF_USE_LEGACY_KERAS=1 without tf-keras installed: Keras 3's
        import keras

        base = keras.callbacks.Callback

    class TfnbProgress(base):
        def __init__(self):
            super().__init__()
            # tf-keras then hands us tensors and skips its per-batch device sync; we convert only what we send
            self._supports_tf_logs = True
            self.epoch, self.epochs, self.steps, self.epochs_begun = 0, None, None, 0
            self._batches = self._done = 0  # batches done in this epoch, in this fit
            self._mark = self._epoch_start = (time.monotonic(), 0)  # (time, _done) at the last rate measurement
            self._last_batch_time = time.monotonic()

        def _send(self, logs, steps_per_sec=None, **fields):
            per_example = steps_per_sec * batch_size if steps_per_sec is not None and batch_size else None
            data = {"epoch": self.epoch + 1, "epochs": self.epochs, "step": self._batches, "steps": self.steps,
                    "steps_per_sec": steps_per_sec, "batch_size": batch_size, "examples_per_sec": per_example, **fields}
            # the logs' numbers (None: not a number, dropped), converted only now that they are sent
            _emit(**data, **{k: _number(v) for k, v in (logs or {}).items() if k not in (*data, "batch", "size")})

        def on_train_begin(self, logs=None):
            self.epochs, self.steps = (self.params or {}).get("epochs"), (self.params or {}).get("steps")
            _emit(epochs=self.epochs, steps=self.steps, batch_size=batch_size)
            if ctx is not None:
                from .resize import join_vote

                join_vote(ctx)  # an elastic run: this worker votes at each epoch start (on_epoch_begin)

        def on_epoch_begin(self, epoch, logs=None):
            if ctx is not None and self.epochs_begun:  # in this fit: the first (maybe resumed) epoch is no boundary
                from .resize import epoch_boundary

                epoch_boundary(ctx, self.model.distribute_strategy, epoch)  # an elastic run that widens stops here
            self.epochs_begun += 1
            self.epoch, self._batches = epoch, 0
            self._mark = self._epoch_start = (time.monotonic(), self._done)

        def on_train_batch_begin(self, batch, logs=None):
            tracer.before_step(self._done + 1)

        def on_train_batch_end(self, batch, logs=None):
            # batch is the index within the epoch; with steps_per_execution > 1 some indices are skipped
            done = batch + 1
            self._done += max(done - self._batches, 0)
            self._batches = done
            tracer.after_step(self._done)
            now = self._last_batch_time = time.monotonic()
            t0, n0 = self._mark
            due = self._done - n0 >= every_n_steps if every_n_steps is not None else now - t0 >= interval
            if not due:
                return
            self._mark = (now, self._done)
            rate = (self._done - n0) / (now - t0) if now > t0 else None
            self._send(logs, steps_per_sec=rate)

        def on_epoch_end(self, epoch, logs=None):
            t0, n0 = self._epoch_start
            # the epoch's rate up to its last batch, leaving validation time out
            dt = self._last_batch_time - t0
            rate = (self._done - n0) / dt if dt > 0 and self._done > n0 else None
            self._send(logs, epoch_end=True, steps_per_sec=rate)

        def on_train_end(self, logs=None):
            tracer.finish(self._done)

    return TfnbProgress()
