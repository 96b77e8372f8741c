"""The catalogue of bad inputs tfnb refuses: one clear error naming the offending value and the fix, fast.

Every case is a call a user could make. Each asserts the error type (or, for TensorBoard, the
``Failed`` outcome it returns), that the message names the offending value and the fix, and records
how long the refusal took; the table of times is printed at the end of the module. Cases that need
no Spark never start it; Spark cases share the local[2] session and come last, the stopped-session
case at the very end (it stops the shared session).

``python tests/test_refusals.py`` prints the catalogue as docs/refusals.md's markdown table.
"""
from __future__ import annotations

import inspect
import json
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

if __name__ == "__main__":  # run as a script: find tfnb in this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import tfnb  # noqa: E402
from tfnb import ClusterError, ConfigError, StorageError, WorkerError  # noqa: E402
from tfnb.errors import DbcFormatError  # noqa: E402
from tfnb.monitor.tensorboard import Failed


@dataclass
class Case:
    name: str
    area: str
    given: str          # the bad input, as the catalogue page shows it
    raises: type        # error type (or Failed, TensorBoard's outcome)
    needles: tuple      # substrings the message must hold: the offending value, then the fix
    says: str           # the fix, in short, for the catalogue page
    fn: Callable
    spark: bool = False
    xfail: str | None = None
    order: int = 0      # Spark cases that restart or stop the shared session run last


CASES: list[Case] = []


def case(area: str, given: str, raises: type, *needles: str, says: str, spark: bool = False,
         xfail: str | None = None, order: int = 0):
    def register(fn):
        CASES.append(Case(fn.__name__, area, given, raises, needles, says, fn, spark, xfail, order))
        return fn
    return register


class Env:
    """What a case gets: a scratch folder, environment patching, and the shared Spark session on demand."""

    def __init__(self, tmp: Path, monkeypatch):
        self.tmp = tmp
        self.monkeypatch = monkeypatch

    @property
    def spark(self):
        from conftest import spark_session

        return spark_session("local[2]")

    def setenv(self, name: str, value: str) -> None:
        self.monkeypatch.setenv(name, value)


def one(ctx):
    return 1


def nothing(args, ctx):
    return None


# ---------------------------------------------------------------- launcher (no Spark: refused before the session)


@case("launcher", "`tfnb.run('train.py', ...)`", ConfigError, "got str", "(ctx, *args)",
      says="pass a function taking (ctx, *args)")
def run_train_fn_not_callable(env):
    tfnb.run("train.py", num_workers=2, display=False)


@case("launcher", "`num_workers=0`", ConfigError, "num_workers=0", "num_workers=2",
      says="an int >= 1, e.g. num_workers=2")
def run_num_workers_zero(env):
    tfnb.run(one, num_workers=0, display=False)


@case("launcher", "`num_workers='2'`", ConfigError, "num_workers='2'", "int >= 1",
      says="an int >= 1, e.g. num_workers=2")
def run_num_workers_str(env):
    tfnb.run(one, num_workers="2", display=False)


@case("launcher", "`num_ps=-1`", ConfigError, "num_ps=-1", "num_ps=0 runs MultiWorkerMirroredStrategy",
      says="an int >= 0 (0: MultiWorkerMirroredStrategy)")
def run_num_ps_negative(env):
    tfnb.run(one, num_workers=2, num_ps=-1, display=False)


@case("launcher", "`num_ps=1` with `num_workers=1`", ConfigError, "num_ps=1", "num_workers >= 2 or num_ps=0",
      says="num_workers >= 2 (a chief and a worker), or num_ps=0")
def run_ps_without_worker(env):
    tfnb.run(one, num_workers=1, num_ps=1, display=False)


@case("launcher", "`gpus_per_worker=1.5`", ConfigError, "gpus_per_worker=1.5", "int >= 0",
      "spark.task.resource.gpu.amount", says="whole GPUs per chief/worker task (0: none), or None for the conf's")
def run_gpus_per_worker_fraction(env):
    tfnb.run(one, num_workers=2, gpus_per_worker=1.5, display=False)


@case("launcher", "`cpus_per_worker=0`", ConfigError, "cpus_per_worker=0", "int >= 1", "spark.task.cpus",
      says="CPU cores per chief/worker task (>= 1), or None for spark.task.cpus")
def run_cpus_per_worker_zero(env):
    tfnb.run(one, num_workers=2, cpus_per_worker=0, display=False)


@case("launcher", "`use_gpu=False` with `gpus_per_worker=2`", ConfigError, "use_gpu=False", "gpus_per_worker=2",
      "gpus_per_worker=0", says="gpus_per_worker=0 for a run without GPUs, or leave use_gpu out")
def run_use_gpu_false_with_gpus(env):
    tfnb.run(one, num_workers=2, use_gpu=False, gpus_per_worker=2, display=False)


@case("launcher", "`ps_placement='gpu'`", ConfigError, "ps_placement='gpu'", "'executors'", "'driver'",
      says="'executors' (default) or 'driver'")
