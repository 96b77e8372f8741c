"""Refusals of the TensorFlowOnSpark API (TFCluster, TFNode): checks without Spark first, then those
against the shared local[2] session; the stopped-context case has a session of its own."""
from __future__ import annotations

from tfnb import ClusterError, ConfigError
from tfnb.compat import TFCluster, TFNode

from refusals import Refusals, case, nothing, on_stopped_session, table


@case("compat", "`TFCluster.run('sc', ...)`", ConfigError, "got str", "pass spark.sparkContext",
      says="pass the SparkContext (spark.sparkContext)")
def compat_sc_not_context(env):
    TFCluster.run("sc", nothing, None, 2, 0)


@case("compat", "`TFNode.start_cluster_server(ctx, rdma=True)`", ConfigError, "rdma=True", "pass rdma=False",
      says="rdma=False (no verbs protocol in TF 2)")
def compat_rdma(env):
    TFNode.start_cluster_server(object(), rdma=True)


@case("compat", "`TFNode.export_saved_model(sess, ...)`", ConfigError, "TensorFlow 1 session", "model.save(export_dir)",
      says="model.save(export_dir)")
def compat_export_tf1(env):
    TFNode.export_saved_model(None, "/tmp/x", None, None)


@case("compat", "`TFNode.next_batch(...)` (removed)", ConfigError, "TFNode.next_batch()",
      "TFNode.DataFeed(ctx.mgr).next_batch", says="TFNode.DataFeed(ctx.mgr).next_batch(...)")
def compat_removed_next_batch(env):
    TFNode.next_batch(None, 10)


@case("compat", "`DataFeed(mgr=None)`", ConfigError, "got NoneType", "ctx.mgr", says="DataFeed(ctx.mgr)")
def compat_datafeed_mgr(env):
    TFNode.DataFeed(None)


def _run(env, map_fun=nothing, num_executors=2, num_ps=0, **kwargs):
    """TFCluster.run on the shared session's SparkContext, with no tf_args."""
    TFCluster.run(env.spark.sparkContext, map_fun, None, num_executors, num_ps, **kwargs)


table("compat", ConfigError, _run, [
    ("compat_map_fun", dict(map_fun="main"),
     "`TFCluster.run(map_fun='main')`", ("got str", "(args, ctx)"), "a function taking (args, ctx)"),
    ("compat_num_executors", dict(num_executors=0),
     "`num_executors=0`", ("num_executors=0", "int >= 1"), "an int >= 1"),
    ("compat_input_mode", dict(input_mode=5),
     "`input_mode=5`", ("input_mode=5", "TFCluster.InputMode.TENSORFLOW"), "TFCluster.InputMode.TENSORFLOW or .SPARK"),
    ("compat_driver_ps", dict(num_ps=1, driver_ps_nodes=True),
     "`driver_ps_nodes=True`", ("driver_ps_nodes=True", "leave it False"),
     "leave it False (ps nodes run on executors)"),
    ("compat_eval_node_spark", dict(input_mode=TFCluster.InputMode.SPARK, eval_node=True),
     "`eval_node=True` with InputMode.SPARK", ("eval_node=True", "input_mode=InputMode.TENSORFLOW"),
     "InputMode.TENSORFLOW for an evaluator node"),
    ("compat_all_ps", dict(num_ps=2),
     "`num_ps=2` of `num_executors=2`", ("num_ps=2", "raise num_executors or lower num_ps"),
     "raise num_executors or lower num_ps"),
    ("compat_reservation_timeout", dict(reservation_timeout=0),
     "`reservation_timeout=0`", ("reservation_timeout=0", "seconds > 0"), "seconds > 0"),
], spark=True)


@case("compat", "`num_executors=3` on 2 task slots", ClusterError, "TFCluster.run(num_executors=3)",
      "needs 3 task slots", says="lower num_executors or add executors/cores", spark=True)
def compat_more_than_slots(env):
    _run(env, num_executors=3)


@case("compat", "stopped SparkContext", ConfigError, "stopped SparkContext", "SparkSession.builder.getOrCreate()",
      says="start a new session and pass spark.sparkContext", own_session={})
def compat_stopped_context(env):
    yield from on_stopped_session(env, lambda session: TFCluster.run(session.sparkContext, nothing, None, 2, 0))


class TestRefusals(Refusals):
    """The cases above."""
