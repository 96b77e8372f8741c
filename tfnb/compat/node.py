"""TensorFlowOnSpark's ``TFNode`` API inside ``map_fun``: the node context, ``DataFeed`` and ``hdfs_path``. Unlike
TensorFlowOnSpark 2.2.5 it fails instead of hanging: ``DataFeed`` in an ``InputMode.TENSORFLOW`` cluster raises, and
so does an inference ``map_fun`` that does not return one result per row."""
from __future__ import annotations

import getpass
import json
import logging
import os
import socket
import sys
from typing import Any, Callable

from ..errors import ConfigError
from ._feed import INFERENCE, FeedManager

log = logging.getLogger(__name__)

# All Hadoop-compatible file system schemes (Hadoop 3): paths with these are already absolute.
_SCHEMES = ("adl://", "file://", "hdfs://", "oss://", "s3://", "s3a://", "s3n://", "swift://",
            "viewfs://", "wasb://")


def _int(name: str, value, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{name}={value!r} but it must be an int >= {low}")
    return value


def hdfs_path(ctx, path: str) -> str:
    """An absolute, scheme-prefixed path for ``path``: a relative one goes under ``/user/<user>/`` on HDFS, under
    ``ctx.working_dir`` on ``file://``. ``ctx`` is anything with ``defaultFS`` and ``working_dir``.

    Example:
        >>> hdfs_path(type("Ctx", (), {"defaultFS": "file://", "working_dir": "/home/me"}), "model")
        'file:///home/me/model'
    """
    if path.startswith(_SCHEMES):
        return path
    if path.startswith("/"):
        return ctx.defaultFS + path
    fs = ctx.defaultFS
    if fs.startswith(("hdfs://", "viewfs://")):
        return f"{fs}/user/{getpass.getuser()}/{path}"
    if fs.startswith("file://"):
        return f"{fs}/{ctx.working_dir[1:]}/{path}"
    log.warning("unknown file system scheme %s with relative path %s", fs, path)
    return f"{fs}/{path}"


def release_port(ctx) -> None:
    """Close the socket that kept ``ctx``'s TensorFlow port reserved (``release_port=False`` clusters).

    Example:
        >>> ctx.release_port()          # then start the tf.distribute.Server on the port
    """
    if ctx.tmp_socket is not None:
        log.info("releasing assigned port %s", ctx.tmp_socket.getsockname())
        ctx.tmp_socket.close()
        ctx.tmp_socket = None
    else:
        log.warning("release_port() called with no reserved socket (already released, or release_port=True)")


def start_cluster_server(ctx, num_gpus: int = 1, rdma: bool = False):
    """Start this node's ``tf.distribute.Server`` from ``ctx.cluster_spec`` (e.g. for a ps node), which
    TensorFlowOnSpark 2.2.5 refuses under TensorFlow 2; returns ``(tf.train.ClusterSpec, tf.distribute.Server)``.

    Raises:
        ConfigError: ``rdma=True`` (no verbs protocol in TensorFlow 2), or the port is still reserved.

    Example:
        >>> cluster, server = TFNode.start_cluster_server(ctx)
        >>> if ctx.job_name == "ps":
        ...     server.join()
    """
    if rdma:
        raise ConfigError("rdma=True asks for the grpc+verbs protocol, which TensorFlow 2 does not have; "
                          "pass rdma=False")
    if getattr(ctx, "tmp_socket", None) is not None:
        raise ConfigError("this node's port is still reserved (release_port=False); call ctx.release_port() "
                          "before start_cluster_server(ctx)")
    import tensorflow as tf

    cluster = tf.train.ClusterSpec(ctx.cluster_spec)
    server = tf.distribute.Server(cluster, job_name=ctx.job_name, task_index=ctx.task_index, start=True)
    return cluster, server


def export_saved_model(sess, export_dir, tag_set, signatures):
    """TensorFlow 1 session export; not available (TensorFlowOnSpark 2.2.5 refuses it on TensorFlow 2 too)."""
    raise ConfigError("TFNode.export_saved_model exports a TensorFlow 1 session; with TensorFlow 2 save the "
                      "model with model.save(export_dir) or tf.saved_model.save(model, export_dir)")


class NodeContext:
    """The ``ctx`` a TensorFlowOnSpark ``map_fun(args, ctx)`` receives (mutable: ``ctx.release_port()`` clears
    ``ctx.tmp_socket``).

    Attributes:
        executor_id: this node's index in 0..num_executors-1 (``worker_num`` is the same).
        job_name: ``"ps"``, ``"chief"``/``"master"`` (the ``master_node`` name), ``"evaluator"`` or ``"worker"``.
        task_index: the node's index within its job.
        cluster_spec: ``{job_name: ["host:port", ...]}`` for every node, in TensorFlowOnSpark's layout.
        num_workers: chief/master + worker nodes.
        defaultFS: Hadoop's ``fs.defaultFS`` on the driver, e.g. ``"file://"`` or ``"hdfs://nn:8020"``.
        working_dir: the driver's working directory when ``TFCluster.run`` was called.
        mgr: the data feed handle for ``TFNode.DataFeed(ctx.mgr, ...)``.
        tmp_socket: the socket keeping this node's port reserved with ``release_port=False``, else None.
        tfnb: the underlying :class:`tfnb.WorkerContext` (model_dir, log_dir, ``report()``, ...).
    """

    # as in TensorFlowOnSpark, the TFNode functions are methods of ctx too
    absolute_path = hdfs_path
    start_cluster_server = start_cluster_server
    release_port = release_port
    export_saved_model = staticmethod(export_saved_model)

    def __init__(self, executor_id: int, job_name: str, task_index: int, cluster_spec: dict,
                 defaultFS: str = "file://", working_dir: str = ".", mgr: FeedManager | None = None,
                 tmp_socket: socket.socket | None = None, tfnb=None):
        self.worker_num = self.executor_id = executor_id
        self.job_name, self.task_index, self.cluster_spec = job_name, task_index, cluster_spec
        self.num_workers = sum(len(v) for k, v in cluster_spec.items() if k in ("master", "chief", "worker"))
        self.defaultFS, self.working_dir, self.mgr, self.tmp_socket = defaultFS, working_dir, mgr, tmp_socket
        self.tfnb = tfnb

    def get_data_feed(self, train_mode: bool = True, qname_in: str = "input", qname_out: str = "output",
                      input_mapping: dict | None = None) -> "DataFeed":
        return DataFeed(self.mgr, train_mode, qname_in, qname_out, input_mapping)

    def __repr__(self) -> str:
        return (f"NodeContext(executor_id={self.executor_id}, job_name={self.job_name!r}, "
                f"task_index={self.task_index}, cluster_spec={self.cluster_spec})")


def _deprecated(name: str):
    def fn(*args, **kwargs):
        raise ConfigError(f"TFNode.{name}() was removed in TensorFlowOnSpark 2; use "
                          f"TFNode.DataFeed(ctx.mgr).{name}(...) instead")
    fn.__name__ = name
    fn.__doc__ = f"Removed in TensorFlowOnSpark 2 (raises): use ``DataFeed.{name}``."
    return fn


next_batch, batch_results, terminate = map(_deprecated, ("next_batch", "batch_results", "terminate"))


class DataFeed:
    """This node's rows of the RDD given to ``cluster.train()`` / ``cluster.inference()``.

    Args:
        mgr: ``ctx.mgr``.
        train_mode: False makes a batch end at the end of each input partition (as in TensorFlowOnSpark).
        qname_in, qname_out: must be ``"input"`` and ``"output"`` (TensorFlowOnSpark internals).
        input_mapping: ``{column: tensor name}``; ``next_batch`` then returns ``{tensor name: [values]}``,
            tensors ordered by column name, values taken by position from each row.

    Raises:
        ConfigError: the cluster runs InputMode.TENSORFLOW, ``mgr`` is not ``ctx.mgr``, or another
            queue name is given.

    Example:
        >>> feed = TFNode.DataFeed(ctx.mgr, train_mode=False)
        >>> while not feed.should_stop():
        ...     batch = feed.next_batch(100)
        ...     if batch:
        ...         feed.batch_results(model.predict(np.array(batch)).argmax(axis=1))
    """

    def __init__(self, mgr, train_mode: bool = True, qname_in: str = "input", qname_out: str = "output",
                 input_mapping: dict | None = None):
        if not isinstance(mgr, FeedManager):
            raise ConfigError(f"DataFeed(mgr) needs ctx.mgr, the manager map_fun's ctx carries; got "
                              f"{type(mgr).__name__}")
        if qname_in != "input" or qname_out != "output":
            raise ConfigError(f"qname_in={qname_in!r}, qname_out={qname_out!r}: tfnb.compat feeds one input "
                              "and one output queue; leave them at 'input' and 'output'")
        if input_mapping is not None and not isinstance(input_mapping, dict):
            raise ConfigError(f"input_mapping must be a dict of column -> tensor name, got "
                              f"{type(input_mapping).__name__}")
        self.mgr, self.train_mode, self.qname_in, self.qname_out = mgr, train_mode, qname_in, qname_out
        self.input_tensors = [t for _, t in sorted(input_mapping.items())] if input_mapping is not None else None
        mgr.open()  # fails here, at construction, in an InputMode.TENSORFLOW cluster

    @property
    def done_feeding(self) -> bool:
        return self.mgr.exhausted

    def next_batch(self, batch_size: int):
        """Up to ``batch_size`` rows (a list, or with ``input_mapping`` a dict of value lists); ``[]`` at the end."""
        rows = self.mgr.take(_int("batch_size", batch_size, 1), stop_at_partition=not self.train_mode)
        if self.input_tensors is None:
            return rows
        return {t: [row[i] for row in rows] for i, t in enumerate(self.input_tensors)}

    def should_stop(self) -> bool:
        """True once every row has been handed out (all epochs), or after ``terminate()``."""
        return self.mgr.exhausted

    def batch_results(self, results) -> None:
        """Return one result per row of the last batch."""
        self.mgr.results.extend(results)

    def terminate(self) -> None:
        """Stop feeding early: ``next_batch`` returns ``[]`` and ``should_stop()`` is True from now on."""
        log.info("terminate() called after %d rows", self.mgr.handed)
        self.mgr.terminate()


def run_node(wctx, map_fun: Callable, tf_args: Any, meta: dict):
    """tfnb train_fn of one node: its ctx, then ``map_fun(tf_args, ctx)``; returns its inference results or None.
    ``meta`` is the driver's ``TFCluster.cluster_meta``."""
    executor_id = wctx.task_index  # tfnb runs every node as a worker, so its index is the node's rank
    template = meta["cluster_template"]
    job_name, task_index = next((job, ids.index(executor_id)) for job, ids in template.items() if executor_id in ids)
    addresses = wctx.cluster_spec["worker"]
    cluster_spec = {job: [addresses[e] for e in ids] for job, ids in template.items()}
    # TF_CONFIG as TensorFlowOnSpark sets it: only for clusters with a chief/master node
    os.environ.pop("TF_CONFIG", None)
    if "chief" in cluster_spec or "master" in cluster_spec:
        os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster_spec, "task": {"type": job_name, "index": task_index},
                                              "environment": "cloud"})
    mgr = FeedManager(wctx.feed)
    ctx = NodeContext(executor_id, job_name, task_index, cluster_spec, meta["default_fs"], meta["working_dir"],
                      mgr, None if meta["release_port"] else wctx.reserved_port(), wctx)
    if not meta["release_port"]:
        log.warning("user code must call ctx.release_port() before starting its TensorFlow server")
    if isinstance(tf_args, list):
        sys.argv = tf_args
    map_fun(tf_args, ctx)
    feed = wctx.feed
    if feed is None or feed.mode != INFERENCE:
        return None
    if len(mgr.results) != feed.rows:
        raise ConfigError(
            f"cluster.inference(): map_fun returned {len(mgr.results)} results for the {feed.rows} rows fed to "
            f"{job_name}:{task_index}; return one result per row\n"
            "Read every row with DataFeed.next_batch until should_stop() and pass DataFeed.batch_results one result "
            "per row of each batch.")
    return mgr.results