def run_ps_placement_unknown(env):
    tfnb.run(one, num_workers=2, num_ps=1, ps_placement="gpu", display=False)


@case("launcher", "`args=5`", ConfigError, "got int", "args=(value,)", says="a tuple: args=(value,)")
def run_args_not_tuple(env):
    tfnb.run(one, num_workers=2, args=5, display=False)


@case("launcher", "`timeout=0`", ConfigError, "timeout=0", "None for no limit", says="seconds > 0, or None")
def run_timeout_zero(env):
    tfnb.run(one, num_workers=2, timeout=0, display=False)


@case("launcher", "`TFNB_TIMEOUT=soon`", ConfigError, "TFNB_TIMEOUT='soon'", "fix or unset TFNB_TIMEOUT",
      says="fix or unset the variable")
def run_timeout_env_not_a_number(env):
    env.setenv("TFNB_TIMEOUT", "soon")
    tfnb.run(one, num_workers=2, display=False)


@case("launcher", "`timeout='10'`", ConfigError, "timeout='10'", "number of seconds > 0",
      says="a number of seconds > 0, or None")
def run_timeout_str(env):
    tfnb.run(one, num_workers=2, timeout="10", display=False)


@case("launcher", "`max_attempts=0`", ConfigError, "max_attempts=0", "1 = never relaunch",
      says=">= 1 (1 = never relaunch)")
def run_max_attempts_zero(env):
    tfnb.run(one, num_workers=2, max_attempts=0, display=False)


@case("launcher", "`max_attempts=2.5`", ConfigError, "max_attempts=2.5", "int >= 1", says="an int >= 1")
def run_max_attempts_float(env):
    tfnb.run(one, num_workers=2, max_attempts=2.5, display=False)


@case("launcher", "`TFNB_MAX_ATTEMPTS=many`", ConfigError, "TFNB_MAX_ATTEMPTS='many'", "fix or unset",
      says="fix or unset the variable")
def run_max_attempts_env(env):
    env.setenv("TFNB_MAX_ATTEMPTS", "many")
    tfnb.run(one, num_workers=2, display=False)


@case("launcher", "`preimport='tensorflow'`", ConfigError, "preimport='tensorflow'", "preimport=('tensorflow',)",
      says="a sequence: preimport=('tensorflow',)")
def run_preimport_str(env):
    tfnb.run(one, num_workers=2, preimport="tensorflow", display=False)


@case("launcher", "`preimport=[1]`", ConfigError, "preimport=[1]", "preimport=('tensorflow',)",
      says="module names as strings")
def run_preimport_not_names(env):
    tfnb.run(one, num_workers=2, preimport=[1], display=False)


@case("launcher", "`profile_steps=(25, 20)`", ConfigError, "profile_steps=(25, 20)", "profile_steps=(20, 25)",
      says="(first, last) with first <= last")
def run_profile_steps_reversed(env):
    tfnb.run(one, num_workers=2, profile_steps=(25, 20), log_dir="/tmp/logs", display=False)


@case("launcher", "`profile_steps=(20, 25)` without `log_dir`", ConfigError, "profile_steps=(20, 25)",
      "pass log_dir=", says="pass log_dir= (where the traces go)")
def run_profile_steps_no_log_dir(env):
    tfnb.run(one, num_workers=2, profile_steps=(20, 25), display=False)


@case("launcher", "`mlflow=1`", ConfigError, "mlflow=1", "mlflow='my-training'",
      says="True, an experiment name or None")
def run_mlflow_not_bool_or_name(env):
    tfnb.run(one, num_workers=2, mlflow=1, display=False)


@case("launcher", "`env={'SEED': 1}`", ConfigError, "'SEED': 'int'", "str()", says="str -> str; convert with str()")
def run_env_not_str(env):
    tfnb.run(one, num_workers=2, env={"SEED": 1}, display=False)


@case("launcher", "`env=['SEED=1']`", ConfigError, "not list", "str()", says="a dict of str -> str")
def run_env_not_mapping(env):
    tfnb.run(one, num_workers=2, env=["SEED=1"], display=False)


@case("launcher", "train_fn capturing a lock", ConfigError, "cannot be sent to the workers", "lock",
      "create those inside train_fn", says="capture plain values only; create objects inside train_fn")
def run_unpicklable_train_fn(env):
    lock = threading.Lock()

    def uses_lock(ctx):
        with lock:
            return 1

    tfnb.run(uses_lock, num_workers=2, display=False)


# ---------------------------------------------------------------- data (worker side, no Spark: what ctx.dataset says)


def _fed_ctx(env, rows: int = 10, width: int = 4, null: bool = False, ragged: bool = False):
    """A train_fn's context for a run fed rows of (x: array<float>[width], y: double), as the task builds it."""
    import pyarrow as pa

    from tfnb._task.context import WorkerContext
    from tfnb._task.feed import FeedColumn, FeedSpec, finish_feed, spill_partition

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


@case("data", "`batch_size` above the smallest worker's rows", ConfigError, "batch_size=64",
      "lower batch_size to at most 10", says="lower batch_size, feed more rows, or drop_remainder=False")
