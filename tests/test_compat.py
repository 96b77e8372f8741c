"""tfnb.compat: TensorFlowOnSpark 2.2.5 programs with only the import changed, on a real local[2] Spark.

The Keras programs follow TensorFlowOnSpark's examples/mnist/keras/mnist_tf.py (InputMode.TENSORFLOW)
and mnist_spark.py (InputMode.SPARK) on scikit-learn's digits; the other programs skip TensorFlow
so the many cluster runs stay cheap.
"""
from __future__ import annotations

import errno
import io
import getpass
import json
import os
import socket
import time
import urllib.request

import pytest

from tfnb.compat import TFCluster, TFNode
from tfnb.notebook.console import ConsoleDisplay
from tfnb.errors import ClusterError, ConfigError, RunTimeoutError, WorkerError


_LOCAL_DIRS: dict = {}


def _local_dirs(_):
    return os.environ.get("SPARK_LOCAL_DIRS", "")


@pytest.fixture
def no_orphans(spark):
    """No train_fn process of *this* Spark session outlives its test.

    Scoped to the session's block manager directories (where tfnb puts each task's scratch dir,
    named on the child's command line), so runs of other test processes on a shared machine do
    not count; conftest's machine-wide check reports them.
    """
    from conftest import child_processes

    sc = spark.sparkContext
    if sc.applicationId not in _LOCAL_DIRS:
        _LOCAL_DIRS[sc.applicationId] = [d for d in sc.parallelize([0], 1).map(_local_dirs).first().split(",") if d]
    dirs = _LOCAL_DIRS[sc.applicationId]
    assert dirs, "Spark gave its Python workers no SPARK_LOCAL_DIRS"

    def ours():
        return {p for p in child_processes() if any(d in p for d in dirs)}

    before = ours()
    yield
    deadline = time.monotonic() + 60  # bounds a hang only: they end in well under a second
    left = ours() - before
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = ours() - before
    assert not left, f"map_fun processes left running: {left}"


@pytest.fixture
def no_tf(monkeypatch):
    # These map_funs never import TensorFlow; skip tfnb's early import to keep the runs cheap.
    monkeypatch.setenv("TFNB_PREIMPORT", "")


def write_record(out_dir, ctx, **extra):
    rec = {"executor_id": ctx.executor_id, "worker_num": ctx.worker_num, "job_name": ctx.job_name,
           "task_index": ctx.task_index, "cluster_spec": ctx.cluster_spec, "num_workers": ctx.num_workers,
           "defaultFS": ctx.defaultFS, "working_dir": ctx.working_dir, "cwd": os.getcwd(),
           "tf_config": json.loads(os.environ["TF_CONFIG"]) if "TF_CONFIG" in os.environ else None,
           "pid": os.getpid(), **extra}
    with open(os.path.join(out_dir, f"node-{ctx.executor_id}.json"), "w") as f:
        json.dump(rec, f)


def read_records(out_dir):
    recs = [json.loads(open(os.path.join(out_dir, n)).read()) for n in sorted(os.listdir(out_dir))
            if n.startswith("node-")]
    return sorted(recs, key=lambda r: r["executor_id"])


# ---------------------------------------------------------------- TFNode without Spark


def test_hdfs_path_matches_tensorflowonspark():
    # The table of TensorFlowOnSpark's test/test_TFNode.py::test_hdfs_path.
    cwd = os.getcwd()
    user = getpass.getuser()
    fs = ["file://", "hdfs://", "viewfs://"]
    paths = {
        "hdfs://foo/bar": ["hdfs://foo/bar", "hdfs://foo/bar", "hdfs://foo/bar"],
        "viewfs://foo/bar": ["viewfs://foo/bar", "viewfs://foo/bar", "viewfs://foo/bar"],
        "file://foo/bar": ["file://foo/bar", "file://foo/bar", "file://foo/bar"],
        "/foo/bar": ["file:///foo/bar", "hdfs:///foo/bar", "viewfs:///foo/bar"],
        "foo/bar": [f"file://{cwd}/foo/bar", f"hdfs:///user/{user}/foo/bar", f"viewfs:///user/{user}/foo/bar"],
    }
    for i, scheme in enumerate(fs):
        ctx = type("MockContext", (), {"defaultFS": scheme, "working_dir": cwd})
        for path, expected in paths.items():
            assert TFNode.hdfs_path(ctx, path) == expected[i]
    node = TFNode.NodeContext(0, "worker", 0, {"worker": ["h:1"]}, "file://", "/home/me")
    assert node.absolute_path("model") == "file:///home/me/model"


