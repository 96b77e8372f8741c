"""Refusals of ``data=`` and of ``ctx.dataset(...)``: the worker side needs no Spark (a context built
as the task builds it); the DataFrame checks use the shared local[2] session."""
from __future__ import annotations

import os

import tfnb
from tfnb import ConfigError

from refusals import Refusals, case, one, table


def _fed_ctx(env, rows: int = 10, width: int = 4, null: bool = False, ragged: bool = False):
    """A train_fn's context for a run fed rows of (x: array<float>[width], y: double), as the task builds it."""
    import pyarrow as pa

    from tfnb._task.context import WorkerContext
    from tfnb._task.feed import FeedColumn, FeedSpec

    from wholepart import finish_feed, spill_partition

    xs = [[float(i)] * (width + (i % 2 if ragged else 0)) for i in range(rows)]
    ys = [None if null and i == 3 else float(i % 2) for i in range(rows)]
    batch = pa.RecordBatch.from_arrays([pa.array(xs, pa.list_(pa.float32())), pa.array(ys, pa.float64())],
                                       names=["x", "y"])
    spec = FeedSpec((FeedColumn("x", "float32", True), FeedColumn("y", "float64", False)))
    spilled = spill_partition(spec, iter([batch]), str(env.tmp))
    return WorkerContext(task_index=0, num_workers=2, job_name="chief", cluster_spec={}, tf_config={},
                         feed=finish_feed(spec, spilled, [rows, rows]))


@case("data", "`ctx.dataset(...)` in a run without `data=`", ConfigError, "this run has no data=",
      "pass data=df to tfnb.run", says="pass data=df, or build the tf.data pipeline yourself")
def dataset_without_data(env):
    from tfnb._task.context import WorkerContext

    WorkerContext(task_index=0, num_workers=2, job_name="chief", cluster_spec={}, tf_config={}).dataset(32)


@case("data", "`ctx.steps_per_epoch(0)`", ConfigError, "batch_size=0", "int >= 1", says="an int >= 1")
def dataset_batch_size_zero(env):
    ctx = _fed_ctx(env)
    yield
    ctx.steps_per_epoch(0)


def _dataset(env, **kwargs):
    """``ctx.dataset(**kwargs)`` in a fed run, its context built before the (timed) call."""
    ctx = _fed_ctx(env)
    yield
    ctx.dataset(**kwargs)


table("data", ConfigError, _dataset, [
    ("dataset_batch_larger_than_rows", dict(batch_size=64, label_col="y"),
     "`batch_size` above the smallest worker's rows", ("batch_size=64", "lower batch_size to at most 10"),
     "lower batch_size, feed more rows, or drop_remainder=False"),
    ("dataset_unknown_label", dict(batch_size=2, label_col="label"),
     "`label_col` not a fed column", ("label_col='label'", "the columns are ['x', 'y']"),
     "choose one of the fed columns (listed)"),
    ("dataset_unknown_feature", dict(batch_size=2, feature_cols=["x", "z"], label_col="y"),
     "`feature_cols` with an unknown column", ("['z']", "choose from those"),
     "choose from the fed columns, or add the column to data="),
    ("dataset_label_in_features", dict(batch_size=2, feature_cols=["x", "y"], label_col="y"),
     "`label_col` also in `feature_cols`", ("label_col='y'", "take it out of feature_cols"),
     "take the label out of feature_cols"),
    ("dataset_epochs_zero", dict(batch_size=2, label_col="y", epochs=0),
     "`epochs=0`", ("epochs=0", "'auto'"), "an int >= 1, None (repeat) or 'auto'"),
    ("dataset_remainder_with_strategy", dict(batch_size=2, label_col="y", strategy=object(), drop_remainder=False),
     "`drop_remainder=False` with `strategy=`", ("drop_remainder=False", "leave drop_remainder=True"),
     "leave drop_remainder=True with a strategy"),
])
table("data", ConfigError, _fed_ctx, [
    ("feed_nulls", dict(null=True),
     "null values in a fed column", ("column 'y' has null values", "df.na.fill(0, ['y'])"),
     "fill them (df.na.fill) or drop those rows (df.dropna)"),
    ("feed_ragged_arrays", dict(ragged=True),
     "arrays of different lengths", ("column 'x'", "pad or cut them to one length"),
     "pad or cut the arrays to one length (F.slice/F.concat)"),
])


@case("data", "`data=<pandas DataFrame>`", ConfigError, "got DataFrame", "spark.createDataFrame",
      says="convert it with spark.createDataFrame", spark=True)
def data_pandas(env):
    import pandas as pd

    env.spark  # the session exists: the refusal is about data=, not the cluster
    tfnb.run(one, num_workers=2, data=pd.DataFrame({"x": [1.0]}), display=False)


@case("data", "a string column in `data=`", ConfigError, "'name' (string", "cast('double')",
      says="cast or drop non-numeric columns", spark=True)
def data_string_column(env):
    df = env.spark.createDataFrame([(1.0, "a")], "x double, name string")
    yield
    tfnb.run(one, num_workers=2, data=df, display=False)


@case("data", "two columns named `x` in `data=`", ConfigError, "named 'x'", "rename them",
      says="rename them (df.toDF(*names))", spark=True)
def data_duplicate_columns(env):
    df = env.spark.createDataFrame([(1.0, 2.0)], "x double, y double").toDF("x", "x")
    yield
    tfnb.run(one, num_workers=2, data=df, display=False)


@case("data", "`data=` without columns", ConfigError, "no columns", "select the feature and label columns",
      says="select the feature and label columns", spark=True)
def data_no_columns(env):
    tfnb.run(one, num_workers=2, data=env.spark.range(4).select(), display=False)


@case("data", "`TFNB_SPILL_MEMORY=2`", ConfigError, "TFNB_SPILL_MEMORY=2.0", "between 0 and 1",
      says="a share of free memory between 0 and 1 (0: local disk)", spark=True)
def data_spill_memory(env):
    env.setenv("TFNB_SPILL_MEMORY", "2")
    tfnb.run(one, num_workers=2, data=env.spark.createDataFrame([(1.0,)], "x double"), display=False)


@case("data", "a fed part larger than the free local disk", ConfigError, "of local disk on this host",
      "spark.local.dir / SPARK_LOCAL_DIRS", says="point Spark's local dirs at a larger disk")
def data_spill_larger_than_disk(env):
    from tfnb._task.feed import FeedColumn, FeedSpec, FeedStream

    st = os.statvfs(env.tmp)
    FeedStream(FeedSpec((FeedColumn("x", "float64", False),), nbytes=4 * st.f_bavail * st.f_frsize), str(env.tmp), 2)


@case("data", "`data=` with `num_ps=1`", ConfigError, "num_ps=1", "tfnb.stage",
      says="stage files per worker with ps, or num_ps=0")
def data_with_ps(env):
    tfnb.run(one, num_workers=2, num_ps=1, data=object(), display=False)


class TestRefusals(Refusals):
    """The cases above."""