def dataset_batch_larger_than_rows(env):
    ctx = _fed_ctx(env)
    yield
    ctx.dataset(64, label_col="y")


@case("data", "`label_col` not a fed column", ConfigError, "label_col='label'", "the columns are ['x', 'y']",
      says="choose one of the fed columns (listed)")
def dataset_unknown_label(env):
    ctx = _fed_ctx(env)
    yield
    ctx.dataset(2, label_col="label")


@case("data", "`feature_cols` with an unknown column", ConfigError, "['z']", "choose from those",
      says="choose from the fed columns, or add the column to data=")
def dataset_unknown_feature(env):
    ctx = _fed_ctx(env)
    yield
    ctx.dataset(2, feature_cols=["x", "z"], label_col="y")


@case("data", "`label_col` also in `feature_cols`", ConfigError, "label_col='y'", "take it out of feature_cols",
      says="take the label out of feature_cols")
def dataset_label_in_features(env):
    ctx = _fed_ctx(env)
    yield
    ctx.dataset(2, feature_cols=["x", "y"], label_col="y")


@case("data", "`epochs=0`", ConfigError, "epochs=0", "'auto'", says="an int >= 1, None (repeat) or 'auto'")
def dataset_epochs_zero(env):
    ctx = _fed_ctx(env)
    yield
    ctx.dataset(2, label_col="y", epochs=0)


@case("data", "`drop_remainder=False` with `strategy=`", ConfigError, "drop_remainder=False",
      "leave drop_remainder=True", says="leave drop_remainder=True with a strategy")
def dataset_remainder_with_strategy(env):
    ctx = _fed_ctx(env)
    yield
    ctx.dataset(2, label_col="y", strategy=object(), drop_remainder=False)


@case("data", "null values in a fed column", ConfigError, "column 'y' has null values", "df.na.fill(0, ['y'])",
      says="fill them (df.na.fill) or drop those rows (df.dropna)")
def feed_nulls(env):
    _fed_ctx(env, null=True)


@case("data", "arrays of different lengths", ConfigError, "column 'x'", "pad or cut them to one length",
      says="pad or cut the arrays to one length (F.slice/F.concat)")
def feed_ragged_arrays(env):
    _fed_ctx(env, ragged=True)


# ---------------------------------------------------------------- staging


@case("staging", "`tfnb.stage(..., count=0)`", ConfigError, "count=0", "count=ctx.num_workers",
      says="count=ctx.num_workers (or 1 for everything)")
def stage_count_zero(env):
    tfnb.stage(str(env.tmp), str(env.tmp / "out"), index=0, count=0)


@case("staging", "`index=2, count=2`", ConfigError, "index=2", "index=ctx.task_index",
      says="index=ctx.task_index, count=ctx.num_workers")
def stage_index_out_of_range(env):
    tfnb.stage(str(env.tmp), str(env.tmp / "out"), index=2, count=2)


@case("staging", "`src=''`", ConfigError, "src=''", "'s3://bucket/prefix'",
      says="a URL or path, e.g. 's3://bucket/prefix'")
def stage_empty_url(env):
    tfnb.stage("", str(env.tmp / "out"), index=0, count=1)


@case("staging", "`dest=None`", ConfigError, "dest=None", "'/local_disk0/train'",
      says="a local folder path")
def stage_dest_none(env):
    tfnb.stage(str(env.tmp), None, index=0, count=1)


@case("staging", "`concurrency=0`", ConfigError, "concurrency=0", "e.g. 16", says="an int >= 1, e.g. 16")
def stage_concurrency_zero(env):
    tfnb.stage(str(env.tmp), str(env.tmp / "out"), index=0, count=1, concurrency=0)


@case("staging", "`chunk_size=1000`", ConfigError, "chunk_size=1000", "at least 1 MiB",
      says="at least 1 MiB, e.g. 8388608")
def stage_chunk_too_small(env):
    tfnb.stage(str(env.tmp), str(env.tmp / "out"), index=0, count=1, chunk_size=1000)


@case("staging", "`s3:///train` (no bucket)", ConfigError, "s3:///train", "s3://BUCKET/",
      says="write s3://BUCKET/PREFIX")
def stage_s3_no_bucket(env):
    tfnb.stage("s3:///train", str(env.tmp / "out"), index=0, count=1, endpoint_url="http://127.0.0.1:9")


@case("staging", "`nosuch://bucket/x` (unknown scheme)", ConfigError, "'nosuch'", "install the fsspec backend",
      says="use s3://, file://, a local path, or install the fsspec backend")
def stage_unknown_scheme(env):
    tfnb.stage("nosuch://bucket/x", str(env.tmp / "out"), index=0, count=1)


@case("staging", "a source folder with no files", StorageError, "empty-src", "check the URL or path",
      says="check the path or URL (the message names it)")
def stage_empty_source(env):
    (env.tmp / "empty-src").mkdir()
    tfnb.stage(str(env.tmp / "empty-src"), str(env.tmp / "out"), index=0, count=1)


