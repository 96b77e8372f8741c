"""The driver side of a run: ``tfnb.run`` launches the barrier job, watches it and gives the verdict.

The barrier job is ``spark.range(n, numPartitions=n).mapInArrow(task, barrier=True)`` (or the fed
DataFrame split into n parts), which runs on classic and Spark Connect sessions alike. Tasks talk back
over the run's authenticated channel (logs, progress, failures); only partition 0, the chief, returns a
value. The package's modules, in the order a run meets them: :mod:`.options` (what was asked, resolved
once), :mod:`.spark` (what the cluster can host), :mod:`.resources` (what each task asks Spark for, where the
ps tasks go, whether it fits), :mod:`.attempt` (one launch, watched) and :mod:`.jobs` (its barrier job(s),
ps processes on the driver), :mod:`.verdict`
(what a failure was, and whether a relaunch helps), :mod:`.channel` and :mod:`.runlog` (what the tasks
say, and the file that keeps it); :mod:`.hooks` is the surface add-ons build on.
"""
from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Callable

from .. import _protocol as events
from .._protocol import EventKind, RunEvent
from ..errors import ConfigError, RunTimeoutError, WorkerError, WorkerStalledError
from ..monitor.display import make_display
from .attempt import _Attempt
from .hooks import ArrowSpill, LaunchHooks, pickle_fn
from .options import RunOptions
from .resources import with_profiles
from .spark import (
    _refuse_in_task,
    _wait_for_slots,
    check_cluster,
    check_dirs_shared,
    get_spark,
)

# The launch surface add-ons build on (tfnb.compat uses nothing else of the launcher): documented, kept stable.
__all__ = ["run", "RunOptions", "LaunchHooks", "ArrowSpill", "pickle_fn", "check_cluster", "get_spark",
           "make_display", "RunEvent", "EventKind"]

log = logging.getLogger(__name__)


