"""Refusals about the Spark cluster or session a run is given: task slots, GPUs, the session object.
The shared local[2] session; the GPU-conf and stopped-session cases have sessions of their own."""
from __future__ import annotations

import tfnb
from tfnb import ClusterError, ConfigError

from refusals import Refusals, case, on_stopped_session, one


@case("cluster", "`num_workers=3` on 2 task slots", ClusterError, "needs 3 task slots", "has 2",
      "spark.executor.instances", says="lower num_workers or add executors/cores", spark=True)
def run_more_tasks_than_slots(env):
    tfnb.run(one, num_workers=3, spark=env.spark, display=False)


@case("cluster", "`gpus_per_worker=1` on local[2]", ClusterError, "gpus_per_worker=1",
      "local master (local[2])", "spark.task.resource.gpu.amount=1", "spark.driver.resource.gpu.amount",
      says="set spark.task.resource.gpu.amount when the session starts, or use a cluster master", spark=True)
def run_gpus_per_worker_on_local(env):
    tfnb.run(one, num_workers=2, spark=env.spark, gpus_per_worker=1, display=False)


@case("cluster", "`use_gpu=True` without spark.task.resource.gpu.amount", ClusterError, "use_gpu=True",
      "spark.task.resource.gpu.amount=1", "use_gpu=None",
      says="set spark.task.resource.gpu.amount (+ executor GPUs), or use_gpu=None", spark=True)
def run_gpu_without_gpu_conf(env):
    tfnb.run(one, num_workers=2, spark=env.spark, use_gpu=True, display=False)


@case("cluster", "`spark=spark.sparkContext`", ConfigError, "(SparkContext)", "not its SparkContext",
      says="pass the SparkSession", spark=True)
def run_spark_context(env):
    tfnb.run(one, num_workers=2, spark=env.spark.sparkContext, display=False)


@case("cluster", "`spark='local[2]'`", ConfigError, "spark='local[2]'", "leave spark= out",
      says="pass a SparkSession, or leave spark= out", spark=True)
def run_spark_str(env):
    tfnb.run(one, num_workers=2, spark="local[2]", display=False)


@case("cluster", "spark.task.resource.gpu.amount=1 on local[2] without driver GPUs", ClusterError,
      "spark.task.resource.gpu.amount=1", "spark.driver.resource.gpu.amount is unset",
      "unset spark.task.resource.gpu.amount", "spark.driver.resource.gpu.discoveryScript",
      says="unset the task GPU amount, or give the driver/executors GPUs",
      own_session={"spark.task.resource.gpu.amount": "1", "spark.executor.resource.gpu.amount": "1"})
def run_gpu_conf_without_gpus(env):
    session = env.spark
    yield
    tfnb.run(one, num_workers=2, spark=session, display=False)


@case("cluster", "stopped SparkSession", ConfigError, "stopped SparkSession", "SparkSession.builder.getOrCreate()",
      says="start a new session (or leave spark= out)", own_session={})
def run_stopped_session(env):
    yield from on_stopped_session(env, lambda session: tfnb.run(one, num_workers=2, spark=session, display=False))


class TestRefusals(Refusals):
    """The cases above."""
