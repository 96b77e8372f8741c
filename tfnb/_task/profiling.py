"""Profiler traces of ``tfnb.run(..., profile_steps=(20, 25))`` (docs/monitoring.md, "Profiler"): written to a
local folder (TensorFlow writes only where it can open files), then put into ``log_dir`` through tfnb's storage. A
trace that fails never stops training. Under MultiWorkerMirroredStrategy only the chief traces, never its first step."""
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


def check_profile_steps(profile_steps: Any, log_dir: str | None) -> tuple[int, int] | None:
    """``profile_steps`` as ``(first, last)``, checked on the driver."""
    if profile_steps is None:
        return None
    pair = (profile_steps, profile_steps) if isinstance(profile_steps, int) else profile_steps
    ok = (isinstance(pair, (tuple, list)) and len(pair) == 2
          and all(isinstance(s, int) and not isinstance(s, bool) for s in pair))
    if not ok or not 1 <= pair[0] <= pair[1]:
        hint = f"; did you mean profile_steps=({pair[1]}, {pair[0]})?" if ok and 1 <= pair[1] < pair[0] else ""
        raise ConfigError(f"profile_steps={profile_steps!r} must be (first, last) training steps to trace, "
                          f"counted from 1 with first <= last, e.g. profile_steps=(20, 25){hint}")
    if not log_dir:
        raise ConfigError(f"profile_steps={profile_steps!r} needs log_dir=: each worker's trace goes to "
                          "<log_dir>/plugins/profile/ for TensorBoard; pass log_dir= (a path or URL every "
                          "worker can write) or remove profile_steps")
    return int(pair[0]), int(pair[1])


def collective_role(tf_config: Any) -> str:
    """``"leader"`` or ``"follower"`` when this process runs collectives with other tasks, else ``""``. Stopping
    TensorFlow's profiler can crash a process whose trace holds a collective activity begun on one thread and ended
    on another: a follower's in every step, the leader's in its first (measured: docs/monitoring.md)."""
    from tensorflow.python.eager import context

    leader = getattr(context.context(), "_collective_leader", None)  # set by the strategy, "" when local
    if not leader:
        return ""
    task = (tf_config or {}).get("task") or {}
    return "leader" if leader == f"/job:{task.get('type')}/replica:0/task:{task.get('index')}" else "follower"


class Tracer:
    """One train_fn process's trace (``ctx.profile`` and the progress callback share it)."""

    def __init__(self, ctx: Any):
        self.ctx, self.steps = ctx, getattr(ctx, "profile_steps", None)
        # -> "tracing" -> "done"; or "failed" (said once, never retried); or "off" (a worker left out)
        self.state = "idle"
        self._tmp: str | None = None
        self._first: int | None = None  # the first step this process ran

    def before_step(self, step: int) -> None:
        self._first = self._first or step
        # ">=": with steps_per_execution > 1 Keras skips step numbers
        if self.steps and self.state == "idle" and step >= self.steps[0]:
            self.start(step)

    def after_step(self, step: int) -> None:
        if self.state == "tracing" and step >= self.steps[1]:
            self.stop()

    def finish(self, steps_run: int) -> None:
        """Training ended: ship a trace still running; say why there is none when too few steps ran."""
        if self.state == "tracing":
            self.stop()
        elif self.state == "idle" and self.steps and steps_run < self.steps[0]:
            self.state = "failed"
            log.warning("tfnb: no profiler trace: profile_steps=%s but training ran %d steps; pick steps "
                        "within the run", self.steps, steps_run)

    def start(self, step: int) -> None:
        try:
            if not self.ctx.log_dir:
                raise ConfigError("tfnb.run was given no log_dir; pass log_dir= so the trace has a place")
            import tensorflow as tf

            role = collective_role(self.ctx.tf_config)  # see there why a trace can crash these processes
            if role == "follower":
                self.state = "off"
                if (self.ctx.tf_config or {}).get("task", {}).get("index") == 1:  # one line: the first follower's
                    log.warning("tfnb: only the chief takes a profiler trace: stopping TensorFlow's profiler can "
                                "crash a worker whose collectives another task leads (a defect of its host tracer); "
                                "the chief's trace shows the steps, the progress display every worker's step rate")
                return
            if role == "leader" and step == self._first:
                if self.steps[1] <= step:
                    self.state = "failed"
                    log.warning("tfnb: no profiler trace: profile_steps=%s holds only step %d, where the collectives "
                                "are set up and stopping TensorFlow's profiler can crash the chief; pick steps from %d "
                                "on", self.steps, step, step + 1)
                else:  # idle: the next step starts the trace
                    log.warning("tfnb: the chief traces steps %d-%d, not %d-%d: stopping TensorFlow's profiler after "
                                "the step that sets up the collectives can crash it",
                                step + 1, self.steps[1], *self.steps)
                return
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
        log.warning("tfnb: the profiler trace of steps %d-%d %s (%s: %s); training goes on without it; %s",
                    *self.steps, what, type(e).__name__, e, fix)

    def _cleanup(self) -> None:
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