def run(train_fn: Callable, options: RunOptions | None = None, /, *, hooks: LaunchHooks | None = None,
        **kwargs: Any) -> Any:
    """Run ``train_fn(ctx, *args)`` on a TensorFlow cluster inside one barrier-mode Spark stage.

    Each of the ``num_workers`` (+ ``num_ps``) tasks gets TF_CONFIG, its role and GPUs, then runs
    ``train_fn`` in a fresh Python process, so any number of runs work in one Spark session.
    Logs and progress stream to the notebook as they happen.

    Args:
        train_fn: ``train_fn(ctx: WorkerContext, *args)``; the chief's return value is returned.
        num_workers: chief + worker tasks (>= 1). Without ps tasks this is MultiWorkerMirroredStrategy.
        args: extra positional arguments for ``train_fn`` (must pickle).
        kwargs: keyword arguments for ``train_fn`` (must pickle).
        num_ps: parameter-server tasks; with ps tasks the chief runs the ParameterServerStrategy
            coordinator (``train_fn``), and worker/ps tasks run TensorFlow servers until it finishes.
        spark: the SparkSession (classic or Spark Connect); default: active session or a local one.
        use_gpu: None uses GPUs Spark assigned (``gpus_per_worker``, else spark.task.resource.gpu.amount);
            False hides GPUs; True requires them.
        gpus_per_worker: whole GPUs each chief/worker task asks Spark for in this run (0: none), instead
            of the cluster's spark.task.resource.gpu.amount; ``cpus_per_worker``: likewise CPU cores instead
            of spark.task.cpus. Applied as a Spark task resource profile on the executors already running
            (no restart), where the Spark version and cluster manager support one (standalone from 3.5,
            YARN/Kubernetes from 3.5.1, never local[N]; docs/resources.md); elsewhere refused before launch
            with the conf to set instead. Memory per task is out of reach (executor-level in Spark).
        ps_placement: where the ``num_ps`` parameter servers run. ``"executors"`` (default): on the
            executors; when the workers hold GPUs, as CPU-only tasks of a second barrier job beside the
            workers' (a stage carries one resource profile), so no ps holds a GPU; with CPU workers, in the
            workers' stage as ever. Spark places, cancels and cleans them like any task, and the shared
            driver of a Databricks cluster stays out of the training's memory and network path.
            ``"driver"``: as processes on the driver that tfnb supervises (no Spark slot, but the driver's
            memory, CPU and network; for clusters that cannot run a CPU-only profile).
        timeout: seconds before the run is cancelled (RunTimeoutError). Env: TFNB_TIMEOUT.
        model_dir: checkpoint directory passed to ``ctx.model_dir``; tfnb also writes the run's status
            there (``tfnb_status.json``) so an Evaluator knows when training ended.
        log_dir: TensorBoard directory passed to ``ctx.log_dir``. When executors run on other hosts than
            the driver, ``model_dir`` and ``log_dir`` must be storage every host sees (a URL, ``/Volumes``,
            ``/dbfs``, ``/Workspace``, a network or FUSE mount, or a prefix in TFNB_SHARED_PATHS); a
            driver-local path is refused before launch (not checked on Spark Connect).
        storage_options: options for ``model_dir``/``log_dir`` URLs (``key``, ``secret``, ``token``,
            ``endpoint_url``...; the vocabulary of :mod:`tfnb.storage`); never shown or logged.
        data: a Spark DataFrame split evenly across the workers; read it with ``ctx.dataset(...)``.
        max_attempts: launches at most. tfnb relaunches when a task's process or executor died, when
            train_fn failed because a peer vanished (TensorFlow's UnavailableError and kin from collective
            ops / gRPC) and after a stall; any other exception in train_fn is a bug and is not retried.
            Default 2. Env: TFNB_MAX_ATTEMPTS; TFNB_FAILURE_GRACE (default 3 s) is how long tfnb
            collects the other tasks' reports after a first failure before deciding.
        stall_timeout: seconds a train_fn process may stay alive without sending a progress event or an
            output line before tfnb dumps every worker's Python stack, cancels the job and relaunches
            it (WorkerStalledError on the last attempt). Default "auto": TFNB_STALL_TIMEOUT, else 30
            minutes; None or 0 turns the watchdog off.
        env: extra environment variables for the train_fn processes. It may not set what tfnb sets
            itself (TF_CONFIG, CUDA_VISIBLE_DEVICES, PYTHONUNBUFFERED, TFNB_RUN_ID and tfnb's other
            TFNB_* plumbing, and TF_USE_LEGACY_KERAS unless ``legacy_keras=False``): ConfigError names the
            knob to use instead (``use_gpu=``, ``legacy_keras=``...).
        legacy_keras: set TF_USE_LEGACY_KERAS=1 so ``tf.keras`` is tf-keras (default True), the Keras
            that trains under MultiWorkerMirroredStrategy.
        preimport: modules each train_fn process imports while the tasks exchange addresses,
            hiding their import time (default ``("tensorflow",)``; ``()`` for train_fns without
            TensorFlow). Env: TFNB_PREIMPORT (comma-separated).
        warm: keep per executor a standby process with ``preimport`` imported, from which this run and later
            runs with the same settings fork their train_fn processes, so reruns skip that import (default
            True; ~600 MB per standby with TensorFlow; it exits after TFNB_WARM_IDLE seconds without a run,
            default 600). Env: TFNB_WARM.
        display: a callable receiving every RunEvent; False for none; default: a live widget in
            notebooks, prefixed log lines and a progress line on the console.
        profile_steps: ``(first, last)`` training steps (from 1, across epochs) each worker traces with
            TensorFlow's profiler, from ``ctx.progress_callback()`` or ``ctx.profile(step)``, into
            ``<log_dir>/plugins/profile/<run>/<job_name>-<task_index>.xplane.pb`` (needs ``log_dir``).
        mlflow: True or an experiment name: log the run as one MLflow run from the driver (settings,
            the chief's per-epoch metrics, relaunches, status, the model saved in ``model_dir``);
            see :mod:`tfnb.monitor.tracking`. Needs ``pip install 'tfnb[mlflow]'``.

    The options are the fields of :class:`RunOptions`: pass them as keywords, or a ``RunOptions`` as the
    second argument (keywords override its fields). ``hooks`` (:class:`LaunchHooks`) is the launch surface
    add-ons such as ``tfnb.compat`` build on.

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
    hooks = hooks or LaunchHooks()
    payload = pickle_fn(train_fn, opts.args, opts.kwargs)
    num_workers, num_ps, num_tasks, max_attempts, model_dir = (opts.num_workers, opts.num_ps, opts.num_tasks,
                                                               opts.max_attempts, opts.model_dir)
    spark = get_spark(opts.spark, num_tasks)
    placement = check_cluster(spark, num_tasks, use_gpu=opts.use_gpu, num_ps=num_ps,
                              gpus_per_worker=opts.gpus_per_worker, cpus_per_worker=opts.cpus_per_worker,
                              ps_placement=opts.ps_placement)
    placement = with_profiles(spark, placement)
    check_dirs_shared(spark, model_dir=model_dir, log_dir=opts.log_dir)
    feed = None
    if opts.data is not None and hooks.feeder is None:
        from ..data.feeding import feed_spec

        feed = feed_spec(opts.data)
    sink = make_display(opts.display, num_workers, num_ps, max_attempts)
    run_id = uuid.uuid4().hex[:12]
    deadline = None if opts.timeout is None else time.monotonic() + opts.timeout
    if model_dir:
        from .._status import write_status

        write_status(model_dir, "running", run_id=run_id, attempt=1, attempts=[], storage_options=opts.storage_options)
    if opts.mlflow:
        from ..monitor.tracking import track

        sink = track(sink, opts.mlflow, run_id=run_id, spark=spark, num_workers=num_workers, num_ps=num_ps,
                     max_attempts=max_attempts, args=opts.args, model_dir=model_dir, log_dir=opts.log_dir,
                     timeout=opts.timeout)
    final_state = "failed"
    history: list[dict] = []  # one entry per launch; in the status file and on WorkerError.attempts
    try:
        for attempt in range(1, max_attempts + 1):
            started = time.time()
            spec_kwargs = dict(run_id=run_id, attempt=attempt, max_attempts=max_attempts,
                               num_workers=num_workers, num_ps=num_ps, payload=payload,
                               model_dir=model_dir, log_dir=opts.log_dir, use_gpu=opts.use_gpu,
                               env=opts.env, settings=opts.settings, legacy_keras=opts.legacy_keras,
                               preimport=opts.preimport, feed=feed, hooks=hooks.task,
                               warm=opts.warm, warm_idle=opts.warm_idle, profile_steps=opts.profile_steps,
                               # the profile plugin's run folder: TensorFlow's timestamp format, one per attempt
                               profile_run=time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime(started)),
                               # MultiWorkerMirroredStrategy: no process leaves while a peer may still
                               # need it for a last collective (ps and daemon tasks never "finish")
                               linger=num_tasks > 1 and num_ps == 0 and not hooks.daemon_ranks)
            outcome = _Attempt(spark, spec_kwargs, opts.data, sink, deadline, num_tasks, num_ps,
                               daemon_ranks=hooks.daemon_ranks, cancel=hooks.cancel, grace=opts.failure_grace,
                               stall_timeout=opts.stall_timeout, placement=placement).run()
            entry = {"attempt": attempt, "started": round(started, 3), "seconds": round(time.time() - started, 1),
                     "resumed_epoch": outcome.resumed_epoch}
            history.append(entry)
            if outcome.failure is None:
                final_state = "succeeded"
                entry["outcome"] = "succeeded"
                sink(RunEvent(events.STATE, "driver", 0, {"state": "succeeded", "attempt": attempt, "max_attempts": max_attempts}))
                return outcome.value
            relaunch = outcome.retryable and attempt < max_attempts
            entry.update(outcome="stalled" if outcome.stall else "failed", cause=outcome.cause,
                         retryable=outcome.retryable, epoch=outcome.epoch, relaunched=relaunch)
            if relaunch:
                log.info("tfnb: attempt %d of %d failed: %s; relaunching", attempt, max_attempts, outcome.cause)
                sink(RunEvent(events.ATTEMPT, "driver", 0, {
                    "attempt": attempt + 1, "max_attempts": max_attempts, "reason": outcome.cause,
                    "epoch": outcome.epoch, "retryable": True}))
                if model_dir:
                    from .._status import write_status

                    write_status(model_dir, "running", run_id=run_id, attempt=attempt + 1, attempts=history,
                                 storage_options=opts.storage_options)
                _wait_for_slots(spark, num_tasks, placement, num_ps)
                continue
            sink(RunEvent(events.STATE, "driver", 0, {"state": "failed", "attempt": attempt, "max_attempts": max_attempts}))
            if outcome.error is not None:
                raise outcome.error
            if outcome.stall:
                raise WorkerStalledError(outcome.failure, outcome.others, tuple(history), **outcome.stall)
            raise WorkerError(outcome.failure, outcome.others, tuple(history))
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
        if len(history) < attempt:  # interrupted or timed out mid-attempt
            history.append({"attempt": attempt, "started": round(started, 3),
                            "seconds": round(time.time() - started, 1), "outcome": final_state})
            final_state = "failed" if final_state == "timed out" else final_state
        if model_dir:
            from .._status import write_status

            write_status(model_dir, final_state, run_id=run_id, attempts=history, storage_options=opts.storage_options)


