"""Feeding a Spark DataFrame into tf.data in each barrier task (tfnb.run(..., data=df), ctx.dataset).

Real Spark (local[2]) throughout. TensorFlow is imported in two runs only (Keras under
MultiWorkerMirroredStrategy on a skewed DataFrame; the dataset options on one worker); the other
runs check the spill, counts and errors with train_fns that do not import it. The Spark Connect
test runs in its own process, which cannot share the JVM with the classic session.
"""
from __future__ import annotations

import os
from decimal import Decimal

import pyarrow as pa
import pytest

import tfnb
from tfnb._task import dataset
from tfnb._task import feed as feeding
from tfnb.data import feeding as driver_feed
from tfnb._task.context import WorkerContext
from tfnb.errors import ConfigError, WorkerError

from wholepart import finish_feed, spill_partition


def _ctx(info, num_workers=2) -> WorkerContext:
    return WorkerContext(task_index=0, num_workers=num_workers, job_name="chief", cluster_spec={},
                         tf_config={}, feed=info)


def _partition_sizes(df) -> list[int]:
    """Rows per non-empty partition, smallest first (small test frames: collects one int a row)."""
    from collections import Counter

    from pyspark.sql import functions as F

    return sorted(Counter(r[0] for r in df.select(F.spark_partition_id()).collect()).values())


def _skewed(spark, first: int = 900, second: int = 100):
    """x1, x2, arr[2] and a label y that is a linear function of them, in two partitions of 900/100 rows."""
    from pyspark.sql import functions as F

    ids = spark.range(0, first + second, 1, 1).repartitionByRange(2, F.col("id") >= first)
    x1 = (F.col("id") % 97) / 97.0
    x2 = (F.col("id") % 13) / 13.0
    return ids.select(
        x1.alias("x1"), x2.alias("x2"),
        F.array((x1 * x2).cast("float"), (1 - x1).cast("float")).alias("arr"),
        (3 * x1 - 2 * x2 + x1 * x2 + 0.5 * (1 - x1) + 1).alias("y"))


# ---------------------------------------------------------------- schema -> FeedSpec (driver)


def test_feed_spec_infers_numeric_and_array_columns(spark):
    df = spark.createDataFrame(
        [(1, 2, 3, 4, 1.0, 2.0, True, [1.0, 2.0], [1, 2])],
        "b tinyint, s smallint, i int, l bigint, f float, d double, t boolean, "
        "af array<float>, al array<bigint>")
    spec = driver_feed.feed_spec(df)
    assert tuple(c.name for c in spec.columns) == ("b", "s", "i", "l", "f", "d", "t", "af", "al")
    assert [(c.dtype, c.is_array) for c in spec.columns] == [
        ("int8", False), ("int16", False), ("int32", False), ("int64", False), ("float32", False),
        ("float64", False), ("bool", False), ("float32", True), ("int64", True)]


def test_unsupported_columns_are_named_with_the_fix(spark):
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    df = spark.createDataFrame(
        [("a", [[1.0]], Decimal("1.5"), {"k": 1.0}, 2.0)],
        "name string, nested array<array<double>>, dec decimal(10,2), m map<string,double>, ok double")
    df = df.withColumn("vec", array_to_vector(F.array(F.col("ok"))))
    with pytest.raises(ConfigError) as e:
        tfnb.run(lambda ctx: None, num_workers=2, data=df, spark=spark, display=False)
    msg = str(e.value)
    for col in ("'name'", "'nested'", "'dec'", "'m'", "'vec'"):
        assert col in msg
    assert "'ok'" not in msg
    assert "cast" in msg and "drop" in msg
    assert "F.flatten" in msg and "StringIndexer" in msg and "vector_to_array" in msg


def test_data_must_be_a_spark_dataframe(spark):
    import pandas as pd

    with pytest.raises(ConfigError, match="data must be a Spark DataFrame, got DataFrame; convert it"):
        tfnb.run(lambda ctx: None, num_workers=2, data=pd.DataFrame({"x": [1.0]}), spark=spark, display=False)