def make_feed(tmp_path, partitions, *, mode="train", epochs=1):
    """A node's feed file as tfnb.compat spills it, from lists of rows per input partition."""
    import pyarrow as pa

    from tfnb.compat import _feed

    batches = []
    for index, rows in enumerate(partitions):
        chunks = list(_feed._chunk_partition(index, iter(rows)))
        if chunks:
            part, seq, n, data = zip(*chunks)
            batches.append(pa.RecordBatch.from_pydict({"part": list(part), "seq": list(seq), "rows": list(n),
                                                       "data": list(data)}))
    tmp_path.mkdir(exist_ok=True)
    feeder = _feed.RddFeeder(mode=mode, epochs=epochs)
    spilled = feeder.spill(iter(batches[::-1]), str(tmp_path))  # arrival order must not matter
    return TFNode.FeedManager(feeder.finish(spilled, [spilled.rows]))


def test_datafeed_like_tensorflowonspark(tmp_path):
    # TensorFlowOnSpark's test/test_TFNode.py::test_datafeed: 10 numbers, then the end of the feed.
    feed = TFNode.DataFeed(make_feed(tmp_path, [list(range(10))]))
    assert not feed.done_feeding
    batch = feed.next_batch(2)
    assert len(batch) == 2 and sum(batch) == 1
    batch = feed.next_batch(4)
    assert len(batch) == 4 and sum(batch) == 14
    assert not feed.should_stop()
    batch = feed.next_batch(10)  # more than is left
    assert len(batch) == 4 and sum(batch) == 30
    assert feed.should_stop() and feed.next_batch(5) == []


def test_datafeed_partitions_epochs_mapping_terminate(tmp_path):
    parts = [[(i, -i) for i in range(p * 100, p * 100 + n)] for p, n in enumerate([30, 0, 45, 7])]
    # Inference mode (train_mode=False): a batch never spans two input partitions.
    mgr = make_feed(tmp_path / "a", parts, mode="inference")
    feed = TFNode.DataFeed(mgr, train_mode=False)
    sizes = []
    while not feed.should_stop():
        sizes.append(len(feed.next_batch(20)))
    assert sizes == [20, 10, 20, 20, 5, 7]
    # Training mode: batches run across partitions and epochs; a second DataFeed shares the position.
    mgr = make_feed(tmp_path / "b", parts, epochs=2)
    first = TFNode.DataFeed(mgr, True, input_mapping={"b_neg": "neg", "a_id": "id"})
    got = first.next_batch(50)
    assert got["id"] == list(range(30)) + list(range(200, 220)) and got["neg"] == [-i for i in got["id"]]
    second = TFNode.DataFeed(mgr)
    rest = second.next_batch(1000)
    assert len(rest) == 2 * 82 - 50 and rest[-1] == (306, -306) and second.should_stop() and first.should_stop()
    # terminate() ends the feed early.
    mgr = make_feed(tmp_path / "c", parts)
    feed = TFNode.DataFeed(mgr)
    feed.next_batch(3)
    feed.terminate()
    assert feed.should_stop() and feed.next_batch(3) == []


def test_datafeed_in_tensorflow_mode_fails_fast():
    with pytest.raises(ConfigError, match="InputMode.TENSORFLOW"):
        TFNode.DataFeed(TFNode.FeedManager(None))


def test_ranges_split_rows_contiguously():
    from tfnb.compat._feed import ranges

    assert ranges(1797, [0, 1], "train") == ((0, 0, 898), (1, 898, 1796))
    assert ranges(1797, [0, 1], "inference") == ((0, 0, 898), (1, 898, 1797))
    assert ranges(5, [1, 2, 3], "inference") == ((1, 0, 1), (2, 1, 3), (3, 3, 5))


# ---------------------------------------------------------------- cluster runs without TensorFlow


def test_too_many_executors_fails_fast(spark):
    # TensorFlowOnSpark waits reservation_timeout (600 s) for nodes Spark cannot schedule.
    with pytest.raises(ClusterError, match="needs 3 task slots"):
        TFCluster.run(spark.sparkContext, lambda args, ctx: None, {}, 3, 0, input_mode=TFCluster.InputMode.SPARK)
    with pytest.raises(ConfigError, match="no chief or worker|cannot hold"):
        TFCluster.run(spark.sparkContext, lambda args, ctx: None, {}, 2, 2)


