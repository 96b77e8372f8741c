"""``tfnb.run``: one call on the driver, its launches (attempts) one after another, and what it returns or raises.

Each launch is an :class:`~tfnb.launcher.attempt._Attempt`. Between launches the loop decides: relaunch after bad
luck (a dead process, a lost executor, a stall), up to ``max_attempts`` failed launches; resize an elastic run
(:mod:`tfnb.launcher.elastic`); or raise. Every launch is in the run's history, which the status file in
``model_dir`` and ``WorkerError.attempts`` carry. An interrupt anywhere in the call (the notebook's stop button is a
SIGINT) cancels the run's jobs and raises :class:`~tfnb.errors.RunCancelledError`.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
import uuid
from typing import Any, Callable

from .. import _protocol as events
from .._protocol import RunEvent
from .._config import setting
from ..errors import ConfigError, RunCancelledError, RunTimeoutError, WorkerError, WorkerStalledError
from ..monitor.display import make_display
from .attempt import _Attempt
from .hooks import LaunchHooks, pickle_fn
from .options import RunOptions
from .resources import with_profiles
from .spark import is_connect, _refuse_in_task, _wait_for_slots, check_cluster, check_dirs_shared, get_spark

log = logging.getLogger(__name__)


def run(train_fn: Callable, options: RunOptions | None = None, /, *, hooks: LaunchHooks | None = None,
        **kwargs: Any) -> Any:
    """Run ``train_fn(ctx, *args)`` on a TensorFlow cluster inside one barrier-mode Spark stage.

    Each task gets TF_CONFIG, its role and GPUs, and runs ``train_fn`` in a fresh Python process (so any number of
    runs work in one Spark session); logs and progress stream live.

    Args:
        train_fn: ``train_fn(ctx: WorkerContext, *args)``; the chief's return value is returned.
        num_workers: chief + worker tasks (>= 1). Without ps tasks this is MultiWorkerMirroredStrategy.
        args: extra positional arguments for ``train_fn`` (must pickle).
        kwargs: keyword arguments for ``train_fn`` (must pickle).
        num_ps: parameter-server tasks; the chief then runs the ParameterServerStrategy coordinator
            (``train_fn``), and worker/ps tasks run TensorFlow servers until it finishes.
        spark: the SparkSession (classic or Spark Connect); default: active session or a local one.
        use_gpu: None uses GPUs Spark assigned (``gpus_per_worker``, else spark.task.resource.gpu.amount);
            False hides GPUs; True requires them.
        gpus_per_worker: whole GPUs each chief/worker task asks Spark for in this run (0: none) instead of
            spark.task.resource.gpu.amount; ``cpus_per_worker``: CPU cores instead of spark.task.cpus. A Spark
            task resource profile on the executors already running, where Spark supports one (standalone from
            3.5, YARN/Kubernetes from 3.5.1, never local[N]; docs/resources.md); elsewhere refused before
            launch with the conf to set instead. Memory per task is out of reach (executor-level in Spark).
        ps_placement: ``"executors"`` (default): the ps tasks run on the executors, beside GPU workers as
            CPU-only tasks of a second barrier job (which waits for the other at most TFNB_PS_JOB_WAIT s, default
            300); ``"driver"``: as processes on the driver (no Spark slot, but the driver's memory and network).
        timeout: seconds before the run is cancelled (RunTimeoutError). Env: TFNB_TIMEOUT.
        model_dir: checkpoint directory (``ctx.model_dir``); tfnb also writes the run's status there
            (``tfnb_status.json``) so an Evaluator knows when training ended.
        log_dir: TensorBoard directory (``ctx.log_dir``). When executors run on other hosts, ``model_dir``
            and ``log_dir`` must be storage every host sees (a URL, ``/Volumes``, ``/dbfs``, ``/Workspace``, a
            network or FUSE mount, or a prefix in TFNB_SHARED_PATHS); a driver-local path is refused.
        storage_options: options for ``model_dir``/``log_dir`` URLs (``key``, ``secret``, ``token``,
            ``endpoint_url``...; see :mod:`tfnb.storage`); never shown or logged.
        data: a Spark DataFrame split evenly across the workers; read it with ``ctx.dataset(...)``.
        max_attempts: failed launches at most (default 2, TFNB_MAX_ATTEMPTS). tfnb relaunches after a dead
            process or executor, a vanished peer (TensorFlow's UnavailableError and kin) or a stall; any other
            exception is a bug. TFNB_FAILURE_GRACE (3 s): how long reports are collected after a first failure.
        min_workers: makes the run elastic (MultiWorkerMirroredStrategy, classic sessions): after a lost executor
            with no replacement within ``replace_wait`` s (default 120, TFNB_REPLACE_WAIT), tfnb relaunches from
            the last checkpoint with the workers the executors hold, at least ``min_workers`` (else ClusterError);
            once executors return, it stops at the next epoch boundary (``ctx.progress_callback()`` or
            ``ctx.epoch_boundary()``) and relaunches at ``num_workers``. Resizes are not failed attempts.
        stall_timeout: seconds a train_fn process may stay silent (no progress event, no output line) before
            tfnb dumps every worker's stack, cancels and relaunches (WorkerStalledError on the last attempt).
            Default "auto": TFNB_STALL_TIMEOUT, else 30 minutes; None or 0 turns the watchdog off.
        env: extra environment variables for the train_fn processes; not what tfnb sets itself (TF_CONFIG,
            CUDA_VISIBLE_DEVICES, PYTHONUNBUFFERED, TFNB_RUN_ID and other TFNB_* plumbing, TF_USE_LEGACY_KERAS
            unless ``legacy_keras=False``): ConfigError names the knob to use instead.
        legacy_keras: None (default) sets TF_USE_LEGACY_KERAS=1 where tf-keras is installed (``tf.keras`` is
            tf-keras); True always, False never. ``import keras`` is Keras 3 either way (docs/keras3.md).
        preimport: modules each train_fn process imports while the tasks exchange addresses (default
            ``("tensorflow",)``; ``()`` without TensorFlow). Env: TFNB_PREIMPORT (comma-separated).
        warm: keep per executor a standby process with ``preimport`` imported, from which runs with the same
            settings fork train_fn (default True, TFNB_WARM; ~600 MB with TensorFlow; exits after TFNB_WARM_IDLE s).
        display: a callable receiving every RunEvent; False for none; default: a live widget in
            notebooks, prefixed log lines and a progress line on the console.
        profile_steps: ``(first, last)`` training steps (from 1, across epochs) each worker traces with
            TensorFlow's profiler into ``<log_dir>/plugins/profile/<run>/<job_name>-<task_index>.xplane.pb``
            (needs ``log_dir``); under MultiWorkerMirroredStrategy the chief alone, from its second step
            (docs/monitoring.md, "Profiler").
        mlflow: True, an experiment name, or a dict (``experiment``, ``registered_model_name``,
            ``input_example``): log the run as one MLflow run from the driver (settings, the chief's per-epoch
            metrics, relaunches, status, the model in ``model_dir`` with a signature, registered when named);
            see :mod:`tfnb.monitor.tracking`. Needs ``pip install 'tfnb[mlflow]'``.

    The options are the fields of :class:`RunOptions`: keywords, or a ``RunOptions`` as the second argument
    (keywords override its fields). ``hooks`` (:class:`LaunchHooks`) is the surface add-ons build on.

    Returns:
        What ``train_fn`` returned on the chief.

    Raises:
        ConfigError: bad arguments (message names the fix), also a driver-local ``model_dir``/``log_dir``
            on a multi-host cluster, or a call from inside train_fn or a Spark task.
        ClusterError: the cluster cannot host the run (slots, GPUs, dynamic allocation, a per-run request
            this Spark or master cannot attach), or tfnb cannot start on an executor (not installed, or
            another version than the driver's); never relaunched.
        WorkerError: train_fn failed on a worker; carries task index, exception type, worker traceback
            and the history of attempts (``.attempts``).
        WorkerStalledError: a worker stalled on the last attempt; carries its stack and last step.
        RunTimeoutError: ``timeout`` ran out.
        RunCancelledError: interrupted (a KeyboardInterrupt subclass).

    Example:
        >>> def train_fn(ctx, epochs):
        ...     import tensorflow as tf
        ...     strategy = tf.distribute.MultiWorkerMirroredStrategy()
        ...     with strategy.scope():
        ...         model = build_model()
        ...     model.fit(make_dataset(ctx), epochs=epochs)
        ...     return model.evaluate(val_ds, return_dict=True)
        >>> metrics = tfnb.run(train_fn, num_workers=2, args=(3,))
        >>> tfnb.run(train_fn, num_workers=2, args=(3,), gpus_per_worker=2)  # this run: 2 GPUs per worker
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
            # an interrupt outside an attempt's watch (checks, a relaunch's wait, the status file): nothing of the
            # run is left running there (an attempt stops its own tasks before it returns)
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
        # seconds for executors to register before a launch is judged too big, resolved once for the run
        self.slot_wait = setting("slot_wait", None, 30.0, float)
        placement = check_cluster(self.spark, first, self.slot_wait, use_gpu=opts.use_gpu, num_ps=opts.num_ps,
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
        self._told_no_boundary = False  # that a resize could not happen (_no_boundary): said once a run

    def _status(self, state: str, **info: Any) -> None:
        if self.opts.model_dir:
            from .._status import write_status

            write_status(self.opts.model_dir, state, run_id=self.run_id, attempts=self.history,
                         storage_options=self.opts.storage_options, **info)

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
        size = self._size(opts.min_workers or opts.num_workers, self.slot_wait)
        sink = self.sink = make_display(opts.display, size, opts.num_ps, opts.max_attempts)
        self._status("running", attempt=1)
        if opts.mlflow:
            from ..monitor.tracking import track

            sink = self.sink = track(sink, opts.mlflow, run_id=self.run_id, spark=self.spark, num_workers=size,
                                     num_ps=opts.num_ps, max_attempts=opts.max_attempts, args=opts.args,
                                     model_dir=opts.model_dir, log_dir=opts.log_dir, timeout=opts.timeout, options=opts)
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
                previous, upcoming = size, None
                if outcome.resize or (outcome.retryable and self.elastic):
                    upcoming = self._relaunch_size(size)  # ClusterError below min_workers
                shrinks = upcoming is not None and upcoming != size  # a resize, not a failed launch
                failures += not (outcome.resize or shrinks)
                relaunch = outcome.resize or (outcome.retryable and (failures < opts.max_attempts or shrinks))
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
                size = upcoming if upcoming is not None else self._relaunch_size(size)
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

    def _relaunch_size(self, size: int) -> int:
        """After a launch that ended for a relaunch: how many workers the next one gets."""
        opts = self.opts
        if self.elastic:  # at once when the whole run fits (executors returned), else after replace_wait
            return self._size(opts.min_workers, opts.replace_wait)
        _wait_for_slots(self.spark, opts.num_tasks, self.placement, opts.num_ps, self.slot_wait)
        return size

    def _launch(self, attempt: int, size: int, resized_from: int | None, started: float):
        opts, hooks, num_tasks = self.opts, self.hooks, size + self.opts.num_ps
        spec_kwargs = dict(run_id=self.run_id, attempt=attempt, max_attempts=opts.max_attempts,
                           num_workers=size, requested_workers=opts.num_workers, resized_from=resized_from,
                           min_workers=opts.min_workers,
                           num_ps=opts.num_ps, payload=self.payload, model_dir=opts.model_dir, log_dir=opts.log_dir,
                           use_gpu=opts.use_gpu, env=opts.env, settings=opts.settings, legacy_keras=opts.legacy_keras,
                           preimport=opts.preimport, feed=self.feed, hooks=hooks.task,
                           warm=opts.warm, warm_idle=opts.warm_idle, profile_steps=opts.profile_steps,
                           # the profile plugin's run folder: TensorFlow's timestamp format, one per attempt
                           profile_run=time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime(started)),
                           # MultiWorkerMirroredStrategy: no process leaves while a peer may still
                           # need it for a last collective (ps and daemon tasks never "finish")
                           linger=num_tasks > 1 and opts.num_ps == 0 and not hooks.daemon_ranks)
        resize = threading.Event() if self.elastic else None
        launch = _Attempt(self.spark, spec_kwargs, opts.data, self.sink, self.deadline, num_tasks, opts.num_ps,
                          daemon_ranks=hooks.daemon_ranks, cancel=hooks.cancel, grace=opts.failure_grace,
                          stall_timeout=opts.stall_timeout, placement=self.placement,
                          ps_job_wait=opts.ps_job_wait, resize=resize)
        watch = contextlib.nullcontext()
        if resize is not None:
            from .elastic import Watch

            watch = Watch(self.spark, self.placement, opts.num_ps, size, opts.num_workers, resize.set, tag=launch.tag)
        with watch:
            outcome = launch.run()
        self.resized_because = getattr(watch, "why", None) or "resized"
        if launch.resizing and not launch.voters:
            self._no_boundary(size, launch)
        return outcome

    def _no_boundary(self, size: int, launch) -> None:
        """Once a run: a resize was asked, but no worker's train_fn takes part in the epoch-boundary vote, so the
        launch ran on at its size."""
        if self._told_no_boundary:
            return
        self._told_no_boundary = True
        why = self.resized_because
        if why == "executors returned":
            what = f"grow back to {self.opts.num_workers} workers when executors returned, and went on with {size}"
        else:  # "executor N leaving (decommission notice)"
            what = f"move off {why.replace(' leaving', ' before it leaves')}"
        text = (f"tfnb: the run could not {what}: train_fn never reached an epoch boundary tfnb can stop it at. Add "
                "ctx.progress_callback() to model.fit(callbacks=[...]) on every worker (a custom loop: call "
                "ctx.epoch_boundary(strategy, epoch) at the start of each epoch after the first)")
        log.warning("%s", text)
        from .runlog import RunLog

        runlog = RunLog(launch.runlog.path)  # the launch's own is closed by now
        runlog.note(text[len("tfnb: "):])
        runlog.close()
        self.sink(RunEvent(events.LOG, "driver", 0, {"stream": "stderr", "line": text}))