# ---------------------------------------------------------------- split (driver)


def test_split_balances_a_skewed_dataframe(spark):
    one_partition = spark.range(0, 1001, 1, 1)
    assert _partition_sizes(driver_feed.split_for_workers(one_partition, 2)[0]) == [500, 501]
    skewed = _skewed(spark).cache()
    try:
        assert _partition_sizes(skewed) == [100, 900]
        assert _partition_sizes(driver_feed.split_for_workers(skewed, 2)[0]) == [500, 500]
    finally:
        skewed.unpersist()


def test_split_feeds_a_cached_balanced_dataframe_as_it_is(spark):
    sc = spark.sparkContext
    split = spark.range(0, 1000, 1, 3).repartition(2).cache()  # what the README tells users to do
    even = spark.range(0, 1000, 1, 2).cache()                  # balanced, but only a count can tell
    try:
        split.count(), even.count()
        sc.setJobGroup("tfnb-split-test", "split_for_workers")
        assert driver_feed.split_for_workers(split, 2) == (split, None)
        assert sc.statusTracker().getJobIdsForGroup("tfnb-split-test") == []  # no job: the plan says it
        assert driver_feed.split_for_workers(even, 2) == (even, [500, 500])  # counted: train_fn knows them at once
        counted = len(sc.statusTracker().getJobIdsForGroup("tfnb-split-test"))
        assert counted >= 1  # a counting job in the JVM (its shuffle stage may count as a job of its own)
        one = split.coalesce(1).cache()
        assert driver_feed.split_for_workers(one, 1)[0] is one  # one worker: one partition needs no count either
        assert len(sc.statusTracker().getJobIdsForGroup("tfnb-split-test")) == counted
        one.unpersist()
        # the same DataFrame for 3 workers must still be split into 3
        assert _partition_sizes(driver_feed.split_for_workers(split, 3)[0]) == [333, 333, 334]
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        split.unpersist()
        even.unpersist()


# ---------------------------------------------------------------- spill and counts (task), no TensorFlow


def _batches(*columns):
    return [pa.RecordBatch.from_pydict(c) for c in columns]


def test_spill_counts_rows_and_array_length(tmp_path):
    spec = feeding.FeedSpec((feeding.FeedColumn("x", "float64", False), feeding.FeedColumn("v", "float32", True)))
    batches = _batches({"x": [1.0, 2.0], "v": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]}, {"x": [], "v": []},
                       {"x": [3.0], "v": [[7.0, 8.0, 9.0]]})
    spilled = spill_partition(spec, iter(batches), str(tmp_path))
    assert spilled.rows == 3 and dict(spilled.array_lengths) == {"v": 3}
    with pa.memory_map(spilled.path) as f:
        assert pa.ipc.open_file(f).read_all().column("x").to_pylist() == [1.0, 2.0, 3.0]
    info = finish_feed(spec, spilled, [3, 40])
    assert (info.state()["rows"], info.rows_per_worker) == (3, (3, 40))
    assert dataset.steps_per_epoch(_ctx(info), 2) == 1
    with pytest.raises(ConfigError, match=r"batch_size=4 but the smallest worker's part of the data has 3 rows "
                                          r"\(rows per worker: \[3, 40\]\).*lower batch_size to at most 3"):
        dataset.steps_per_epoch(_ctx(info), 4)
    assert dataset.steps_per_epoch(_ctx(info), 4, drop_remainder=False) == 1