@case("staging", "a source folder that does not exist", StorageError, "no-such-src", "check the URL or path",
      says="check the path or URL (the message names it)")
def stage_missing_source(env):
    tfnb.stage(str(env.tmp / "no-such-src"), str(env.tmp / "out"), index=0, count=1)


@case("staging", "`dest` that is a file", StorageError, "not-a-dir", "pick a writable local folder",
      says="pick a writable local folder")
def stage_dest_is_file(env):
    (env.tmp / "src").mkdir()
    (env.tmp / "src" / "a.bin").write_bytes(b"x" * 10)
    (env.tmp / "not-a-dir").write_text("")
    tfnb.stage(str(env.tmp / "src"), str(env.tmp / "not-a-dir" / "sub"), index=0, count=1)


@case("staging", "an S3 endpoint that refuses connections", StorageError, "http://127.0.0.1:9",
      "check endpoint_url", says="check endpoint_url and that the server is reachable")
def stage_endpoint_unreachable(env):
    env.setenv("AWS_ACCESS_KEY_ID", "k")  # credentials are there; the server is not
    env.setenv("AWS_SECRET_ACCESS_KEY", "s")
    tfnb.stage("s3://bucket/train", str(env.tmp / "out"), index=0, count=1, endpoint_url="http://127.0.0.1:9")


# ---------------------------------------------------------------- event sync


@case("sync", "`EventSync(..., interval=0)`", ConfigError, "interval=0", "interval=10",
      says="seconds > 0, e.g. interval=10")
def sync_interval_zero(env):
    tfnb.EventSync(str(env.tmp / "a"), str(env.tmp / "b"), interval=0)


@case("sync", "`EventSync(None, ...)`", ConfigError, "src=None", "'/tmp/tb/run1'", says="a directory path or URL")
def sync_src_none(env):
    tfnb.EventSync(None, str(env.tmp / "b"))


@case("sync", "`dest='nosuch://b/x'` (unknown scheme)", ConfigError, "'nosuch://b/x'", "install the fsspec backend",
      says="install the fsspec backend, or use a local path / s3://")
def sync_unknown_scheme(env):
    tfnb.EventSync(str(env.tmp / "a"), "nosuch://b/x")


@case("sync", "`TFNB_SYNC_INTERVAL=often`", ConfigError, "TFNB_SYNC_INTERVAL='often'", "fix or unset",
      says="fix or unset the variable")
def sync_interval_env(env):
    env.setenv("TFNB_SYNC_INTERVAL", "often")
    tfnb.EventSync(str(env.tmp / "a"), str(env.tmp / "b"))


@case("sync", "`mode='rsync'`", ConfigError, "mode='rsync'", "auto", says="one of auto, append, parts")
def sync_bad_mode(env):
    tfnb.EventSync(str(env.tmp / "a"), str(env.tmp / "b"), mode="rsync")


@case("sync", "`dest` inside `src`", ConfigError, "overlap", "outside the source",
      says="sync into a directory outside the source")
def sync_overlap(env):
    tfnb.EventSync(str(env.tmp / "logs"), str(env.tmp / "logs" / "copy"))


@case("sync", "`mode='append'` to S3", ConfigError, "mode='append'", "mode='parts'",
      says="mode='parts' (or 'auto') for object stores")
def sync_append_to_s3(env):
    tfnb.EventSync(str(env.tmp / "logs"), "s3://bucket/logs", mode="append",
                   storage_options={"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1",
                                    "aws_access_key_id": "k", "aws_secret_access_key": "s"})


@case("sync", "unknown S3 `storage_options` key", ConfigError, "'endpoint'", "endpoint_url",
      says="use endpoint_url, region_name, aws_* keys or client_kwargs")
def sync_s3_unknown_option(env):
    tfnb.EventSync(str(env.tmp / "logs"), "s3://bucket/logs", storage_options={"endpoint": "http://127.0.0.1:9"})


@case("sync", "`flush()` to an S3 endpoint that refuses connections", StorageError, "s3://bucket/logs",
      "endpoint_url", says="check both locations and the store's storage_options")
def sync_endpoint_unreachable(env):
    (env.tmp / "logs").mkdir()
    (env.tmp / "logs" / "events.out.tfevents.1").write_bytes(b"x" * 100)
    sync = tfnb.EventSync(str(env.tmp / "logs"), "s3://bucket/logs",
                          storage_options={"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1",
                                           "aws_access_key_id": "k", "aws_secret_access_key": "s"})
    yield
    sync.flush()


# ---------------------------------------------------------------- evaluator


def _evaluator(env, **kwargs):
    args = dict(model_fn=lambda: None, dataset_fn=lambda: [], checkpoint_dir=str(env.tmp / "ckpt"),
                log_dir=str(env.tmp / "eval"))
    args.update(kwargs)
    return tfnb.Evaluator(args.pop("model_fn"), args.pop("dataset_fn"), args.pop("checkpoint_dir"),
                          args.pop("log_dir"), **args)


