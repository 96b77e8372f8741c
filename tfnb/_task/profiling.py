"""Profiler traces from inside train_fn: the steps of ``tfnb.run(profile_steps=...)``, one trace per worker."""
from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import tempfile
from typing import Any

from ..errors import ConfigError

log = logging.getLogger(__name__)

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
            from ..storage import open_store

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
