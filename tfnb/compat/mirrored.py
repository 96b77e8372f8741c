"""spark-tensorflow-distributor's ``MirroredStrategyRunner`` on :func:`tfnb.run`: change one import (see
docs/migrating.md). ``train`` runs in a fresh process per run, so reruns, cancelling and Spark Connect work, and
``BarrierTaskContext.get()`` inside it raises, naming ``TF_CONFIG`` instead."""
from __future__ import annotations

import contextlib
import logging
import math
import os
from typing import Any, Callable

from ..errors import ClusterError, ConfigError, below, summary
from ..launcher import check_cluster, get_spark, spark_conf, temp_env
from ..launcher import run as tfnb_run

log = logging.getLogger(__name__)

_IGNORE_SSL = "tensorflow.spark.distributor.ignoreSsl"


def gpus_per_task(num_slots: int, num_tasks: int, rank: int) -> int:
    """GPUs task ``rank`` uses: an equal share of ``num_slots``, the remainder to the first tasks."""
    return num_slots // num_tasks + (rank < num_slots % num_tasks)


def _conf_true(spark, key: str) -> bool:
    return (spark_conf(spark, key) or "false").strip().lower() == "true"


class _NotInSparkTask:
    """Stands in for ``pyspark.BarrierTaskContext`` inside ``train``: says what to use instead."""

    @classmethod
    def get(cls):
        raise ConfigError(
            "BarrierTaskContext.get() is not available in train, which runs outside Spark's task; read TF_CONFIG, "
            "or use tfnb.run, whose train_fn(ctx) gets a tfnb.WorkerContext\n"
            "tfnb runs train in a fresh process so reruns and cancel work. TF_CONFIG is set "
            "(json.loads(os.environ['TF_CONFIG']) has the rank in ['task']['index'] and the peers in "
            "['cluster']['worker']); to gather values across workers use the strategy (strategy.gather / "
            "strategy.reduce).")


def _run_program(train_fn: Callable, kwargs: dict, use_custom_strategy: bool, strategy_cls: str) -> Any:
    if use_custom_strategy:
        return train_fn(**kwargs)
    import tensorflow as tf

    with getattr(tf.distribute, strategy_cls)().scope():
        return train_fn(**kwargs)


def _task_main(ctx, train_fn: Callable, kwargs: dict, use_custom_strategy: bool, num_slots: int,
               use_gpu: bool) -> Any:
    """In each task process: pick this task's GPUs, then run ``train``."""
    if use_gpu:
        mine = gpus_per_task(num_slots, ctx.num_workers, ctx.task_index)
        if len(ctx.gpus) < mine:
            raise ClusterError(
                f"task {ctx.task_index} needs {mine} GPUs of num_slots={num_slots} but Spark gave it "
                f"{len(ctx.gpus)}; raise spark.task.resource.gpu.amount or lower num_slots")
        # TensorFlow reads CUDA_VISIBLE_DEVICES when it first touches a device, which is after this.
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ctx.gpus[:mine])
    import pyspark  # the task process runs with its Spark worker's environment
    import pyspark.taskcontext as taskcontext

    pyspark.BarrierTaskContext = taskcontext.BarrierTaskContext = _NotInSparkTask  # type: ignore[misc]
    return _run_program(train_fn, kwargs, use_custom_strategy, "MultiWorkerMirroredStrategy")