@case("evaluator", "`Evaluator(model_fn='model.keras', ...)`", ConfigError, "'model.keras'",
      "a function returning a tf-keras model", says="a function that builds the model")
def evaluator_model_fn_not_callable(env):
    _evaluator(env, model_fn="model.keras")


@case("evaluator", "`dataset_fn=<a dataset>`", ConfigError, "dataset_fn must be a function",
      "dataset_fn=lambda: val_ds", says="wrap it: dataset_fn=lambda: val_ds")
def evaluator_dataset_not_fn(env):
    _evaluator(env, dataset_fn=[1, 2, 3])


@case("evaluator", "`interval=-1`", ConfigError, "interval=-1", "interval=10", says="seconds > 0, e.g. interval=10")
def evaluator_interval(env):
    _evaluator(env, interval=-1)


@case("evaluator", "`mode='up'`", ConfigError, "mode='up'", "'min', 'max' or 'auto'", says="'min', 'max' or 'auto'")
def evaluator_mode(env):
    _evaluator(env, mode="up")


@case("evaluator", "`export_format='onnx'`", ConfigError, "export_format='onnx'", "savedmodel",
      says="one of the listed formats, or None")
def evaluator_export_format(env):
    _evaluator(env, export_format="onnx")


@case("evaluator", "`metrics='accuracy'`", ConfigError, "metrics='accuracy'", "metrics=['accuracy']",
      says="a list: metrics=['accuracy']")
def evaluator_metrics_str(env):
    _evaluator(env, metrics="accuracy")


@case("evaluator", "`step='batch'`", ConfigError, "step='batch'", "function(checkpoint) -> int",
      says="one of the listed rules, or a function(checkpoint) -> int")
def evaluator_step(env):
    _evaluator(env, step="batch")


@case("evaluator", "`TFNB_EVAL_INTERVAL=soon`", ConfigError, "TFNB_EVAL_INTERVAL='soon'", "fix or unset",
      says="fix or unset the variable")
def evaluator_interval_env(env):
    env.setenv("TFNB_EVAL_INTERVAL", "soon")
    _evaluator(env)


@case("evaluator", "`checkpoint_dir=None`", ConfigError, "checkpoint_dir=None", "model_dir given to tfnb.run",
      says="a directory path or URL (the run's model_dir)")
def evaluator_checkpoint_none(env):
    _evaluator(env, checkpoint_dir=None)


@case("evaluator", "`max_retries=0`", ConfigError, "max_retries=0", "int >= 1", says="an int >= 1")
def evaluator_max_retries(env):
    _evaluator(env, max_retries=0)


@case("evaluator", "`best_metric=5`", ConfigError, "best_metric=5", "'loss'",
      says="a metric name such as 'loss', or None")
def evaluator_best_metric(env):
    _evaluator(env, best_metric=5)


@case("evaluator", "`timeout=0`", ConfigError, "timeout=0", "or None to wait for training to end",
      says="seconds > 0, or None")
def evaluator_timeout(env):
    _evaluator(env, timeout=0)


# ---------------------------------------------------------------- TensorBoard (no process is started)


@case("tensorboard", "`tfnb.tensorboard(log_dir=<missing dir>)`", Failed, "does not exist", "os.makedirs",
      says="returns Failed: check the path, or create the directory first")
def tensorboard_missing_logdir(env):
    return tfnb.tensorboard(str(env.tmp / "nope"), display=False)


@case("tensorboard", "`log_dir` that is a file", Failed, "is a file", "pass the directory",
      says="returns Failed: pass the directory holding the event files")
def tensorboard_logdir_is_file(env):
    (env.tmp / "events").write_text("")
    return tfnb.tensorboard(str(env.tmp / "events"), display=False)


@case("tensorboard", "`log_dir=''`", ConfigError, "log_dir is empty", "tfnb.tensorboard('/tmp/run1/logs')",
      says="pass the event-file directory")
def tensorboard_empty_logdir(env):
    tfnb.tensorboard("", display=False)


@case("tensorboard", "`log_dir=42`", ConfigError, "log_dir=42", "tfnb.tensorboard('/tmp/run1/logs')",
      says="pass the event-file directory")
def tensorboard_logdir_not_path(env):
    tfnb.tensorboard(42, display=False)


@case("tensorboard", "`port=70000`", ConfigError, "port=70000", "port=None", says="0-65535, or port=None")
def tensorboard_bad_port(env):
    tfnb.tensorboard(str(env.tmp), port=70000, display=False)


@case("tensorboard", "`host=''`", ConfigError, "host=''", "'127.0.0.1'", says="'127.0.0.1' (default) or '0.0.0.0'")
def tensorboard_bad_host(env):
    tfnb.tensorboard(str(env.tmp), host="", display=False)


@case("tensorboard", "`reload_interval=0`", ConfigError, "reload_interval=0", "positive number of seconds",
      says="a positive number of seconds")
def tensorboard_reload_interval(env):
    tfnb.tensorboard(str(env.tmp), reload_interval=0, display=False)