def record_and_check_port(args, ctx):
    port = int(ctx.cluster_spec[ctx.job_name][ctx.task_index].rsplit(":", 1)[1])

    def bindable():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("", port))
            return True
        except OSError as e:
            assert e.errno == errno.EADDRINUSE
            return False
        finally:
            s.close()

    before = {"held": ctx.tmp_socket is not None, "bindable": bindable(),
              "socket_port": ctx.tmp_socket.getsockname()[1] if ctx.tmp_socket is not None else None}
    if ctx.tmp_socket is not None:
        ctx.release_port()
    write_record(args["out"], ctx, port=port, before=before,
                 after={"held": ctx.tmp_socket is not None, "bindable": bindable()})


def test_tensorflow_mode_roles_and_ports(spark, tmp_path, no_tf, no_orphans):
    cluster = TFCluster.run(spark.sparkContext, record_and_check_port, {"out": str(tmp_path)}, 2, 0,
                            master_node="chief", display=False)
    assert cluster.tensorboard_url() is None
    cluster.shutdown()
    chief, worker = read_records(tmp_path)
    spec = chief["cluster_spec"]
    assert list(spec) == ["chief", "worker"] and len(spec["chief"]) == len(spec["worker"]) == 1
    assert (chief["job_name"], chief["task_index"], chief["executor_id"], chief["worker_num"]) == ("chief", 0, 0, 0)
    assert (worker["job_name"], worker["task_index"], worker["executor_id"]) == ("worker", 0, 1)
    assert chief["num_workers"] == worker["num_workers"] == 2 and worker["cluster_spec"] == spec
    assert chief["tf_config"] == {"cluster": spec, "task": {"type": "chief", "index": 0}, "environment": "cloud"}
    assert worker["tf_config"]["task"] == {"type": "worker", "index": 0}
    assert chief["defaultFS"] == "file://" and chief["working_dir"] == os.getcwd()
    # map_fun runs where a Spark task runs (the driver's directory on a local master), as in TensorFlowOnSpark.
    assert chief["cwd"] == os.getcwd()
    for rec in (chief, worker):  # release_port=True: the port is free before map_fun starts
        assert rec["before"] == {"held": False, "bindable": True, "socket_port": None}


@pytest.mark.slow  # TensorBoard's start takes 10-30 s on a busy machine
def test_tensorboard_runs_on_the_driver_until_shutdown(spark, tmp_path, no_tf, no_orphans):
    cluster = TFCluster.run(spark.sparkContext, lambda args, ctx: None, {}, 2, 0, tensorboard=True,
                            log_dir=str(tmp_path / "logs"), master_node="chief", display=False)
    url = cluster.tensorboard_url()
    assert url and urllib.request.urlopen(url, timeout=30).status == 200
    cluster.shutdown()
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)  # shutdown stopped the TensorBoard it started


def test_release_port_false_keeps_port_until_map_fun_releases_it(spark, tmp_path, no_tf, no_orphans):
    cluster = TFCluster.run(spark.sparkContext, record_and_check_port, {"out": str(tmp_path)}, 2, 0,
                            release_port=False, display=False)
    cluster.shutdown()
    for rec in read_records(tmp_path):
        assert rec["job_name"] == "worker" and rec["tf_config"] is None  # no master_node: no TF_CONFIG
        assert rec["before"] == {"held": True, "bindable": False, "socket_port": rec["port"]}
        assert rec["after"] == {"held": False, "bindable": True}


def ps_blocks_forever(args, ctx):
    import threading

    write_record(args["out"], ctx)
    if ctx.job_name == "ps":
        threading.Event().wait()  # like server.join(): ps nodes serve until the cluster shuts down
    # the chief works while the ps serves (a chief that ends at once may stop the ps before it started)
    import time

    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(args["out"], "node-0.json")) and time.monotonic() < deadline:
        time.sleep(0.1)


def test_ps_nodes_are_stopped_when_workers_finish(spark, tmp_path, no_tf, no_orphans):
    cluster = TFCluster.run(spark.sparkContext, ps_blocks_forever, {"out": str(tmp_path)}, 2, 1,
                            master_node="chief", display=False)
    cluster.shutdown()
    ps, chief = read_records(tmp_path)
    assert (ps["job_name"], ps["task_index"], ps["executor_id"]) == ("ps", 0, 0)
    assert (chief["job_name"], chief["task_index"], chief["executor_id"]) == ("chief", 0, 1)
    assert list(chief["cluster_spec"]) == ["ps", "chief"] and chief["num_workers"] == 1
    assert ps["tf_config"]["task"] == {"type": "ps", "index": 0}


