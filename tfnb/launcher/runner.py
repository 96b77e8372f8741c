"""``tfnb.run``: one call on the driver, its launches (:class:`~tfnb.launcher.attempt._Attempt`) one after
another, and between them the decision: relaunch, resize an elastic run, or raise.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
import uuid
from dataclasses import fields
from typing import Any, Callable

from .. import _protocol as events
from .._protocol import RunEvent
from .._task.setup import TaskHooks
from ..errors import ConfigError, RunCancelledError, RunTimeoutError, WorkerError, WorkerStalledError, summary
from ..monitor.display import make_display
from .attempt import _Attempt
from .hooks import LaunchHooks, pickle_fn
from .options import RunOptions
from .resources import check_fit, with_profiles
from .spark import is_connect, _refuse_in_task, check_cluster, check_dirs_shared, get_spark

log = logging.getLogger(__name__)
# the RunOptions fields every task gets as they are (tfnb._task.setup.TaskSpec)
_SPEC_OPTIONS = ("max_attempts", "min_workers", "num_ps", "model_dir", "log_dir", "use_gpu", "env", "settings",
                 "legacy_keras", "preimport", "warm", "warm_idle", "profile_steps")


def run(train_fn: Callable, options: RunOptions | None = None, /, *, hooks: LaunchHooks | None = None,
        **kwargs: Any) -> Any:
    """Run ``train_fn(ctx, *args, **kwargs)`` on a TensorFlow cluster inside one barrier-mode Spark stage.

    Each task gets TF_CONFIG, its role and GPUs, and runs ``train_fn`` in a fresh Python process (so any number of
    runs work in one Spark session); logs and progress stream live. The guide: docs/launcher.md.

    Args:
        train_fn: ``train_fn(ctx: WorkerContext, *args, **kwargs)``; the chief's return value is returned.
        options: a :class:`RunOptions` (reusable); keywords of the call override its fields.
        hooks: a :class:`~tfnb.launcher.LaunchHooks`, the surface add-ons build on.
        num_workers: chief + worker tasks (>= 1). Without ps tasks this is MultiWorkerMirroredStrategy.
        args: extra positional arguments for ``train_fn``; ``kwargs``: keyword arguments (both must pickle).
        num_ps: parameter-server tasks; the chief then runs the ParameterServerStrategy coordinator.
        spark: the SparkSession (classic or Spark Connect); default: the active session or a local one.
        use_gpu: None uses the GPUs Spark assigned; False hides GPUs; True requires them.
        gpus_per_worker: whole GPUs per chief/worker task for this run; ``cpus_per_worker``: CPU cores. Through a
            Spark task resource profile where Spark runs one, else refused with the conf to set (docs/resources.md).
        ps_placement: ``"executors"`` (default) or ``"driver"`` (docs/resources.md, "Parameter servers").
        timeout: seconds before the run is cancelled (RunTimeoutError). Env: TFNB_TIMEOUT.
        model_dir: checkpoint directory (``ctx.model_dir``); the run's status goes there (``tfnb_status.json``).
        log_dir: TensorBoard directory (``ctx.log_dir``). On a multi-host cluster both must be storage every host
            sees (a URL, ``/Volumes``, ``/dbfs``, a network mount, a prefix in TFNB_SHARED_PATHS).
        storage_options: options for ``model_dir``/``log_dir`` URLs (see :mod:`tfnb.storage`); never shown or logged.
        data: a Spark DataFrame split evenly across the workers; read it with ``ctx.dataset(...)`` (docs/data.md).
        max_attempts: failed launches at most (default 2, TFNB_MAX_ATTEMPTS); a dead process or executor, a lost
            peer or a stall is relaunched, any other exception is a bug (docs/launcher.md, "Recovery").
        min_workers: makes the run elastic, with ``replace_wait`` (docs/launcher.md, "Elastic runs").
        stall_timeout: seconds a train_fn process may stay silent before the run is relaunched (default
            TFNB_STALL_TIMEOUT, else 30 minutes; None or 0: no watchdog).
        env: extra environment variables for the train_fn processes, not those tfnb sets itself.
        legacy_keras: TF_USE_LEGACY_KERAS=1 with tf-keras present (None), always (True), never (False) (docs/keras3.md).
        preimport: modules each train_fn process imports while the tasks meet (default ``("tensorflow",)``).
        warm: keep a standby process per executor to fork later runs from (docs/launcher.md, "Warm reruns").
        display: a callable receiving every RunEvent, or False; default: a widget in notebooks, else the console.
        profile_steps: ``(first, last)`` training steps to trace (docs/monitoring.md, "Profiler"; needs log_dir).
        mlflow: True, an experiment name, or a dict: log the run to MLflow (docs/monitoring.md, "MLflow").

    Returns:
        What ``train_fn`` returned on the chief.

    Raises:
        ConfigError: a bad option (the message names the fix), a driver-local ``model_dir``/``log_dir`` on a
            multi-host cluster, or a call from inside train_fn or a Spark task.
        ClusterError: the cluster cannot host the run, or tfnb cannot start on an executor; never relaunched.
        WorkerError: train_fn failed on a worker; carries the task, its traceback and ``.attempts``.
        WorkerStalledError: a worker stalled on the last attempt; carries its stack and last step.
        RunTimeoutError: ``timeout`` ran out.
        RunCancelledError: interrupted (a KeyboardInterrupt subclass).

    Example:
        >>> metrics = tfnb.run(train_fn, num_workers=2, args=(3,), model_dir="/Volumes/main/default/tfnb/run1")
    """
    _refuse_in_task("tfnb.run")
    if not callable(train_fn):
        raise ConfigError(f"train_fn must be a function taking (ctx, *args), got {type(train_fn).__name__}")
    opts = RunOptions.resolve(options, **kwargs)
    with _interrupt_is_cancel():
        try:
            return _Run(train_fn, opts, hooks or LaunchHooks()).run()
        except KeyboardInterrupt as e:
            if isinstance(e, RunCancelledError):
                raise
            # an attempt stops its own tasks before it lets an interrupt through; elsewhere nothing of the run runs
            raise RunCancelledError("tfnb.run was interrupted; the Spark job was cancelled and every process it "
                                    "started was stopped") from None


@contextlib.contextmanager
def _interrupt_is_cancel():
    """SIGINT raises KeyboardInterrupt where the run can handle it: pyspark's own handler (installed with the
    SparkContext) would first cancel every job of the session, other threads' runs too, from inside the signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _Run:
    """One tfnb.run: the checks before launch, the launches, the history, the status file."""

    def __init__(self, train_fn: Callable, opts: RunOptions, hooks: LaunchHooks):
        self.opts, self.hooks = opts, hooks
        self.payload = pickle_fn(train_fn, opts.args, opts.kwargs)
        self.spark = get_spark(opts.spark, opts.num_tasks)
        if opts.min_workers is not None and is_connect(self.spark):
            raise ConfigError(f"min_workers={opts.min_workers} needs a classic SparkSession: a Spark Connect client "
                              "cannot see the executors an elastic run sizes itself by; leave min_workers out")
        self.elastic = opts.min_workers is not None
        first = (opts.min_workers if self.elastic else opts.num_workers) + opts.num_ps
        placement = check_cluster(self.spark, first, opts.slot_wait, use_gpu=opts.use_gpu, num_ps=opts.num_ps,
                                  gpus_per_worker=opts.gpus_per_worker, cpus_per_worker=opts.cpus_per_worker,
                                  ps_placement=opts.ps_placement)
        self.placement = with_profiles(self.spark, placement)
        check_dirs_shared(self.spark, model_dir=opts.model_dir, log_dir=opts.log_dir)
        self.feed = None
        if opts.data is not None and hooks.feeder is None:
            from ..data.feeding import feed_spec

            self.feed = feed_spec(opts.data)
        self.run_id = uuid.uuid4().hex[:12]
        self.deadline = None if opts.timeout is None else time.monotonic() + opts.timeout
        self.history: list[dict] = []  # one entry per launch; in the status file and on WorkerError.attempts
        self.mlflow_run_id: str | None = None  # in the status file, for an Evaluator of model_dir
        self._status_lock = threading.Lock()  # the MLflow thread writes it too (_mlflow_started)
        self._told_no_boundary = False  # that a resize could not happen: said once a run

    def _status(self, state: str, **info: Any) -> None:
        if self.opts.model_dir:
            from .._status import write_status

            with self._status_lock:
                write_status(self.opts.model_dir, state, run_id=self.run_id, attempts=self.history,
                             mlflow_run_id=self.mlflow_run_id, storage_options=self.opts.storage_options, **info)

    def _mlflow_started(self, mlflow_run_id: str) -> None:  # in the MLflow thread: a failure here stops nothing
        self.mlflow_run_id = mlflow_run_id
        try:
            self._status("running", attempt=len(self.history) + 1)
        except Exception as e:  # noqa: BLE001 - the next status write records it
            log.warning("could not write MLflow run %s into %s's status file (%s); an Evaluator of model_dir learns "
                        "it at the run's next status write", mlflow_run_id, self.opts.model_dir, summary(e, 320))

    def _size(self, minimum: int, wait: float) -> int:
        """The next launch's number of workers: the run's own, or what an elastic run's executors hold."""
        opts = self.opts
        if not self.elastic:
            return opts.num_workers
        from .elastic import next_size

        return next_size(self.spark, self.placement, opts.num_ps, opts.num_workers, minimum, wait,
                         lambda: self.hooks.cancel is not None and self.hooks.cancel.is_set())

    def run(self) -> Any:
        opts = self.opts
        size = self._size(opts.min_workers or opts.num_workers, opts.slot_wait)
        sink = self.sink = make_display(opts.display, size, opts.num_ps, opts.max_attempts)
        self._status("running", attempt=1)
        if opts.mlflow:
            from ..monitor.tracking import Tracker

            sink = self.sink = Tracker(sink, opts, run_id=self.run_id, spark=self.spark, num_workers=size,
                                       on_start=self._mlflow_started)
        final_state, attempt, failures, resized_from = "failed", 0, 0, None
        try:
            while True:
                attempt += 1
                started = time.time()
                outcome = self._launch(attempt, size, resized_from, started)
                entry = {"attempt": attempt, "started": round(started, 3), "seconds": round(time.time() - started, 1),
                         "resumed_epoch": outcome.resumed_epoch, "workers": size}
                self.history.append(entry)
                if outcome.failure is None:
                    final_state = entry["outcome"] = "succeeded"
                    sink(RunEvent(events.STATE, "driver", 0, {"state": "succeeded", "attempt": attempt,
                                                              "max_attempts": opts.max_attempts}))
                    return outcome.value
                previous = size
                if self.elastic and (outcome.resize or outcome.retryable):
                    size = self._size(opts.min_workers, opts.replace_wait)  # ClusterError below min_workers
                failures += not (outcome.resize or size != previous)  # a resize, not a failed launch
                relaunch = outcome.resize or (outcome.retryable and (failures < opts.max_attempts or size != previous))
                entry.update(outcome="resized" if outcome.resize else "stalled" if outcome.stall else "failed",
                             cause=self.resized_because if outcome.resize else outcome.cause,
                             retryable=outcome.retryable or outcome.resize, epoch=outcome.epoch, relaunched=relaunch)
                if not relaunch:
                    sink(RunEvent(events.STATE, "driver", 0, {"state": "failed", "attempt": attempt,
                                                              "max_attempts": opts.max_attempts}))
                    if outcome.error is not None:
                        raise outcome.error
                    if outcome.stall:
                        raise WorkerStalledError(outcome.failure, outcome.others, tuple(self.history), **outcome.stall)
                    raise WorkerError(outcome.failure, outcome.others, tuple(self.history))
                if not self.elastic:  # let a lost executor's replacement register (else Spark waits its 15 s check)
                    try:
                        check_fit(self.spark, self.placement, size, opts.num_ps, "as before", opts.slot_wait)
                    except Exception as e:  # noqa: BLE001 - the relaunch itself reports a cluster that cannot host it
                        log.debug("slot check before relaunch failed: %s", e)
                reason = self.resized_because if outcome.resize else outcome.cause
                if size != previous:
                    why = "executors returned" if size > previous else \
                        f"{reason if outcome.resize else 'executor lost'}, no replacement in {opts.replace_wait:g} s"
                    entry["resize"] = {"from": previous, "to": size, "why": why}
                    resized = f"resized {previous} → {size} workers ({why})"
                    reason = resized if outcome.resize else f"{reason}; {resized}"
                log.info("tfnb: launch %d ended: %s; relaunching", attempt, reason)
                sink(RunEvent(events.ATTEMPT, "driver", 0, {
                    "attempt": attempt + 1, "max_attempts": opts.max_attempts, "reason": reason,
                    "epoch": outcome.epoch, "retryable": True, "workers": size,
                    **({"resize": entry["resize"]} if "resize" in entry else {})}))
                self._status("running", attempt=attempt + 1)
                resized_from = previous if size != previous else None
        except KeyboardInterrupt:
            final_state = "cancelled"
            raise
        except RunTimeoutError:
            final_state = "timed out"  # only in the history: the status file's state stays "failed"
            raise
        finally:
            close = getattr(sink, "close", None)
            if close:
                close()
            if len(self.history) < attempt:  # interrupted or timed out mid-attempt
                self.history.append({"attempt": attempt, "started": round(started, 3),
                                     "seconds": round(time.time() - started, 1), "outcome": final_state})
                final_state = "failed" if final_state == "timed out" else final_state
            self._status(final_state)

    def _launch(self, attempt: int, size: int, resized_from: int | None, started: float):
        opts, hooks = self.opts, self.hooks
        spec_kwargs = dict({name: getattr(opts, name) for name in _SPEC_OPTIONS},
                           run_id=self.run_id, attempt=attempt, num_workers=size, requested_workers=opts.num_workers,
                           resized_from=resized_from, payload=self.payload, feed=self.feed,
                           hooks=TaskHooks(**{f.name: getattr(hooks, f.name) for f in fields(TaskHooks)}),
                           # the profile plugin's run folder: TensorFlow's timestamp format, one per attempt
                           profile_run=time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime(started)),
                           # MultiWorkerMirroredStrategy: no process leaves while a peer may still
                           # need it for a last collective (ps and daemon tasks never "finish")
                           linger=size > 1 and opts.num_ps == 0 and not hooks.daemon_ranks)
        resize = threading.Event() if self.elastic else None
        launch = _Attempt(self.spark, spec_kwargs, opts, hooks, self.sink, self.deadline, placement=self.placement,
                          resize=resize)
        watch = contextlib.nullcontext()
        if resize is not None:
            from .elastic import Watch

            watch = Watch(self.spark, self.placement, opts.num_ps, size, opts.num_workers, resize.set, tag=launch.tag)
        with watch:
            outcome = launch.run()
        self.resized_because = getattr(watch, "why", None) or "resized"
        if launch.resizing and not launch.voters and not self._told_no_boundary:  # said once a run
            self._told_no_boundary = True
            why = self.resized_because
            what = (f"grow back to {opts.num_workers} workers when executors returned, and went on with {size}"
                    if why == "executors returned" else f"move off {why.replace(' leaving', ' before it leaves')}")
            text = (f"the run could not {what}: train_fn never reached an epoch boundary tfnb can stop it at. Add "
                    "ctx.progress_callback() to model.fit(callbacks=[...]) on every worker (a custom loop: call "
                    "ctx.epoch_boundary(strategy, epoch) at the start of each epoch after the first)")
            log.warning("tfnb: %s", text)
            from .runlog import RunLog

            with contextlib.closing(RunLog(launch.runlog.path)) as runlog:  # the launch's own is closed by now
                runlog.note(text)
            self.sink(RunEvent(events.LOG, "driver", 0, {"stream": "stderr", "line": f"tfnb: {text}"}))
        return outcome
