"""TensorFlowOnSpark's ``TFCluster`` API (``run``, ``train``, ``inference``, ``shutdown``) on :func:`tfnb.run`. Each
node is a task of one barrier stage: no reservation server, and a cluster Spark cannot schedule is refused at
``run()``. ``train``/``inference`` run ``map_fun`` once per call with the RDD's rows on the nodes' disks
(TensorFlowOnSpark keeps one ``map_fun`` alive across calls); see docs/migrating.md."""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

from ..errors import ClusterError, ConfigError, RunCancelledError, RunTimeoutError, below, summary
from ..launcher import EventKind, LaunchHooks, RunEvent, check_cluster, make_display, pickle_fn
from ..launcher import run as tfnb_run
from ._feed import INFERENCE, TRAIN, feed
from .node import _int, run_node

log = logging.getLogger(__name__)

__all__ = ["InputMode", "TFCluster", "run"]


class InputMode:
    """How data reaches ``map_fun`` (TensorFlowOnSpark's enum values)."""

    TENSORFLOW = 0  #: map_fun reads its own data (tf.data, files)
    SPARK = 1       #: cluster.train(rdd) / cluster.inference(rdd) feed the RDD to ``TFNode.DataFeed``


_FEEDING_JOBS = ("chief", "master", "worker")


def cluster_template(num_executors: int, num_ps: int, master_node: str | None, eval_node: bool) -> dict:
    """Executor ids per job, in TensorFlowOnSpark's order: ps, master/chief, evaluator, workers
    (``cluster_template(4, 1, "chief", False)`` is ``{'ps': [0], 'chief': [1], 'worker': [2, 3]}``)."""
    executors, template = list(range(num_executors)), {}
    for job, n in (("ps", num_ps), (master_node, 1 if master_node else 0), ("evaluator", int(bool(eval_node))),
                   ("worker", num_executors)):
        if n > 0 and executors:
            template[job], executors = executors[:n], executors[n:]
    return template