def test_spill_rejects_ragged_arrays_and_nulls(tmp_path):
    spec = feeding.FeedSpec((feeding.FeedColumn("v", "float32", True),))
    with pytest.raises(ConfigError, match=r"column 'v' holds arrays of different lengths \(2, 3\).*pad or cut"):
        spill_partition(spec, iter(_batches({"v": [[1.0, 2.0]]}, {"v": [[1.0, 2.0, 3.0]]})), str(tmp_path))
    with pytest.raises(ConfigError, match=r"column 'v' has null values.*df.dropna\(subset=\['v'\]\)"):
        spill_partition(spec, iter(_batches({"v": [[1.0, None]]})), str(tmp_path))
    spec = feeding.FeedSpec((feeding.FeedColumn("x", "float64", False),))
    with pytest.raises(ConfigError, match=r"column 'x' has null values.*df.na.fill\(0, \['x'\]\)"):
        spill_partition(spec, iter(_batches({"x": [1.0, None]})), str(tmp_path))


def test_empty_part_and_missing_data_say_what_to_do(tmp_path):
    spec = feeding.FeedSpec((feeding.FeedColumn("x", "float64", False),))
    spilled = spill_partition(spec, iter([]), str(tmp_path))
    assert spilled.rows == 0 and os.path.exists(spilled.path)
    info = finish_feed(spec, spilled, [0, 12])
    with pytest.raises(ConfigError, match=r"worker\(s\) \[0\] got no rows of the data \(rows per worker: \[0, 12\]\)"):
        dataset.steps_per_epoch(_ctx(info), 1)
    with pytest.raises(ConfigError, match="this run has no data=; pass data=df to tfnb.run"):
        _ctx(None).steps_per_epoch(8)


# ---------------------------------------------------------------- streaming (task writes, train_fn reads), no Spark


class _Driver:
    """The driver's half of the row-count agreement (tfnb.run answers on its channel thread), for
    tasks played by threads: every task's report is answered to every stream at once."""

    def __init__(self, num_workers: int):
        import threading

        self.num_workers = num_workers
        self.streams: dict = {}
        self._reports: dict = {}
        self._lock = threading.Lock()

    def stream(self, rank: int, workdir) -> "feeding.FeedStream":
        self.streams[rank] = feeding.FeedStream(_V, str(workdir), self.num_workers)
        return self.streams[rank]

    def tell(self, rank: int):
        def tell(rows: int, done: bool) -> None:
            with self._lock:
                self._reports[rank] = (rows, done)
                answer = driver_feed.agree_counts(self._reports, self.num_workers)
                for s in self.streams.values() if answer else ():
                    s.heard(answer)
        return tell


def _id_batches(start: int, sizes, width: int = 64):
    """Arrow batches of a float32 array column whose first element is the row id."""
    import numpy as np

    for n in sizes:
        ids = np.arange(start, start + n, dtype="float32")
        start += n
        values = np.repeat(ids, width)
        offsets = pa.array(np.arange(0, n * width + 1, width, dtype="int32"))
        yield pa.RecordBatch.from_arrays([pa.ListArray.from_arrays(offsets, pa.array(values))], names=["v"])


_V = feeding.FeedSpec((feeding.FeedColumn("v", "float32", True),))


def _read_epochs(info, batch_size: int, epochs: int, shuffle: bool = False, seed: int | None = None) -> list:
    """Row ids train_fn's dataset would serve, one list per epoch (the dataset's reader without TensorFlow)."""
    part = dataset._Part(info, batch_size, None, None, True)
    return [[int(i) for x, _ in part.epoch(batch_size * 3, shuffle, seed) for i in x[:, 0]] for _ in range(epochs)]