class MirroredStrategyRunner:
    """Runs a TensorFlow training function on Spark with MultiWorkerMirroredStrategy.

    Args:
        num_slots: total GPUs (GPU training) or Spark tasks (CPU training); must be > 0.
        local_mode: run ``train`` on the driver instead (with GPUs: ``num_slots`` of the driver's GPUs through
            ``CUDA_VISIBLE_DEVICES``, restored afterwards; without: ``num_slots`` must be 1).
        use_gpu: train on GPUs from Spark's GPU-aware scheduling (default); False hides GPUs from ``train``.
        gpu_resource_name: the Spark resource that holds GPUs: ``gpu`` for distributed runs (as Spark and
            Databricks name it); local mode reads the driver's resource of this name.
        use_custom_strategy: False: ``train`` runs inside the strategy's scope, so single-process Keras code
            trains distributed. True: ``train`` creates its own strategy.
        spark: the SparkSession (classic or Spark Connect); default: the active one or a local one.

    Raises:
        ValueError: ``num_slots <= 0`` (a :class:`tfnb.ConfigError`).
        ClusterError: GPU training on a cluster without GPU-aware scheduling, or TLS on without override.

    Example:
        >>> from tfnb.compat import MirroredStrategyRunner
        >>> MirroredStrategyRunner(num_slots=2, use_gpu=False).run(train, epochs=3)
    """

    def __init__(self, *, num_slots: int, local_mode: bool = False, use_gpu: bool = True,
                 gpu_resource_name: str = "gpu", use_custom_strategy: bool = False, spark=None):
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots <= 0:
            raise ConfigError(f"num_slots is set to {num_slots!r} but must be an int > 0: the number of GPUs "
                              "(use_gpu=True) or Spark tasks (use_gpu=False) to train with")
        self._num_slots, self._local_mode, self._use_gpu = num_slots, local_mode, use_gpu
        self._gpu_resource_name, self._use_custom_strategy = gpu_resource_name, use_custom_strategy
        self._spark = get_spark(spark, 1 if local_mode else num_slots)
        self._num_tasks, self._gpus_per_task = (None, None) if local_mode else self._plan()
        if local_mode:
            log.warning("MirroredStrategyRunner runs train on the driver (local_mode=True); other work on the "
                        "driver competes with it for resources")

    def get_num_tasks(self) -> int:
        """Spark tasks of a distributed run: ``ceil(num_slots / spark.task.resource.gpu.amount)`` with GPUs (one GPU
        per task when the conf is unset), else ``num_slots``."""
        return self._plan()[0] if self._use_gpu else self._num_slots

    def _plan(self) -> tuple[int, int | None]:
        """(tasks, ``gpus_per_worker`` for tfnb.run): with GPUs, 1 asked per run when the conf is unset, else the
        conf's amount (None); without, 0 where the conf gives every task GPUs and a run can ask for none."""
        key = f"spark.task.resource.{self._gpu_resource_name}.amount"
        raw = spark_conf(self._spark, key)
        if not self._use_gpu:
            if float(raw or 0) > 0:
                # without a per-run profile here the tasks hold the conf's GPUs, hidden from train
                with contextlib.suppress(ClusterError):
                    check_cluster(self._spark, self._num_slots, use_gpu=False, gpus_per_worker=0)
                    return self._num_slots, 0
            return self._num_slots, None
        if raw is None:
            try:  # the same mechanism as tfnb.run(gpus_per_worker=1): a task resource profile
                check_cluster(self._spark, self._num_slots, use_gpu=True, gpus_per_worker=1)
            except ClusterError as e:
                raise ClusterError(
                    f"use_gpu=True but the Spark conf {key} is not set, and tfnb cannot ask for one GPU per task "
                    f"in this run; set {key}, or pass use_gpu=False for CPU training\n"
                    f"Set it with spark.executor.resource.{self._gpu_resource_name}.amount and a discovery script. "
                    f"Why not in this run: {summary(e)}{below(e)}") from e
            return self._num_slots, 1
        if float(raw) < 1:
            raise ClusterError(f"the Spark conf {key}={raw} is below 1; give each task at least one whole GPU")
        return math.ceil(self._num_slots / int(float(raw))), None

    def run(self, train_fn: Callable, **kwargs: Any) -> Any:
        """Run ``train_fn(**kwargs)`` on every task (or on the driver in local mode).

        Returns:
            What ``train_fn`` returned on the chief (partition 0), or in local mode its return value.

        Raises:
            tfnb.WorkerError: ``train_fn`` failed on a task (with the task's traceback).
        """
        if self._local_mode:
            return self._run_local(train_fn, kwargs)
        self._check_encryption()
        if self._use_gpu and self._gpu_resource_name != "gpu":
            raise ConfigError(
                f"gpu_resource_name={self._gpu_resource_name!r}: distributed runs take GPUs from Spark's "
                "'gpu' resource; name the resource 'gpu' in the cluster's Spark conf")
        return tfnb_run(_task_main, num_workers=self._num_tasks, spark=self._spark,
                        use_gpu=bool(self._use_gpu), gpus_per_worker=self._gpus_per_task,
                        args=(train_fn, kwargs, self._use_custom_strategy, self._num_slots, self._use_gpu))

    def _run_local(self, train_fn: Callable, kwargs: dict) -> Any:
        owned = self._driver_gpus() if self._use_gpu else []
        if self._use_gpu and self._num_slots > len(owned):
            raise ClusterError(f"num_slots={self._num_slots} GPUs requested for local training but the "
                               f"driver has {len(owned)} ({self._gpu_resource_name}); lower num_slots")
        if not self._use_gpu and self._num_slots > 1:
            raise ConfigError(f"num_slots={self._num_slots} but local CPU training runs one process; "
                              "set num_slots=1")
        # One machine: MirroredStrategy, which (unlike the multi-worker one) can be created again on rerun.
        with temp_env("CUDA_VISIBLE_DEVICES", ",".join(owned[: self._num_slots])):
            return _run_program(train_fn, kwargs, self._use_custom_strategy, "MirroredStrategy")

    def _driver_gpus(self) -> list[str]:
        """The driver's GPU addresses; an existing CUDA_VISIBLE_DEVICES maps them (it renumbers devices)."""
        try:
            resources = self._spark.sparkContext.resources
        except Exception as e:  # noqa: BLE001 - Spark Connect has no SparkContext
            raise ClusterError("local_mode with use_gpu=True reads the driver's GPU resources, which a Spark "
                               "Connect session does not expose; pass use_gpu=False or use a classic session") from e
        info = resources.get(self._gpu_resource_name)
        if info is None:
            raise ClusterError(
                f"the driver has no {self._gpu_resource_name!r} resource; set spark.driver.resource."
                f"{self._gpu_resource_name}.amount and its discoveryScript, or pass use_gpu=False")
        addresses = list(info.addresses)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            ids = visible.split(",")
            addresses = [ids[int(a)] for a in addresses if int(a) < len(ids)]
        return addresses

    def _check_encryption(self) -> None:
        # As the original: TensorFlow's collectives do not encrypt, so a TLS cluster must opt in.
        if not _conf_true(self._spark, "spark.ssl.enabled"):
            return
        if _conf_true(self._spark, _IGNORE_SSL):
            log.warning("spark.ssl.enabled is true but TensorFlow sends model parameters and data between "
                        "workers unencrypted (%s=true)", _IGNORE_SSL)
            return
        raise ClusterError(
            "this cluster has TLS on (spark.ssl.enabled=true) but TensorFlow's collectives send model "
            f"parameters and data between workers unencrypted; set {_IGNORE_SSL}=true to run anyway")