@case("tensorboard", "`height=10`", ConfigError, "height=10", ">= 100", says="pixels >= 100")
def tensorboard_height(env):
    tfnb.tensorboard(str(env.tmp), height=10, display=False)


@case("tensorboard", "`timeout=-1`", ConfigError, "timeout=-1", "positive number of seconds",
      says="a positive number of seconds")
def tensorboard_timeout(env):
    tfnb.tensorboard(str(env.tmp), timeout=-1, display=False)


@case("tensorboard", "`TFNB_TENSORBOARD_TIMEOUT=later`", ConfigError, "TFNB_TENSORBOARD_TIMEOUT='later'",
      "fix or unset", says="fix or unset the variable")
def tensorboard_timeout_env(env):
    env.setenv("TFNB_TENSORBOARD_TIMEOUT", "later")
    tfnb.tensorboard(str(env.tmp), display=False)


# ---------------------------------------------------------------- DBC archives


def _notebook(path: Path, cells: list[dict], language: str = "python") -> None:
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "cells": cells,
                                "metadata": {"kernelspec": {"language": language, "name": language}}}))


def _code(source: str, outputs: list | None = None) -> dict:
    return {"cell_type": "code", "source": source, "metadata": {}, "outputs": outputs or [],
            "execution_count": None}


@case("dbc", "`dbc.build(<missing folder>, ...)`", ConfigError, "does not exist", "pass the folder",
      says="pass the folder holding the .ipynb files")
def dbc_missing_folder(env):
    from tools import dbc

    dbc.build(env.tmp / "nope", env.tmp / "out.dbc")


@case("dbc", "a folder without notebooks", ConfigError, "no .ipynb notebooks", "pass the folder holding",
      says="pass the folder holding the .ipynb files")
def dbc_empty_folder(env):
    from tools import dbc

    dbc.build(env.tmp, env.tmp / "out.dbc")


@case("dbc", "a notebook saved with outputs", ConfigError, "has outputs", "jupyter nbconvert --clear-output",
      says="clear outputs (jupyter nbconvert --clear-output)")
def dbc_outputs(env):
    from tools import dbc

    _notebook(env.tmp / "a.ipynb", [_code("print(1)", [{"output_type": "stream", "name": "stdout", "text": "1"}])])
    dbc.build(env.tmp, env.tmp / "out.dbc")


@case("dbc", "a notebook holding an AWS key", ConfigError, "looks like", "secret scope",
      says="read credentials from the environment or a secret scope")
def dbc_credential(env):
    from tools import dbc

    _notebook(env.tmp / "a.ipynb", [_code('KEY = "AKIA' + "ABCDEFGHIJKLMNOP" + '"')])
    dbc.build(env.tmp, env.tmp / "out.dbc")


@case("dbc", "`%run ./missing`", ConfigError, "'./missing'", "fix the %run line or add the notebook",
      says="fix the %run line or add the notebook")
def dbc_run_missing(env):
    from tools import dbc

    _notebook(env.tmp / "a.ipynb", [_code("%run ./missing")])
    dbc.build(env.tmp, env.tmp / "out.dbc")


@case("dbc", "`folder='a/b'`", ConfigError, "folder='a/b'", "'tfnb'", says="a plain name such as 'tfnb'")
def dbc_bad_folder(env):
    from tools import dbc

    _notebook(env.tmp / "a.ipynb", [_code("x = 1")])
    dbc.build(env.tmp, env.tmp / "out.dbc", folder="a/b")


@case("dbc", "an `.ipynb` that is not JSON", ConfigError, "a.ipynb is not valid .ipynb JSON", "re-save it in Jupyter",
      says="open and re-save it in Jupyter")
def dbc_not_json(env):
    from tools import dbc

    (env.tmp / "a.ipynb").write_text("{")
    dbc.build(env.tmp, env.tmp / "out.dbc")


@case("dbc", "`dbc.read(<missing archive>)`", ConfigError, "does not exist", "./dev dbc",
      says="build it (./dev dbc)")
def dbc_read_missing(env):
    from tools import dbc

    dbc.read(env.tmp / "nope.dbc")


@case("dbc", "a `.dbc` that is not a zip", DbcFormatError, "not a zip file", "export it again",
      says="export it again, or rebuild it with ./dev dbc")
def dbc_not_zip(env):
    from tools import dbc

    (env.tmp / "x.dbc").write_text("hello")
    dbc.read(env.tmp / "x.dbc")


@case("dbc", "`dbc.extract(..., formats=('pdf',))`", ConfigError, "formats=('pdf',)", "ipynb",
      says="formats from ('ipynb', 'py')")
def dbc_extract_format(env):
    from tools import dbc

    dbc.extract(env.tmp / "x.dbc", env.tmp / "out", formats=("pdf",))


# ---------------------------------------------------------------- compat (TFCluster.run), no Spark


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


# ---------------------------------------------------------------- predict, no Spark


@case("predict", "`tfnb.predict(df, m, input_cols=[])`", ConfigError, "input_cols=[]", "input_cols=['features']",
      says="a non-empty list of column names")