def test_train_fn_reads_rows_before_the_partition_is_complete(tmp_path):
    import threading

    driver = _Driver(1)
    stream = driver.stream(0, tmp_path)
    first_rows = threading.Event()
    seen = {}

    def source():
        yield from _id_batches(0, [4096])
        # Without streaming the reader would get nothing until this generator ends: the wait would
        # time out instead of being released by the reader.
        seen["released_by_reader"] = first_rows.wait(timeout=60)
        yield from _id_batches(4096, [3000, 1000])

    def read():
        try:
            part = dataset._Part(stream.info, 100, None, None, True)
            epochs = []
            for _ in range(2):
                ids = []
                for x, _ in part.epoch(300, False, None):
                    if not first_rows.is_set():
                        seen["complete_at_first_rows"] = stream.info.state(lambda s: True)["final"] is not None
                        first_rows.set()
                    ids.extend(int(i) for i in x[:, 0])
                epochs.append(ids)
            seen["epochs"] = epochs
        except BaseException as e:  # noqa: BLE001 - reported by the assertions below
            seen["error"] = repr(e)
            first_rows.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert stream.pump(source(), driver.tell(0)) == [8096]
    reader.join(60)
    assert "error" not in seen, seen.get("error")
    assert seen["released_by_reader"] and seen["complete_at_first_rows"] is False
    assert seen["epochs"] == [list(range(8000))] * 2  # 80 whole batches of 100, the same rows each epoch
    assert stream.info.state()["rows"] == 8096 and stream.info.state()["lengths"] == {"v": 64}


def test_counts_from_the_driver_are_known_before_the_rows_arrive(tmp_path):
    import threading

    stream = feeding.FeedStream(_V, str(tmp_path), 2, counts=[5000, 4096])
    gate = threading.Event()
    seen = {}

    def source():
        gate.wait(timeout=60)  # nothing arrives until train_fn has asked for its steps
        yield from _id_batches(0, [3000, 2000])

    def train_fn_side():
        seen["steps"] = dataset.steps_per_epoch(_ctx(stream.info), 100)
        seen["rows_so_far"] = stream.info.state(lambda s: True)["rows"]
        gate.set()
        seen["epoch"] = _read_epochs(stream.info, 100, 1)[0]

    reader = threading.Thread(target=train_fn_side)
    reader.start()
    assert stream.pump(source(), lambda rows, done: None) == [5000, 4096]
    reader.join(60)
    assert seen["steps"] == 40 and seen["rows_so_far"] == 0  # the smallest worker's 4096 rows: 40 batches
    assert seen["epoch"] == list(range(4000))


def test_the_spill_goes_to_memory_when_the_host_has_room_and_is_removed(tmp_path):
    spec = feeding.FeedSpec(_V.columns, nbytes=64 << 20, memory_share=0.25)
    stream = feeding.FeedStream(spec, str(tmp_path), 2, counts=[300, 300])
    where = os.path.dirname(stream.info.path)
    assert where.startswith("/dev/shm/tfnb-feed-") and stream.pump(_id_batches(0, [300]), lambda r, d: None) == [300, 300]
    assert _read_epochs(stream.info, 100, 1) == [list(range(300))]
    # a task killed before its clean-up leaves its folder; the next spill on the host removes it
    dead = where.replace(f"-{os.getpid()}-", "-999999999-")
    os.mkdir(dead)
    stream.remove()
    assert not os.path.exists(where)
    (tmp_path / "d").mkdir()
    (tmp_path / "e").mkdir()
    disk = feeding.FeedStream(feeding.FeedSpec(_V.columns, nbytes=64 << 20, memory_share=0.0), str(tmp_path / "d"), 2)
    assert os.path.dirname(disk.info.path) == str(tmp_path / "d")  # TFNB_SPILL_MEMORY=0: Spark's local disk
    again = feeding.FeedStream(spec, str(tmp_path / "e"), 2)
    assert not os.path.exists(dead)
    again.remove()


def test_a_spill_larger_than_the_free_disk_is_refused_before_writing(tmp_path):
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    spec = feeding.FeedSpec(_V.columns, nbytes=4 * free, memory_share=0.25)
    with pytest.raises(ConfigError, match=r"needs about .* GiB of local disk on this host for its 1 worker\(s\) but "
                                          r".* free; point spark.local.dir / SPARK_LOCAL_DIRS at a larger disk"):
        feeding.FeedStream(spec, str(tmp_path), 2)


