"""WorkerContext: what ``train_fn`` receives in each task of a tfnb run."""
from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterator, Mapping


@dataclass(frozen=True)
class WorkerContext:
    """The task's place in the TensorFlow cluster, passed as ``train_fn(ctx, *args)``. TF_CONFIG is already set from
    ``tf_config``, so ``tf.distribute.MultiWorkerMirroredStrategy()`` needs no arguments.

    Attributes:
        task_index: the worker's rank, 0..num_workers-1 (0 is the chief); for a ps task, its ps index.
            Use it with ``num_workers`` to pick a distinct data shard.
        num_workers: number of chief + worker tasks (ps tasks not counted).
        num_ps: number of parameter-server tasks.
        job_name: ``"chief"``, ``"worker"`` or ``"ps"``.
        cluster_spec: ``{"worker": ["host:port", ...]}``, with ``"chief"`` and ``"ps"`` keys when ``num_ps > 0``.
        tf_config: the TF_CONFIG dict set for this task.
        gpus: GPU ids Spark assigned to this task (CUDA_VISIBLE_DEVICES is set from them); empty on CPU.
        model_dir: checkpoint/model directory given to ``tfnb.run`` (or None).
        log_dir: TensorBoard log directory given to ``tfnb.run`` (or None).
        attempt: 1 on the first launch, 2.. when tfnb relaunched the job after a task died (or resized it).
        requested_workers: the ``num_workers`` the run was asked for; an elastic run may launch with fewer.
        min_workers: the fewest workers an elastic run goes on with; None when the run is not elastic.
        resized_from: the previous launch's number of workers when this launch has another, else None.
        max_attempts: how many launches tfnb will make at most.
        run_id: identifies this ``tfnb.run`` call (the same across attempts).
        host: this task's host address as its peers see it.
        local_dir: a scratch directory on the executor's disk, removed when the task ends.
        feed: internal description of the DataFrame partition fed to this task (see ``dataset``).
        profile_steps: ``(first, last)`` training steps to trace (``tfnb.run(profile_steps=...)``), or None.
        profile_run: the profile plugin's run folder for this attempt's traces (see ``profile``).
        settings: the driver's ``TFNB_*`` settings as ``(name, value)`` pairs, which tfnb calls inside train_fn use.
    """

    task_index: int
    num_workers: int
    job_name: str
    cluster_spec: Mapping[str, list]
    tf_config: Mapping[str, Any]
    num_ps: int = 0
    gpus: tuple = ()
    model_dir: str | None = None
    log_dir: str | None = None
    attempt: int = 1
    max_attempts: int = 1
    run_id: str = ""
    host: str = ""
    local_dir: str = ""
    feed: Any = field(default=None, repr=False)
    profile_steps: tuple | None = None
    profile_run: str = ""
    settings: tuple = field(default=(), repr=False)
    requested_workers: int = 0
    min_workers: int | None = None
    resized_from: int | None = None

    def __post_init__(self):
        if not self.requested_workers:
            object.__setattr__(self, "requested_workers", self.num_workers)

    @property
    def is_chief(self) -> bool:
        """True on the one task that should save models, write summaries and return the result."""
        return self.job_name == "chief"

    @property
    def is_retry(self) -> bool:
        return self.attempt > 1

    def dataset(self, batch_size: int, **kwargs):
        """This worker's part of ``tfnb.run(..., data=df)`` as a tf.data.Dataset, the same number of batches on every
        worker (keyword arguments: :func:`tfnb._task.dataset.worker_dataset`; guide: docs/data.md).

        Example:
            >>> ds = ctx.dataset(batch_size=64, label_col="label", strategy=strategy)
            >>> model.fit(ds, epochs=3, steps_per_epoch=ctx.steps_per_epoch(64))
        """
        from .dataset import worker_dataset

        return worker_dataset(self, batch_size, **kwargs)

    def steps_per_epoch(self, batch_size: int) -> int:
        """Batches per epoch that every worker can serve for ``batch_size`` (the same on all workers)."""
        from .dataset import steps_per_epoch

        return steps_per_epoch(self, batch_size)

    def report(self, **metrics: Any) -> None:
        """Send metrics (e.g. ``step=, loss=``) to the driver's live progress display."""
        from .._protocol import EventKind
        from .events import emit

        emit(EventKind.PROGRESS, **metrics)

    def progress_callback(self, **kwargs: Any):
        """A Keras callback reporting to the driver's progress display (keyword arguments:
        :func:`tfnb._task.callbacks.keras_callback`)."""
        from .callbacks import keras_callback

        return keras_callback(self, **kwargs)

    @contextmanager
    def profile(self, step: int) -> Iterator[None]:
        """Wrap one step of a custom training loop: traces the steps of ``tfnb.run(profile_steps=...)`` into
        ``<log_dir>/plugins/profile/`` (docs/monitoring.md); ``ctx.progress_callback()`` does it for ``fit``.

        Args:
            step: this step's number, counted from 1.

        Example:
            >>> for step in range(1, steps + 1):
            ...     with ctx.profile(step):
            ...         train_step(next(iterator))
        """
        tracer = self._tracer
        tracer.before_step(step)
        if tracer.state == "tracing":
            import tensorflow as tf

            with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
                yield
        else:
            yield
        tracer.after_step(step)

    @cached_property
    def _tracer(self):
        # shared with the progress callback; cached_property writes __dict__, which a frozen dataclass allows
        from .profiling import Tracer

        return Tracer(self)

    def epoch_boundary(self, strategy: Any = None, epoch: int | None = None) -> None:
        """In an elastic run's custom loop, call at each epoch start after the first, on every worker, once the last
        checkpoint is written: when the run is resized it raises a ``BaseException`` on every worker (let it
        propagate: tfnb relaunches from that checkpoint). A no-op without ``min_workers``; docs/reliability.md.

        Example:
            >>> for epoch in range(start, epochs):
            ...     if epoch > start:
            ...         ctx.epoch_boundary(strategy, epoch)
            ...     train_one_epoch(); manager.save()
        """
        from .resize import epoch_boundary

        epoch_boundary(self, strategy, epoch)

    def reserved_port(self):
        """With ``LaunchHooks(keep_port=True)`` (add-ons such as tfnb.compat), the socket holding this task's port in
        ``cluster_spec`` until the add-on's server takes it; handed over once, then None."""
        from .._protocol import ENV_KEPT_PORT_FD

        fd = os.environ.pop(ENV_KEPT_PORT_FD, None)
        return socket.socket(fileno=int(fd)) if fd else None
