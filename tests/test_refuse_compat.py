"""Refusals of the TensorFlowOnSpark API (TFCluster, TFNode): checks without Spark first, then those
against the shared local[2] session; the stopped-context case has a session of its own."""
from __future__ import annotations

from tfnb import ClusterError, ConfigError

from refusals import Refusals, case, nothing


@case("compat", "`TFCluster.run('sc', ...)`", ConfigError, "got str", "pass spark.sparkContext",
      says="pass the SparkContext (spark.sparkContext)")
def compat_sc_not_context(env):
    from tfnb.compat import TFCluster

    TFCluster.run("sc", nothing, None, 2, 0)


@case("compat", "`TFNode.start_cluster_server(ctx, rdma=True)`", ConfigError, "rdma=True", "pass rdma=False",
      says="rdma=False (no verbs protocol in TF 2)")
def compat_rdma(env):
    from tfnb.compat import TFNode

    TFNode.start_cluster_server(object(), rdma=True)


@case("compat", "`TFNode.export_saved_model(sess, ...)`", ConfigError, "TensorFlow 1 session", "model.save(export_dir)",
      says="model.save(export_dir)")
def compat_export_tf1(env):
    from tfnb.compat import TFNode

    TFNode.export_saved_model(None, "/tmp/x", None, None)


@case("compat", "`TFNode.next_batch(...)` (removed)", ConfigError, "TFNode.next_batch()",
      "TFNode.DataFeed(ctx.mgr).next_batch", says="TFNode.DataFeed(ctx.mgr).next_batch(...)")
def compat_removed_next_batch(env):
    from tfnb.compat import TFNode

    TFNode.next_batch(None, 10)


@case("compat", "`DataFeed(mgr=None)`", ConfigError, "got NoneType", "ctx.mgr", says="DataFeed(ctx.mgr)")
def compat_datafeed_mgr(env):
    from tfnb.compat import TFNode

    TFNode.DataFeed(None)


@case("compat", "`TFCluster.run(map_fun='main')`", ConfigError, "got str", "(args, ctx)",
      says="a function taking (args, ctx)", spark=True)
def compat_map_fun(env):
    from tfnb.compat import TFCluster

    TFCluster.run(env.spark.sparkContext, "main", None, 2, 0)


@case("compat", "`num_executors=0`", ConfigError, "num_executors=0", "int >= 1", says="an int >= 1", spark=True)
def compat_num_executors(env):
    from tfnb.compat import TFCluster

    TFCluster.run(env.spark.sparkContext, nothing, None, 0, 0)


@case("compat", "`input_mode=5`", ConfigError, "input_mode=5", "TFCluster.InputMode.TENSORFLOW",
      says="TFCluster.InputMode.TENSORFLOW or .SPARK", spark=True)
def compat_input_mode(env):
    from tfnb.compat import TFCluster

    TFCluster.run(env.spark.sparkContext, nothing, None, 2, 0, input_mode=5)


@case("compat", "`driver_ps_nodes=True`", ConfigError, "driver_ps_nodes=True", "leave it False",
      says="leave it False (ps nodes run on executors)", spark=True)
def compat_driver_ps(env):
    from tfnb.compat import TFCluster

    TFCluster.run(env.spark.sparkContext, nothing, None, 2, 1, driver_ps_nodes=True)


@case("compat", "`eval_node=True` with InputMode.SPARK", ConfigError, "eval_node=True",
      "input_mode=InputMode.TENSORFLOW", says="InputMode.TENSORFLOW for an evaluator node", spark=True)
def compat_eval_node_spark(env):
    from tfnb.compat import TFCluster

    TFCluster.run(env.spark.sparkContext, nothing, None, 2, 0, input_mode=TFCluster.InputMode.SPARK,
                  eval_node=True)


@case("compat", "`num_ps=2` of `num_executors=2`", ConfigError, "num_ps=2", "raise num_executors or lower num_ps",
      says="raise num_executors or lower num_ps", spark=True)
def compat_all_ps(env):
    from tfnb.compat import TFCluster

    TFCluster.run(env.spark.sparkContext, nothing, None, 2, 2)


@case("compat", "`reservation_timeout=0`", ConfigError, "reservation_timeout=0", "seconds > 0",
      says="seconds > 0", spark=True)
def compat_reservation_timeout(env):
    from tfnb.compat import TFCluster

    TFCluster.run(env.spark.sparkContext, nothing, None, 2, 0, reservation_timeout=0)


@case("compat", "`num_executors=3` on 2 task slots", ClusterError, "TFCluster.run(num_executors=3)",
      "needs 3 task slots", says="lower num_executors or add executors/cores", spark=True)
def compat_more_than_slots(env):
    from tfnb.compat import TFCluster

    TFCluster.run(env.spark.sparkContext, nothing, None, 3, 0)


@case("compat", "stopped SparkContext", ConfigError, "stopped SparkContext", "SparkSession.builder.getOrCreate()",
      says="start a new session and pass spark.sparkContext", own_session={})
def compat_stopped_context(env):
    from tfnb.compat import TFCluster

    session = env.spark
    session.stop()
    yield
    TFCluster.run(session.sparkContext, nothing, None, 2, 0)


class TestRefusals(Refusals):
    """The cases above."""