def predict_no_input_cols(env):
    tfnb.predict(None, "model.keras", input_cols=[])


@case("predict", "`input_cols='features'`", ConfigError, "input_cols='features'", "input_cols=['features']",
      says="a list: input_cols=['features']")
def predict_input_cols_str(env):
    tfnb.predict(None, "model.keras", input_cols="features")


@case("predict", "`batch_size=0`", ConfigError, "batch_size=0", "batch_size=1024", says="an int >= 1, e.g. 1024")
def predict_batch_size(env):
    tfnb.predict(None, "model.keras", input_cols=["x"], batch_size=0)


@case("predict", "`output_type='int'`", ConfigError, "output_type='int'", "'float', 'array'",
      says="'float', 'array', or leave it out")
def predict_output_type(env):
    tfnb.predict(None, "model.keras", input_cols=["x"], output_type="int")


@case("predict", "`input_cols=['x', 'x']`", ConfigError, "['x']", "name each column once", says="name each column once")
def predict_duplicate_cols(env):
    tfnb.predict(None, "model.keras", input_cols=["x", "x"])


@case("predict", "`tfnb.predict(<pandas DataFrame>, ...)`", ConfigError, "got DataFrame", "spark.createDataFrame",
      says="convert it with spark.createDataFrame")
def predict_pandas(env):
    import pandas as pd

    tfnb.predict(pd.DataFrame({"x": [1.0]}), "model.keras", input_cols=["x"])


# ---------------------------------------------------------------- progress display


@case("progress", "`ctx.progress_callback(batch_size=0)`", ConfigError, "batch_size=0", "examples per step",
      says="an int >= 1 (examples per step)")
def progress_callback_batch(env):
    from tfnb._task.context import WorkerContext

    WorkerContext(task_index=0, num_workers=2, job_name="chief", cluster_spec={}, tf_config={}).progress_callback(
        batch_size=0)


@case("progress", "`tfnb.ConsoleDisplay(interval=-1)`", ConfigError, "interval=-1", "seconds >= 0",
      says="seconds >= 0")
def progress_console_interval(env):
    tfnb.ConsoleDisplay(interval=-1)


# ---------------------------------------------------------------- Spark cases (the shared local[2] session)


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


@case("launcher", "`TFNB_DISPLAY=fancy`", ConfigError, "'fancy'", "TFNB_DISPLAY=widget, console or none",
      says="widget, console or none", spark=True)
def run_display_env(env):
    env.setenv("TFNB_DISPLAY", "fancy")
    tfnb.run(one, num_workers=2, spark=env.spark)


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


@case("data", "`data=` with `num_ps=1`", ConfigError, "num_ps=1", "tfnb.stage",
      says="stage files per worker with ps, or num_ps=0")
def data_with_ps(env):
    tfnb.run(one, num_workers=2, num_ps=1, data=object(), display=False)


@case("predict", "`input_cols=['z']` not in the DataFrame", ConfigError, "'z'", "fix input_cols",
      says="fix input_cols (the message lists the columns)", spark=True)
def predict_missing_column(env):
    tfnb.predict(env.spark.range(2), "model.keras", input_cols=["z"])


@case("predict", "a string input column", ConfigError, "'name' has type string", "numeric",
      says="numeric columns or arrays of numbers", spark=True)
def predict_string_column(env):
    df = env.spark.createDataFrame([("a",)], "name string")
    yield
    tfnb.predict(df, "model.keras", input_cols=["name"])


@case("predict", "`output_col` that exists", ConfigError, "output_col='id'", "df.drop('id')",
      says="another output_col, or drop the column", spark=True)
def predict_output_exists(env):
    tfnb.predict(env.spark.range(2), "model.keras", input_cols=["id"], output_col="id")


@case("predict", "`model_path` that does not exist", ConfigError, "does not exist on the driver", ".keras/.h5",
      says="the path of a .keras/.h5 file or SavedModel directory", spark=True)
def predict_missing_model(env):
    tfnb.predict(env.spark.range(2), str(env.tmp / "nope.keras"), input_cols=["id"])


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


# The last cases change or stop the shared session.

_stopped: list = []


def _stopped_session(env):
    """The test process's session, stopped (once: starting another just to stop it costs seconds)."""
    import conftest

    if not _stopped:
        session = conftest._current["session"] or env.spark
        session.stop()
        conftest._current.update(master=None, session=None)  # a later test module starts a fresh one
        _stopped.append(session)
    return _stopped[0]


@case("cluster", "spark.task.resource.gpu.amount=1 on local[2] without driver GPUs", ClusterError,
      "spark.task.resource.gpu.amount=1", "spark.driver.resource.gpu.amount is unset",
      "unset spark.task.resource.gpu.amount", "spark.driver.resource.gpu.discoveryScript",
      says="unset the task GPU amount, or give the driver/executors GPUs",
      spark=True, order=1)