def test_streamed_workers_serve_equal_batches(tmp_path, monkeypatch):
    import threading

    # A report after every batch: the readers go through several safe counts before the final one.
    monkeypatch.setattr(feeding, "_TELL_EVERY", 0)
    parts = {0: [1000, 1000, 1000, 1000, 313], 1: [500] * 7 + [77], 2: [4000, 2500]}
    starts = {0: 0, 1: 100_000, 2: 200_000}
    driver = _Driver(3)
    for r in parts:
        (tmp_path / str(r)).mkdir()
    streams = {r: driver.stream(r, tmp_path / str(r)) for r in parts}
    out, errors = {}, []

    def read(rank):
        try:
            info = streams[rank].info
            out[rank] = _read_epochs(info, 64, 2) + _read_epochs(info, 64, 2, shuffle=True, seed=rank)
        except BaseException as e:  # noqa: BLE001 - reported by the assertions below
            errors.append(repr(e))

    def pump(rank):
        try:
            streams[rank].pump(_id_batches(starts[rank], parts[rank]), driver.tell(rank))
        except BaseException as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=f, args=(r,)) for r in parts for f in (read, pump)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    smallest = min(sum(p) for p in parts.values())  # 3577 rows: 55 batches of 64 per worker per epoch
    for rank, epochs in out.items():
        mine = set(range(starts[rank], starts[rank] + sum(parts[rank])))
        for ids in epochs:
            assert len(ids) == smallest // 64 * 64 and len(set(ids)) == len(ids) and set(ids) <= mine
        assert epochs[0] == epochs[1] == sorted(epochs[0])  # sequential: the same rows in order
        assert epochs[2] != epochs[3]  # shuffled: another order each epoch
    assert streams[2].info.rows_per_worker == (4313, 3577, 6500)


def test_no_rows_is_refused_by_the_task_and_train_fn(tmp_path):
    driver = _Driver(1)
    stream = driver.stream(0, tmp_path)
    with pytest.raises(ConfigError, match=r"data= has 0 rows \(rows per worker: \[0\]\).*df.count\(\) > 0"):
        stream.pump(iter([]), driver.tell(0))
    with pytest.raises(ConfigError, match="data= has 0 rows"):
        _read_epochs(stream.info, 8, 1)
    with pytest.raises(ConfigError, match=r"worker\(s\) \[1\] got no rows .* data= has 1 rows for 2 workers"):
        dataset._steps_for([1, 0], 1, True)


# ---------------------------------------------------------------- through tfnb.run, no TensorFlow


def _feed_report(ctx):
    import pyarrow as pa

    ctx.feed.rows_per_worker  # the counts are final once the file is complete
    with pa.memory_map(ctx.feed.path) as f:
        table = pa.ipc.open_file(f).read_all()
    try:
        ctx.steps_per_epoch(10_000)
        too_big = None
    except Exception as e:  # noqa: BLE001 - the test checks the message
        too_big = f"{type(e).__name__}: {e}"
    return {"rows": ctx.feed.state()["rows"], "rows_per_worker": list(ctx.feed.rows_per_worker),
            "min_rows": min(ctx.feed.rows_per_worker), "file_rows": table.num_rows,
            "lengths": ctx.feed.state()["lengths"],
            "steps": ctx.steps_per_epoch(32), "too_big": too_big, "path": ctx.feed.path}


def test_run_spills_each_workers_part(spark, no_orphans):
    df = _skewed(spark).cache()  # cached: its size is known, so the parts go to memory-backed /dev/shm
    df.count()
    try:
        out = tfnb.run(_feed_report, num_workers=2, data=df, spark=spark, display=False)
    finally:
        df.unpersist()
    assert out["path"].startswith("/dev/shm/tfnb-feed-") and not os.path.exists(os.path.dirname(out["path"]))
    assert sorted(out["rows_per_worker"]) == [500, 500] and out["file_rows"] == out["rows"] == 500
    assert out["min_rows"] == 500 and out["steps"] == 500 // 32 and out["lengths"] == {"arr": 2}
    assert out["too_big"].startswith("ConfigError: batch_size=10000 but the smallest worker's part of the data "
                                     "has 500 rows (rows per worker: [500, 500])")


