"""Profiler traces of a tfnb run (``tfnb.run(..., profile_steps=(20, 25))``; README, "Profiling").

Each train_fn process traces the steps (counted from 1 across epochs, both included, as Keras'
``profile_batch``) from ``ctx.progress_callback()`` or ``ctx.profile(step)``, and the trace lands at
``<log_dir>/plugins/profile/<run>/<role>-<index>.xplane.pb``: ``<run>`` is the attempt's start time
in TensorFlow's own format (the newest sorts first), and the task's name (``chief-0``, ``worker-1``)
makes TensorBoard's Profile tab show one host per worker even when they share a machine.
TensorFlow names its file after the hostname and writes only to paths it can open itself, so the
trace goes to a private local folder first, then through tfnb's storage layer. A trace that cannot
be taken or written never stops training: the process says so once, in one log line.
"""
from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import tempfile
from typing import Any

from .errors import ConfigError

log = logging.getLogger(__name__)


def check_profile_steps(profile_steps: Any, log_dir: str | None) -> tuple[int, int] | None:
    """``profile_steps`` as ``(first, last)``, checked on the driver before anything is launched.

    Raises:
        ConfigError: not a step or a pair of steps >= 1 in order, or no ``log_dir`` to write to.
    """
    if profile_steps is None:
        return None
    pair = (profile_steps, profile_steps) if isinstance(profile_steps, int) else profile_steps
    ok = (isinstance(pair, (tuple, list)) and len(pair) == 2
          and all(isinstance(s, int) and not isinstance(s, bool) for s in pair))
    if not ok or not 1 <= pair[0] <= pair[1]:
        hint = (f"; did you mean profile_steps=({pair[1]}, {pair[0]})?" if ok and 1 <= pair[1] < pair[0]
                else "")
        raise ConfigError(f"profile_steps={profile_steps!r} must be (first, last) training steps to trace, "
                          f"counted from 1 with first <= last, e.g. profile_steps=(20, 25){hint}")
    if not log_dir:
        raise ConfigError(f"profile_steps={profile_steps!r} needs log_dir=: each worker's trace goes to "
                          "<log_dir>/plugins/profile/ for TensorBoard; pass log_dir= (a path or URL every "
                          "worker can write) or remove profile_steps")
    return int(pair[0]), int(pair[1])


class Tracer:
    """One train_fn process's trace: started at the first profiled step, shipped after the last.

    ``ctx.profile`` and the Keras progress callback share the context's tracer, so a process takes
    one trace whichever of them drives it.
    """

    def __init__(self, ctx: Any):
        self.ctx = ctx
        self.steps = getattr(ctx, "profile_steps", None)
        self.state = "idle"  # -> "tracing" -> "done", or "failed" (said once, never retried)
        self._tmp: str | None = None

    def before_step(self, step: int) -> None:
        # ">=": with steps_per_execution > 1 Keras skips step numbers
        if self.steps and self.state == "idle" and step >= self.steps[0]:
            self.start()

    def after_step(self, step: int) -> None:
        if self.state == "tracing" and self.steps and step >= self.steps[1]:
            self.stop()

    def finish(self, steps_run: int) -> None:
        """Training ended: ship a trace still running; say why there is none when too few steps ran."""
        if self.state == "tracing":
            self.stop()
        elif self.state == "idle" and self.steps and steps_run < self.steps[0]:
            self.state = "failed"
            log.warning("tfnb: no profiler trace: profile_steps=%s but training ran %d steps; pick steps "
                        "within the run", self.steps, steps_run)

    def start(self) -> None:
        try:
            if not self.ctx.log_dir:
                raise ConfigError("tfnb.run was given no log_dir; pass log_dir= so the trace has a place")
            import tensorflow as tf

            self._tmp = tempfile.mkdtemp(prefix="tfnb-profile-", dir=self.ctx.local_dir or None)
            tf.profiler.experimental.start(self._tmp)
            self.state = "tracing"
        except Exception as e:  # noqa: BLE001 - a trace must never stop training
            self._failed("could not start", e, "check that no other profiler runs at the same time "
                         "(e.g. TensorBoard(profile_batch=...)) and that the worker's disk is writable")

    def stop(self) -> None:
        try:
            import tensorflow as tf

            self.state = "failed"  # until shipped; TensorFlow's stop() ends the session even when it raises
            tf.profiler.experimental.stop()
            found = glob.glob(os.path.join(self._tmp, "plugins", "profile", "*", "*.xplane.pb"))
            if len(found) != 1:
                raise RuntimeError(f"the profiler wrote {len(found)} trace files, expected 1")
            from ._storage import open_store

            ctx = self.ctx
            with contextlib.closing(open_store(ctx.log_dir, purpose="writing a profiler trace to")) as store:
                store.put(f"plugins/profile/{ctx.profile_run}/{ctx.job_name}-{ctx.task_index}.xplane.pb", found[0])
            self.state = "done"
        except Exception as e:  # noqa: BLE001 - a trace must never stop training
            self._failed("was not written", e, "check that log_dir is writable from every worker "
                         "(path, permissions, storage credentials in env=)")
        finally:
            self._cleanup()

    def _failed(self, what: str, e: Exception, fix: str) -> None:
        self.state = "failed"
        self._cleanup()
        steps = f" of steps {self.steps[0]}-{self.steps[1]}" if self.steps else ""
        log.warning("tfnb: the profiler trace%s %s (%s: %s); training goes on without it; %s",
                    steps, what, type(e).__name__, e, fix)

    def _cleanup(self) -> None:
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