def run_gpu_conf_without_gpus(env):
    from conftest import spark_session

    session = spark_session("local[2]", **{"spark.task.resource.gpu.amount": "1",
                                           "spark.executor.resource.gpu.amount": "1"})
    yield
    tfnb.run(one, num_workers=2, spark=session, display=False)


@case("cluster", "stopped SparkSession", ConfigError, "stopped SparkSession", "SparkSession.builder.getOrCreate()",
      says="start a new session (or leave spark= out)", spark=True, order=2)
def run_stopped_session(env):
    session = _stopped_session(env)
    yield
    tfnb.run(one, num_workers=2, spark=session, display=False)


@case("compat", "stopped SparkContext", ConfigError, "stopped SparkContext", "SparkSession.builder.getOrCreate()",
      says="start a new session and pass spark.sparkContext", spark=True, order=2)
def compat_stopped_context(env):
    from tfnb.compat import TFCluster

    session = _stopped_session(env)

    yield
    TFCluster.run(session.sparkContext, nothing, None, 2, 0)


CASES.sort(key=lambda c: (c.spark, c.order))  # stable: no-Spark cases first, session changers last
TIMES: dict[str, float] = {}
MESSAGES: dict[str, str] = {}


def _message(outcome) -> str:
    if isinstance(outcome, Failed):
        return f"{outcome.error}; {outcome.fix}"
    return str(outcome)


@pytest.fixture(scope="module", autouse=True)
def time_table(request):
    yield
    if not TIMES:
        return
    by_name = {c.name: c for c in CASES}
    lines = ["", f"refusal times ({len(TIMES)} cases, {sum(TIMES.values()):.2f} s in all)",
             f"{'area':<12} {'case':<34} {'error':<15} {'seconds':>8}"]
    for name, seconds in TIMES.items():
        c = by_name[name]
        lines.append(f"{c.area:<12} {name:<34} {c.raises.__name__:<15} {seconds:>8.3f}")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n".join(lines), flush=True)
    from conftest import ARTIFACTS

    ARTIFACTS.mkdir(exist_ok=True)  # every message in full, for reading them side by side
    (ARTIFACTS / "refusals.txt").write_text("".join(
        f"{name} ({TIMES[name]:.3f} s): {text}\n\n" for name, text in MESSAGES.items()))


@pytest.mark.parametrize("c", [pytest.param(c, id=c.name, marks=[pytest.mark.xfail(strict=True, reason=c.xfail)]
                                            if c.xfail else []) for c in CASES])
def test_refusal(c: Case, tmp_path, monkeypatch, capsys):
    for var in ("TFNB_TIMEOUT", "TFNB_MAX_ATTEMPTS", "TFNB_SYNC_INTERVAL", "TFNB_DISPLAY", "TFNB_EVAL_INTERVAL",
                "TFNB_TENSORBOARD_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    env = Env(tmp_path, monkeypatch)
    if c.spark:
        env.spark  # start (or reuse) the session outside the timed call
    call = lambda: c.fn(env)  # noqa: E731
    if inspect.isgeneratorfunction(c.fn):
        steps = c.fn(env)
        next(steps)  # the set-up before the bad call is not timed
        call = lambda: next(steps, None)  # noqa: E731
    start = time.perf_counter()
    if c.raises is Failed:
        outcome = call()
        TIMES[c.name] = time.perf_counter() - start
        assert isinstance(outcome, Failed), outcome
        assert c.needles[0] in capsys.readouterr().err  # what the user sees printed
    else:
        with pytest.raises(Exception) as info:
            call()
        TIMES[c.name] = time.perf_counter() - start
        outcome = info.value
        assert isinstance(outcome, c.raises), f"{type(outcome).__name__}: {outcome}"
        assert not isinstance(outcome, (WorkerError, AttributeError)), outcome
    text = _message(outcome)
    MESSAGES[c.name] = text
    for needle in c.needles:
        assert needle in text, f"{needle!r} not in: {text}"


def test_catalogue_is_large_and_covers_every_area():
    assert len(CASES) > 40
    assert {c.area for c in CASES} >= {"launcher", "cluster", "data", "staging", "sync", "evaluator",
                                       "tensorboard", "dbc", "compat", "predict"}
    assert len({c.name for c in CASES}) == len(CASES)


def readme_table() -> str:
    rows = ["| Area | Input | Error | What it says to do |", "|---|---|---|---|"]
    for c in sorted(CASES, key=lambda c: _AREAS.index(c.area)):
        error = "returns `Failed`" if c.raises is Failed else f"`{c.raises.__name__}`"
        rows.append(f"| {c.area} | {c.given} | {error} | {c.says} |")
    return "\n".join(rows)


_AREAS = ["launcher", "cluster", "data", "staging", "sync", "evaluator", "tensorboard", "progress", "dbc", "compat",
          "predict"]


def test_the_docs_list_the_catalogue():
    page = (Path(__file__).resolve().parent.parent / "docs" / "refusals.md").read_text()
    assert readme_table() in page, "docs/refusals.md is out of date: paste the output of python tests/test_refusals.py"


if __name__ == "__main__":
    print(readme_table())