def _session(sc):
    """(SparkContext, SparkSession) from a SparkContext, or from a SparkSession given in its place."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if isinstance(sc, SparkSession):
        return sc.sparkContext, sc
    if not isinstance(sc, SparkContext):
        raise ConfigError(
            f"sc must be the SparkContext (or a classic SparkSession), got {type(sc).__name__}; pass "
            "spark.sparkContext. Spark Connect sessions have no RDDs: use tfnb.run(train_fn, data=df) there")
    if sc._jsc is None:
        raise ConfigError("sc is a stopped SparkContext (sc.stop() or spark.stop() was called); start a new "
                          "session with SparkSession.builder.getOrCreate() and pass spark.sparkContext")
    active = SparkSession.getActiveSession()
    return sc, active if active is not None and active.sparkContext is sc else SparkSession(sc)


def _default_fs(sc) -> str:
    fs = sc._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///"
    # "file:///" -> "file://", consistent with "hdfs://namenode" (as TensorFlowOnSpark does)
    return fs[:-1] if fs.startswith("file://") and len(fs) > 7 and fs.endswith("/") else fs


class TFCluster:
    """A started TensorFlowOnSpark-style cluster (returned by :func:`run`).

    Attributes:
        sc: the SparkContext.
        defaultFS: Hadoop's default file system, e.g. ``"file://"``.
        working_dir: the driver's working directory at ``run()``.
        num_executors: nodes in the cluster.
        input_mode: ``InputMode.TENSORFLOW`` or ``InputMode.SPARK``.
        cluster_template: executor ids per job, e.g. ``{"chief": [0], "worker": [1]}``.
        cluster_meta: TensorFlowOnSpark's metadata dict (id, cluster_template, num_executors, default_fs,
            working_dir, release_port).
    """

    def __init__(self, *, sc, spark, map_fun: Callable, tf_args: Any, template: dict, release_port: bool,
                 input_mode: int, log_dir: str | None, display, queues):
        self.sc, self.spark, self.defaultFS, self.working_dir = sc, spark, _default_fs(sc), os.getcwd()
        self.num_executors = sum(len(v) for v in template.values())
        self.input_mode = input_mode
        self.cluster_template = template
        # also what every node gets (run_node)
        self.cluster_meta = {"id": id(self), "cluster_template": template, "num_executors": self.num_executors,
                             "default_fs": self.defaultFS, "working_dir": self.working_dir,
                             "release_port": release_port}
        self.queues = list(queues)
        self.cluster_info = None  # no reservation server: nodes find each other in the barrier stage
        self._map_fun, self._tf_args, self._log_dir = map_fun, tf_args, log_dir
        self._display = display
        self._daemons = tuple(e for job in ("ps", "evaluator") for e in template.get(job, ()))
        self._feed_ranks = tuple(sorted(e for job in _FEEDING_JOBS for e in template.get(job, ())))
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()
        self._started = threading.Event()
        self._finished = threading.Event()
        self._error: BaseException | None = None
        self._tensorboard = None  # the outcome of tfnb.tensorboard()
        self._shut_down = False

    def _run_nodes(self, display, *, data=None, feeder=None, all_results=False, cancel=None):
        hooks = LaunchHooks(feeder=feeder, all_results=all_results, daemon_ranks=frozenset(self._daemons),
                            cancel=cancel, keep_port=not self.cluster_meta["release_port"], task_cwd=True)
        return tfnb_run(run_node, hooks=hooks, num_workers=self.num_executors, spark=self.spark, log_dir=self._log_dir,
                        args=(self._map_fun, self._tf_args, self.cluster_meta), display=display, data=data)

    def _start_background(self, reservation_timeout: float) -> None:
        """InputMode.TENSORFLOW: run the nodes in a thread; return once every node runs map_fun."""
        display, running = make_display(self._display, self.num_executors), set()

        def sink(event: RunEvent) -> None:  # the display, noting which nodes run map_fun
            if (event.kind == EventKind.STATE and event.job_name != "driver"
                    and event.data.get("state") in ("training", "serving")):
                running.add((event.job_name, event.task_index))
                if len(running) >= self.num_executors:
                    self._started.set()
            display(event)

        sink.close = getattr(display, "close", lambda: None)

        def body():
            try:
                self._run_nodes(sink, cancel=self._cancel)
            except BaseException as e:  # noqa: BLE001 - handed to the driver's thread at shutdown()
                self._error = e
            finally:
                self._finished.set()
                self._started.set()

        self._thread = threading.Thread(target=body, name="tfnb-compat-cluster", daemon=True)
        self._thread.start()
        self._wait_or_stop(
            self._started, reservation_timeout,
            interrupted="TFCluster.run was interrupted; the cluster was stopped",
            timed_out=f"the TensorFlow nodes did not all start within reservation_timeout={reservation_timeout} s; "
                      "the job was cancelled. Check the executors' logs, or raise reservation_timeout")
        if len(running) < self.num_executors and self._error is not None:  # ended before every node started
            self._shut_down = True
            raise self._error

    def _wait_or_stop(self, event: threading.Event, limit, *, interrupted: str, timed_out: str) -> None:
        """Wait for ``event``; on Ctrl-C or when ``limit`` seconds pass, stop every node and raise."""
        try:
            done = event.wait(limit)
        except KeyboardInterrupt:
            self._cancel_and_join()
            raise RunCancelledError(interrupted) from None
        if not done:
            self._cancel_and_join()
            raise RunTimeoutError(timed_out)

    def _cancel_and_join(self) -> None:
        self._cancel.set()
        while self._thread is not None and self._thread.is_alive():
            try:
                self._thread.join()
            except KeyboardInterrupt:
                continue  # a second stop press must not leave the nodes running

    def _feed(self, rdd, mode: str, epochs: int, qname: str):
        from pyspark.streaming import DStream

        if self.input_mode != InputMode.SPARK:
            raise ConfigError(
                f"TFCluster.{mode}() feeds an RDD, which needs InputMode.SPARK, but this cluster runs "
                "InputMode.TENSORFLOW; start it with TFCluster.run(..., input_mode=TFCluster.InputMode.SPARK)")
        if qname != "input":
            raise ConfigError(f"qname={qname!r}: tfnb.compat feeds the 'input' queue only; leave qname='input'")
        if isinstance(rdd, DStream):
            raise ConfigError("Spark Streaming (DStream) feeding is not supported by tfnb.compat; "
                              f"collect each batch into an RDD and call cluster.{mode}(rdd)")
        if self._shut_down:
            raise ConfigError("this cluster was shut down; start a new one with TFCluster.run(...)")
        # Not the data= feed of tfnb.run: RDD rows are any picklable objects (it feeds numeric columns) and
        # inference must give the results back in RDD order (it balances rows across workers).
        return feed(self.spark, rdd, lambda df, feeder: self._run_nodes(
            self._display, data=df, feeder=feeder, all_results=mode == INFERENCE),
            num_tasks=self.num_executors, feed_ranks=self._feed_ranks, mode=mode, epochs=epochs)

    def train(self, dataRDD, num_epochs: int = 0, feed_timeout: float = 600, qname: str = "input") -> None:
        """Run ``map_fun`` on every node with ``dataRDD``'s rows fed to ``TFNode.DataFeed``; returns when all end.
        Each chief/master/worker node gets the same number of rows, a contiguous run of the RDD.

        Args:
            dataRDD: the rows, e.g. ``(features, label)`` tuples.
            num_epochs: passes over the data (``0`` means 10, as in TensorFlowOnSpark).
            feed_timeout, qname: accepted for compatibility; ``qname`` must be ``"input"``.

        Raises:
            ConfigError: the cluster runs InputMode.TENSORFLOW, was shut down, or the RDD has fewer
                rows than nodes.
            WorkerError: ``map_fun`` failed on a node (with its traceback).

        Example:
            >>> cluster.train(images_labels, args.epochs)
        """
        self._feed(dataRDD, TRAIN, _int("num_epochs", num_epochs, 0) or 10, qname)

    def inference(self, dataRDD, feed_timeout: float = 600, qname: str = "input"):
        """Run ``map_fun`` on every node over ``dataRDD``; returns the RDD of its ``batch_results``.

        Partition i of the result holds input partition i's results in row order, computed now through the driver
        (TensorFlowOnSpark's is lazy): write large outputs to storage from map_fun instead.

        Raises:
            ConfigError: the cluster runs InputMode.TENSORFLOW or was shut down.
            WorkerError: ``map_fun`` failed on a node, or did not return one result per row.

        Example:
            >>> predictions = cluster.inference(images).collect()
        """
        return self._feed(dataRDD, INFERENCE, 1, qname)

    def shutdown(self, ssc=None, grace_secs: float = 0, timeout: float = 259200) -> None:
        """Wait for the nodes to finish (InputMode.TENSORFLOW) and stop the cluster's TensorBoard.

        Args:
            ssc: Spark Streaming is not supported; must be None. ``grace_secs``: accepted for compatibility.
            timeout: seconds to wait before the nodes are stopped (RunTimeoutError); -1 waits forever.

        Raises:
            WorkerError: ``map_fun`` failed on a node (InputMode.TENSORFLOW).
            RunTimeoutError: ``timeout`` ran out; every node process was stopped.
            RunCancelledError: interrupted; every node process was stopped.

        Example:
            >>> cluster.shutdown()
        """
        if ssc is not None:
            raise ConfigError("Spark Streaming (ssc=) is not supported by tfnb.compat; call shutdown() without it")
        if not isinstance(grace_secs, (int, float)) or grace_secs < 0:
            raise ConfigError(f"grace_secs={grace_secs!r} but it must be a number >= 0")
        if self._shut_down:
            return
        try:
            if self._thread is not None:
                self._wait_or_stop(
                    self._finished, None if timeout is None or timeout <= 0 else float(timeout),
                    interrupted="TFCluster.shutdown was interrupted; every node process was stopped",
                    timed_out=f"map_fun did not finish on every node within shutdown(timeout={timeout}); every "
                              "node process was stopped. Raise timeout (or -1 to wait forever)")
                self._thread.join()
                if self._error is not None:
                    raise self._error
        finally:
            self._shut_down = True
            self._stop_tensorboard()

    def tensorboard_url(self) -> str | None:
        """URL of the TensorBoard started with ``tensorboard=True`` (on the driver), else None.

        Example:
            >>> cluster.tensorboard_url()
            'http://127.0.0.1:40123/'
        """
        return getattr(self._tensorboard, "url", None)

    def _stop_tensorboard(self) -> None:
        outcome, self._tensorboard = self._tensorboard, None
        if outcome is not None:
            from .. import Launched, tensorboard

            if isinstance(outcome, Launched):  # one it found already running is left alone
                tensorboard.stop(outcome)

    def __repr__(self) -> str:
        mode = "SPARK" if self.input_mode == InputMode.SPARK else "TENSORFLOW"
        return f"TFCluster({mode}, {self.cluster_template})"


def run(sc, map_fun: Callable, tf_args: Any, num_executors: int, num_ps: int, tensorboard: bool = False,
        input_mode: int = InputMode.TENSORFLOW, log_dir: str | None = None, driver_ps_nodes: bool = False,
        master_node: str | None = None, reservation_timeout: float = 600, queues=("input", "output", "error"),
        eval_node: bool = False, release_port: bool = True, *, display=None) -> TFCluster:
    """Start a TensorFlow cluster of ``num_executors`` nodes running ``map_fun(tf_args, ctx)``.

    TensorFlowOnSpark 2.2.5's layout: ``num_ps`` ps nodes, the ``master_node``, an evaluator with ``eval_node``, then
    workers. InputMode.TENSORFLOW returns once every node runs ``map_fun``; ps and evaluator nodes are stopped once
    every other node's ``map_fun`` has returned.

    Args:
        sc: the SparkContext (a classic SparkSession is accepted too).
        map_fun: ``map_fun(tf_args, ctx)``; ``ctx`` is a :class:`tfnb.compat.node.NodeContext`.
        tf_args: passed to ``map_fun``; an argv list also becomes ``sys.argv`` in the node.
        num_executors: nodes in the cluster; Spark must have that many task slots.
        num_ps: ps nodes among them.
        tensorboard: start TensorBoard on the driver for ``log_dir``; stopped by ``shutdown()``.
        input_mode: ``InputMode.TENSORFLOW`` (map_fun reads its data) or ``InputMode.SPARK`` (``train(rdd)``).
        log_dir: TensorBoard directory (also ``ctx.tfnb.log_dir``); default ``tensorboard_<id>`` in the working
            directory.
        driver_ps_nodes: must be False; ``queues``: accepted for compatibility.
        master_node: name of the chief node, ``"chief"`` for Keras/MultiWorkerMirroredStrategy, or None.
        reservation_timeout: seconds to wait for every node to start (InputMode.TENSORFLOW).
        eval_node: one evaluator node (InputMode.TENSORFLOW only).
        release_port: False keeps each node's port reserved as ``ctx.tmp_socket`` until ``ctx.release_port()``.
        display: tfnb extension: where logs and progress go (see :func:`tfnb.run`); False for none.

    Returns:
        TFCluster: call ``train``/``inference`` (InputMode.SPARK), then ``shutdown()``.

    Raises:
        ConfigError: bad arguments (the message names the fix).
        ClusterError: Spark cannot host ``num_executors`` nodes at once (raised here, where TensorFlowOnSpark waits).
        RunTimeoutError: the nodes did not all start within ``reservation_timeout``.

    Example:
        >>> from tfnb.compat import TFCluster
        >>> cluster = TFCluster.run(sc, main_fun, args, num_executors=2, num_ps=0,
        ...                         input_mode=TFCluster.InputMode.TENSORFLOW, master_node="chief")
        >>> cluster.shutdown()
    """
    sc, spark = _session(sc)
    if not callable(map_fun):
        raise ConfigError(f"map_fun must be a function taking (args, ctx), got {type(map_fun).__name__}")
    num_executors = _int("num_executors", num_executors, 1)
    num_ps = _int("num_ps", num_ps, 0)
    if input_mode not in (InputMode.TENSORFLOW, InputMode.SPARK):
        raise ConfigError(f"input_mode={input_mode!r} but it must be TFCluster.InputMode.TENSORFLOW or .SPARK")
    if driver_ps_nodes:
        raise ConfigError("driver_ps_nodes=True (ps nodes on the driver) is not supported by tfnb.compat; "
                          "leave it False so ps nodes run on executors")
    if eval_node and input_mode != InputMode.TENSORFLOW:
        raise ConfigError("eval_node=True needs input_mode=InputMode.TENSORFLOW (as in TensorFlowOnSpark)")
    if master_node is not None and (not isinstance(master_node, str) or not master_node):
        raise ConfigError(f"master_node={master_node!r} must be a job name such as 'chief', or None")
    if not isinstance(reservation_timeout, (int, float)) or reservation_timeout <= 0:
        raise ConfigError(f"reservation_timeout={reservation_timeout!r} must be a number of seconds > 0")
    template = cluster_template(num_executors, num_ps, master_node, eval_node)
    if num_ps + bool(master_node) + bool(eval_node) > num_executors or not any(j in template for j in _FEEDING_JOBS):
        raise ConfigError(
            f"num_executors={num_executors} cannot hold num_ps={num_ps}"
            f"{', the master node' if master_node else ''}{', the evaluator' if eval_node else ''} and at "
            "least one chief or worker node; raise num_executors or lower num_ps")
    pickle_fn(map_fun, (tf_args,))  # unpicklable map_fun/tf_args fail here, not in a node
    try:
        check_cluster(spark, num_executors)
    except ClusterError as e:
        raise ClusterError(f"TFCluster.run(num_executors={num_executors}): {summary(e)}{below(e)}") from e
    cluster = TFCluster(sc=sc, spark=spark, map_fun=map_fun, tf_args=tf_args, template=template,
                        release_port=bool(release_port), input_mode=input_mode, log_dir=log_dir, display=display,
                        queues=queues)
    log.info("cluster_template: %s", template)
    if tensorboard:
        from .. import tensorboard as start_tensorboard

        jobs = sorted(j for j in template if j in _FEEDING_JOBS)
        tb_node = template["worker" if "worker" in jobs else jobs[0]][0]
        log_dir = log_dir or os.path.join(cluster.working_dir, f"tensorboard_{tb_node}")
        if "://" not in log_dir:
            os.makedirs(log_dir, exist_ok=True)
        shown = start_tensorboard(log_dir)  # in a notebook, the panel showing the outcome
        cluster._tensorboard = getattr(shown, "outcome", shown)
    if input_mode == InputMode.TENSORFLOW:
        try:
            cluster._start_background(reservation_timeout)
        except BaseException:
            cluster._stop_tensorboard()
            raise
    return cluster