def fail_in_tensorflow_mode(args, ctx):
    if ctx.executor_id == 1:
        raise KeyError("missing input file")


def test_tensorflow_mode_failure_reaches_driver_at_shutdown(spark, no_tf, no_orphans):
    cluster = TFCluster.run(spark.sparkContext, fail_in_tensorflow_mode, {}, 2, 0, display=False)
    with pytest.raises(ConfigError, match="needs InputMode.SPARK"):
        cluster.train(spark.sparkContext.parallelize(range(4)))
    with pytest.raises(WorkerError, match="missing input file") as info:
        cluster.shutdown()
    assert info.value.exc_type == "KeyError" and "fail_in_tensorflow_mode" in info.value.worker_traceback
    cluster.shutdown()  # a second call has nothing left to report


def test_shutdown_timeout_stops_every_node(spark, no_tf, no_orphans):
    cluster = TFCluster.run(spark.sparkContext, lambda args, ctx: time.sleep(600), {}, 2, 0, display=False)
    with pytest.raises(RunTimeoutError, match="shutdown"):
        cluster.shutdown(timeout=2)


def square_numbers(args, ctx):
    feed = TFNode.DataFeed(ctx.mgr, train_mode=False)
    batch_no = 0
    while not feed.should_stop():
        batch = feed.next_batch(args["batch_size"])
        feed.batch_results([(x * x, ctx.executor_id, batch_no) for x in batch])
        batch_no += 1