def test_nulls_fail_the_run_with_the_fix(spark, no_orphans):
    from pyspark.sql import functions as F

    df = spark.range(0, 100, 1, 2).select(F.when(F.col("id") != 7, F.col("id") * 1.0).alias("x"))
    with pytest.raises(WorkerError) as e:
        tfnb.run(_feed_report, num_workers=2, data=df, spark=spark, display=False, max_attempts=1)
    assert e.value.exc_type.endswith("ConfigError")
    assert "column 'x' has null values" in str(e.value) and "dropna" in str(e.value)


def test_empty_dataframe_fails_the_run_with_the_fix(spark, no_orphans):
    # train_fn does not even read the data: a run fed no rows must still not pass as a success.
    df = spark.range(0, 10, 1, 2).where("id < 0").selectExpr("CAST(id AS double) AS x")
    with pytest.raises(WorkerError) as e:
        tfnb.run(lambda ctx: None, num_workers=2, data=df, spark=spark, display=False, max_attempts=1)
    assert e.value.exc_type.endswith("ConfigError")
    assert "data= has 0 rows (rows per worker: [0, 0])" in str(e.value) and "df.count() > 0" in str(e.value)


# ---------------------------------------------------------------- TensorFlow runs


def _train_keras(ctx, batch_size):
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    # Batches this worker's own dataset yields in one epoch, gathered from every worker.
    mine = sum(1 for _ in ctx.dataset(batch_size, label_col="y"))
    counts = strategy.gather(strategy.run(lambda: tf.constant([mine])), axis=0).numpy().tolist()
    steps = ctx.steps_per_epoch(batch_size)
    ran = []

    class CountSteps(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            ran.append(batch)

    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(4,))])
        model.compile(tf.keras.optimizers.SGD(0.2), "mse")
    ds = ctx.dataset(batch_size, label_col="y", shuffle=True, seed=7, strategy=strategy)
    history = model.fit(ds, epochs=2, steps_per_epoch=steps, verbose=0, callbacks=[CountSteps()])
    return {"counts": counts, "steps": steps, "keras_steps": len(ran), "loss": history.history["loss"],
            "rows_per_worker": list(ctx.feed.rows_per_worker), "input_width": int(model.input_shape[-1])}