def test_inference_returns_results_in_order_per_partition(spark, no_tf, no_orphans):
    sizes = [0, 7, 130, 1, 45, 60]
    rdd = spark.sparkContext.parallelize(range(len(sizes)), len(sizes)).flatMap(
        lambda p: range(p * 1000, p * 1000 + sizes[p]))
    cluster = TFCluster.run(spark.sparkContext, square_numbers, {"batch_size": 16}, 2, 0,
                            input_mode=TFCluster.InputMode.SPARK, display=False)
    out = cluster.inference(rdd)
    cluster.shutdown()
    got = out.glom().collect()
    assert [[r[0] for r in part] for part in got] == [[x * x for x in part] for part in rdd.glom().collect()]
    results = [r for part in got for r in part]
    assert {r[1] for r in results} == {0, 1}  # both nodes took part
    batches: dict = {}
    for (sq, node, batch_no) in results:
        batches.setdefault((node, batch_no), set()).add(int(round(sq ** 0.5)) // 1000)
    assert all(len(parts) == 1 for parts in batches.values())  # train_mode=False: no batch spans partitions


def count_rows_then(args, ctx):
    feed = TFNode.DataFeed(ctx.mgr)
    seen = []
    while not feed.should_stop():
        batch = feed.next_batch(10)
        seen.extend(batch)
        if args.get("fail_during") == ctx.executor_id and len(seen) >= 20:
            raise ValueError(f"bad record at row {len(seen)}")
        if args.get("slow"):
            time.sleep(0.2)
    write_record(args["out"], ctx, seen=seen)
    if args.get("fail_after") == ctx.executor_id:
        raise RuntimeError("export failed after feeding")


def test_train_feeds_every_node_the_same_rows_each_epoch(spark, tmp_path, no_tf, no_orphans):
    rdd = spark.sparkContext.parallelize(range(101), 3)
    cluster = TFCluster.run(spark.sparkContext, count_rows_then, {"out": str(tmp_path)}, 2, 0,
                            input_mode=TFCluster.InputMode.SPARK, master_node="chief", display=False)
    cluster.train(rdd, num_epochs=3)
    cluster.shutdown()
    chief, worker = read_records(tmp_path)
    assert chief["seen"] == list(range(50)) * 3 and worker["seen"] == list(range(50, 100)) * 3
    with pytest.raises(ConfigError, match="shut down"):
        cluster.train(rdd)


def test_exception_during_feeding_reaches_driver(spark, tmp_path, no_tf, no_orphans):
    cluster = TFCluster.run(spark.sparkContext, count_rows_then, {"out": str(tmp_path), "fail_during": 1, "slow": True},
                            2, 0, input_mode=TFCluster.InputMode.SPARK, display=False)
    with pytest.raises(WorkerError, match="bad record at row 20") as info:
        cluster.train(spark.sparkContext.parallelize(range(1000), 4), num_epochs=1)
    assert info.value.exc_type == "ValueError" and info.value.task_index == 1
    assert not os.listdir(tmp_path)  # the other node was stopped mid-feed, not left to finish


def test_exception_after_feeding_reaches_driver(spark, tmp_path, no_tf, no_orphans):
    cluster = TFCluster.run(spark.sparkContext, count_rows_then, {"out": str(tmp_path), "fail_after": 0},
                            2, 0, input_mode=TFCluster.InputMode.SPARK, display=False)
    with pytest.raises(WorkerError, match="export failed after feeding") as info:
        cluster.train(spark.sparkContext.parallelize(range(100), 2), num_epochs=1)
    assert info.value.exc_type == "RuntimeError"
    seen = {r["executor_id"]: r["seen"] for r in read_records(tmp_path)}
    assert seen[0] == list(range(50))  # the failure came after node 0 had read every one of its rows
    # node 1 may be stopped before it writes its record; if it wrote one, it holds all its rows too
    assert seen.get(1, list(range(50, 100))) == list(range(50, 100))


# ---------------------------------------------------------------- Keras programs (TensorFlow)


def mnist_tf_main_fun(args, ctx):
    """examples/mnist/keras/mnist_tf.py, on scikit-learn's 8x8 digits instead of tfds MNIST."""
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()

    BATCH_SIZE = args["batch_size"]
    NUM_WORKERS = args["cluster_size"]

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    datasets = tf.data.Dataset.from_tensor_slices((images, digits.target))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train_datasets_unbatched = datasets.with_options(options).repeat().shuffle(args["buffer_size"], seed=1)

    def build_and_compile_cnn_model():
        model = tf.keras.Sequential([
            tf.keras.layers.Conv2D(8, 3, activation='relu', input_shape=(8, 8, 1)),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(32, activation='relu'),
            tf.keras.layers.Dense(10, activation='softmax')
        ])
        model.compile(loss=tf.keras.losses.sparse_categorical_crossentropy,
                      optimizer=tf.keras.optimizers.Adam(learning_rate=0.01), metrics=['accuracy'])
        return model

    GLOBAL_BATCH_SIZE = BATCH_SIZE * NUM_WORKERS
    train_datasets = train_datasets_unbatched.batch(GLOBAL_BATCH_SIZE)
    model_dir = ctx.absolute_path(args["model_dir"])
    tf.io.gfile.makedirs(model_dir)
    callbacks = [tf.keras.callbacks.ModelCheckpoint(filepath=model_dir + "/weights-{epoch:04d}",
                                                    save_weights_only=True)]
    with strategy.scope():
        multi_worker_model = build_and_compile_cnn_model()
    history = multi_worker_model.fit(x=train_datasets, epochs=args["epochs"], steps_per_epoch=args["steps_per_epoch"],
                                     callbacks=callbacks, verbose=args.get("verbose", 0))
    from tfnb import compat

    compat.export_saved_model(multi_worker_model, args["export_dir"], ctx.job_name == 'chief')
    write_record(args["out"], ctx, loss=history.history["loss"], accuracy=history.history["accuracy"],
                 replicas=strategy.num_replicas_in_sync)


@pytest.mark.slow
def test_mnist_keras_tensorflow_mode(spark, tmp_path, no_orphans):
    args = {"batch_size": 32, "buffer_size": 2000, "cluster_size": 2, "epochs": 3, "steps_per_epoch": 20,
            "model_dir": str(tmp_path / "mnist_model"), "export_dir": str(tmp_path / "mnist_export"),
            "out": str(tmp_path)}
    cluster = TFCluster.run(spark.sparkContext, mnist_tf_main_fun, args, args["cluster_size"], num_ps=0,
                            tensorboard=False, input_mode=TFCluster.InputMode.TENSORFLOW, master_node='chief',
                            log_dir=args["model_dir"], display=False)
    cluster.shutdown()
    chief, worker = read_records(tmp_path)
    assert chief["replicas"] == worker["replicas"] == 2
    assert chief["loss"][-1] < chief["loss"][0] and chief["accuracy"][-1] > 0.5
    assert any(n.startswith("weights-0003") for n in os.listdir(tmp_path / "mnist_model"))
    assert (tmp_path / "mnist_export" / "saved_model.pb").exists()  # the chief's export


def mnist_spark_main_fun(args, ctx):
    """examples/mnist/keras/mnist_spark.py, on scikit-learn's 8x8 digits."""
    import numpy as np
    import tensorflow as tf
    from tfnb.compat import TFNode

    strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()

    def build_and_compile_cnn_model():
        model = tf.keras.Sequential([
            tf.keras.layers.Conv2D(8, 3, activation='relu', input_shape=(8, 8, 1)),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(32, activation='relu'),
            tf.keras.layers.Dense(10, activation='softmax')
        ])
        model.compile(loss=tf.keras.losses.sparse_categorical_crossentropy,
                      optimizer=tf.keras.optimizers.Adam(learning_rate=0.01), metrics=['accuracy'])
        return model

    tf_feed = TFNode.DataFeed(ctx.mgr, False)
    fed = []

    def rdd_generator():
        while not tf_feed.should_stop():
            batch = tf_feed.next_batch(1)
            if len(batch) > 0:
                example = batch[0]
                fed.append(example[1])
                image = np.array(example[0]).astype(np.float32) / 16.0
                image = np.reshape(image, (8, 8, 1))
                label = np.array(example[1]).astype(np.float32)
                label = np.reshape(label, (1,))
                yield (image, label)
            else:
                return

    ds = tf.data.Dataset.from_generator(rdd_generator, (tf.float32, tf.float32),
                                        (tf.TensorShape([8, 8, 1]), tf.TensorShape([1])))
    ds = ds.batch(args["batch_size"])

    tf.io.gfile.makedirs(args["model_dir"])
    filepath = args["model_dir"] + "/weights-{epoch:04d}"
    callbacks = [tf.keras.callbacks.ModelCheckpoint(filepath=filepath, verbose=0, save_weights_only=True)]

    with strategy.scope():
        multi_worker_model = build_and_compile_cnn_model()

    # As in the example: stop at 90% of the steps the fed data allows.
    steps_per_epoch = 1797 / args["batch_size"]
    steps_per_epoch_per_worker = steps_per_epoch / ctx.num_workers
    max_steps_per_worker = int(steps_per_epoch_per_worker * 0.9)

    history = multi_worker_model.fit(x=ds, epochs=args["epochs"], steps_per_epoch=max_steps_per_worker,
                                     callbacks=callbacks, verbose=args.get("verbose", 0))
    write_record(args["out"], ctx, loss=history.history["loss"], fed=len(fed))

    # terminating feed tells spark to skip processing further partitions
    tf_feed.terminate()


@pytest.mark.slow
def test_mnist_keras_spark_mode(spark, tmp_path, no_orphans):
    from sklearn.datasets import load_digits

    digits = load_digits()
    rows = [(list(map(int, image.reshape(-1))), int(label)) for image, label in zip(digits.images, digits.target)]
    images_labels = spark.sparkContext.parallelize(rows, 5)
    # verbose=1 as in the example: Keras' carriage-return bar on every worker
    args = {"batch_size": 32, "epochs": 3, "model_dir": str(tmp_path / "mnist_model"), "out": str(tmp_path),
            "verbose": 1}
    console = io.StringIO()
    cluster = TFCluster.run(spark.sparkContext, mnist_spark_main_fun, args, 2, num_ps=0, tensorboard=False,
                            input_mode=TFCluster.InputMode.SPARK, master_node='chief',
                            display=ConsoleDisplay(console, num_workers=2))
    cluster.train(images_labels, args["epochs"])
    cluster.shutdown()
    # the console gets a few lines per worker per epoch; the run's log file gets every line
    shown = console.getvalue().splitlines()
    for label in ("[chief 0]", "[worker 1]"):
        mine = [line for line in shown if line.startswith(label)]
        assert len(mine) <= 5 * args["epochs"] + 5, "\n".join(mine)
        assert sum(f"Epoch {e}/3" in line for line in mine for e in (1, 2, 3)) == 3, mine
    log_file = next(line.split(": ", 1)[1] for line in shown if "every line of this run" in line)
    logged = open(log_file).read()
    assert all(f"Epoch {e}/3" in logged for e in (1, 2, 3)) and "accuracy" in logged
    chief, worker = read_records(tmp_path)
    assert chief["job_name"] == "chief" and worker["job_name"] == "worker"
    assert chief["loss"][-1] < chief["loss"][0]
    # MWMS pulls the same number of rows through each node's generator, and no node ran dry.
    assert chief["fed"] == worker["fed"] and 0 < chief["fed"] <= 898 * 3
    assert any(n.startswith("weights-0003") for n in os.listdir(tmp_path / "mnist_model"))