@pytest.mark.slow
def test_keras_multiworker_on_a_skewed_dataframe(spark, no_orphans):
    # 90/10 rows in the input partitions; an uneven feed would hang MultiWorkerMirroredStrategy,
    # so the run's timeout turns a regression into a failure instead of a stuck suite.
    out = tfnb.run(_train_keras, num_workers=2, args=(16,), data=_skewed(spark), spark=spark,
                   display=False, timeout=300)
    assert out["rows_per_worker"] == [500, 500]
    assert out["counts"] == [500 // 16, 500 // 16] == [out["steps"]] * 2
    assert out["keras_steps"] == 2 * out["steps"]
    assert out["input_width"] == 4  # x1, x2 and the two elements of arr, inferred from the schema
    first, last = out["loss"]
    assert last < first / 4, out["loss"]  # a linear target: two epochs of SGD get most of the way


def _dataset_report(ctx):
    import numpy as np

    def rows(ds):
        return [tuple(np.asarray(t) for t in el) if isinstance(el, tuple) else np.asarray(el) for el in ds]

    out = {"steps": ctx.steps_per_epoch(8)}  # waits for the final counts: the cardinality is known
    ds = ctx.dataset(8, label_col="y")
    out["spec"] = [str(s) for s in ds.element_spec]
    out["cardinality"] = int(ds.cardinality())
    batches = rows(ds)
    out["n_batches"] = len(batches)
    ids = np.concatenate([x[:, 0] for x, _ in batches])
    out["ids"] = ids.tolist()
    out["consistent"] = all(
        np.allclose(x[:, 1], x[:, 0] * 0.5) and np.allclose(x[:, 2:], x[:, :1] + [0.0, 0.25, 0.5])
        and (y == x[:, 0].astype("int64") % 7).all() for x, y in batches)
    x, _ = rows(ctx.dataset(8, feature_cols=["v", "x"], label_col="y"))[0]
    out["explicit_ok"] = bool(np.allclose(x[:, 3], x[:, 0] * 0.5) and x.shape == (8, 4))
    only = rows(ctx.dataset(8, feature_cols=["x"]))
    out["features_only_shape"] = list(only[0].shape)
    x, y = rows(ctx.dataset(8, feature_cols=["x"], label_col="v"))[0]
    out["array_label"] = [list(y.shape), str(y.dtype), bool(np.allclose(y[:, 0], x[:, 0] * 2))]
    shuffled = rows(ctx.dataset(8, label_col="y", epochs=2, shuffle=True, seed=3))
    again = rows(ctx.dataset(8, label_col="y", epochs=2, shuffle=True, seed=3))
    half = len(shuffled) // 2
    e1 = np.concatenate([x[:, 0] for x, _ in shuffled[:half]])
    e2 = np.concatenate([x[:, 0] for x, _ in shuffled[half:]])
    out["shuffle"] = {"batches": len(shuffled), "repeatable": all(np.array_equal(a[0], b[0]) for a, b in zip(shuffled, again)),
                      "epochs_differ": not np.array_equal(e1, e2), "unique": len(set(e1.tolist())) == len(e1)}
    tail = rows(ctx.dataset(8, label_col="y", drop_remainder=False))
    out["remainder"] = [len(tail), int(tail[-1][0].shape[0])]
    # tf.data autotuning off (docs/data.md has the measurements), on again with a later with_options; a user's
    # AUTOTUNE stages on top still serve every batch
    import tensorflow as tf

    ds, on = ctx.dataset(8, label_col="y"), tf.data.Options()
    on.autotune.enabled = True
    mapped = ds.map(lambda x, y: (x * 2, y), num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    out["autotune"] = [ds.options().autotune.enabled, ds.with_options(on).options().autotune.enabled,
                       len(rows(mapped))]
    try:
        ctx.dataset(8, feature_cols=["x", "nope"])
    except Exception as e:  # noqa: BLE001 - the test checks the message
        out["unknown_col"] = f"{type(e).__name__}: {e}"
    return out


def test_dataset_columns_shuffle_and_remainder(spark, no_orphans):
    from pyspark.sql import functions as F

    df = spark.range(0, 101, 1, 3).select(
        F.col("id").alias("id"), (F.col("id") * 0.5).alias("x"),
        F.array(*[(F.col("id") + d).cast("float") for d in (0.0, 0.25, 0.5)]).alias("v"),
        (F.col("id") % 7).cast("int").alias("y"))
    # Small Arrow batches, so dataset batches span several of them.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "7")
    try:
        out = tfnb.run(_dataset_report, num_workers=1, data=df, spark=spark, display=False, timeout=300)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert out["spec"] == ["TensorSpec(shape=(8, 5), dtype=tf.float32, name=None)",
                           "TensorSpec(shape=(8,), dtype=tf.int64, name=None)"]
    assert out["cardinality"] == out["n_batches"] == out["steps"] == 101 // 8
    assert len(out["ids"]) == len(set(out["ids"])) == 96 and set(out["ids"]) <= set(range(101))
    assert out["consistent"] and out["explicit_ok"]
    assert out["features_only_shape"] == [8, 1]
    assert out["array_label"] == [[8, 3], "float32", True]
    assert out["shuffle"] == {"batches": 24, "repeatable": True, "epochs_differ": True, "unique": True}
    assert out["remainder"] == [13, 5]
    assert out["autotune"] == [False, True, out["steps"]]
    assert out["unknown_col"].startswith("ConfigError: feature_cols has ['nope'], not among the fed columns")


# Feeding on a Spark Connect session: tests/test_masters.py::test_spark_connect_session.
