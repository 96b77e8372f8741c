"""Feeding throughput: one cached DataFrame into a consuming tf.data loop, three ways in one run.

    ./dev bench feeding [--rows 200000] [--master 'local-cluster[2,1,2048]'] [--repeat 2]

The DataFrame: ``rows`` x one array<float> column of 64 elements (256 B a row), two partitions,
cached. Three ways:

  ceiling  a no-op ``df.mapInArrow(count, barrier=True)``: Spark's own Arrow path into Python tasks.
  tfnb     ``tfnb.run(consume, num_workers=2, data=df)``; each train_fn process iterates
           ``ctx.dataset(1000)`` with a Python for-loop.
  tfos     TensorFlowOnSpark 2.2.5, InputMode.SPARK: ``cluster.train(rdd)``, each node consuming a
           tf.data generator over ``DataFeed.next_batch(1000)`` (its fastest documented pattern).

Each is timed over the time its rows are moving ("stream"): the ceiling's tasks from first to last
batch; tfnb's split check (one counting job) + the task writing its partition to the local Arrow
file + the train_fn process's loop over ``ctx.dataset``; TensorFlowOnSpark's whole ``train()`` call
(its cluster start and ``import tensorflow`` are not counted; tfnb's are not either). The
end-to-end wall times (job launch, barrier, train_fn process start and TensorFlow import
included) are printed too: at 200k rows those fixed costs, not the data, dominate them.

Prints rows/s and MB/s for each and the ratios tfnb/tfos (goal >= 20) and tfnb/ceiling (goal >= 0.8).
On a shared machine compare the ratios of one run, not absolute figures.

TensorFlowOnSpark is not a tfnb dependency; install it for this bench only:

    .venv/bin/pip install tensorflowonspark==2.2.5 --no-deps
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

WIDTH = 64
BATCH = 1000
ROW_BYTES = WIDTH * 4


# ---------------------------------------------------------------- the three consumers


def _count(batches):
    import pyarrow as pa

    start = time.perf_counter()
    n = sum(b.num_rows for b in batches)
    took = time.perf_counter() - start
    yield pa.RecordBatch.from_pydict({"n": [n], "stream": [took]},
                                     schema=pa.schema([("n", pa.int64()), ("stream", pa.float64())]))


def tfnb_consume(ctx, launched: float, outdir: str) -> dict:
    start = time.time()
    rows = 0
    for x in ctx.dataset(BATCH):
        rows += int(x.shape[0])
    done = time.time()
    report = {"rank": ctx.task_index, "rows": rows, "spill": ctx.feed.spill_seconds, "loop": done - start,
              "wall": done - launched}
    with open(os.path.join(outdir, f"tfnb-{ctx.task_index}.json"), "w") as f:
        json.dump(report, f)
    return report


def tfos_consume(args, ctx) -> None:
    import numpy as np
    import tensorflow as tf

    feed = ctx.get_data_feed(train_mode=True)

    def batches():
        while not feed.should_stop():
            batch = feed.next_batch(BATCH)
            if len(batch) == 0:
                return
            yield np.asarray(batch, dtype=np.float32)

    ds = tf.data.Dataset.from_generator(batches, output_signature=tf.TensorSpec((None, WIDTH), tf.float32))
    for _ in ds:
        pass


# ---------------------------------------------------------------- runs


def make_df(spark, rows: int):
    from pyspark.sql import functions as F

    features = F.transform(F.array_repeat(F.lit(0.0), WIDTH), lambda _, i: (F.col("id") + i).cast("float"))
    df = spark.range(0, rows, 1, 2).select(features.alias("features")).cache()
    assert df.count() == rows
    return df


def run_ceiling(df) -> tuple[float, float]:
    """(stream seconds, wall seconds) of a no-op barrier mapInArrow over ``df``."""
    start = time.perf_counter()
    out = df.mapInArrow(_count, "n long, stream double", barrier=True).collect()
    wall = time.perf_counter() - start
    assert sum(r["n"] for r in out) == df.count()
    return max(r["stream"] for r in out), wall


def run_tfnb(spark, df, rows: int) -> tuple[float, float, dict]:
    """(stream seconds, wall seconds, details) of feeding ``df`` to two train_fn processes."""
    import tfnb
    from tfnb.feeding import split_for_workers

    # The same check tfnb.run makes before its job, timed on its own.
    start = time.perf_counter()
    split_for_workers(df, 2)
    check = time.perf_counter() - start
    outdir = tempfile.mkdtemp(prefix="tfnb-bench-feed-")
    try:
        tfnb.run(tfnb_consume, num_workers=2, args=(time.time(), outdir), data=df, spark=spark, display=False)
        reports = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(outdir, "tfnb-*.json")))]
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    fed = sum(r["rows"] for r in reports)
    assert len(reports) == 2 and fed >= rows - 2 * BATCH, reports
    stream = check + max(r["spill"] + r["loop"] for r in reports)
    wall = max(r["wall"] for r in reports)
    details = {"rows": fed, "check": check, "spill": max(r["spill"] for r in reports),
               "loop": max(r["loop"] for r in reports)}
    return stream, wall, details


def start_tfos(spark):
    from tensorflowonspark import TFCluster

    return TFCluster.run(spark.sparkContext, tfos_consume, argparse.Namespace(), num_executors=2, num_ps=0,
                         input_mode=TFCluster.InputMode.SPARK)


def run_tfos(cluster, df) -> float:
    """Seconds of ``cluster.train``: it returns once the nodes have taken every row off their queues."""
    rdd = df.rdd.map(lambda row: row[0])
    start = time.perf_counter()
    cluster.train(rdd, num_epochs=1)
    return time.perf_counter() - start


def _line(name: str, seconds: float, rows: int, wall: float | None = None) -> str:
    text = (f"{name:8s} {rows / seconds:>12,.0f} rows/s {rows * ROW_BYTES / seconds / 1e6:>9.1f} MB/s"
            f"   stream {seconds:6.2f} s")
    return text + (f", end to end {wall:6.2f} s ({rows / wall:,.0f} rows/s)" if wall is not None else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--master", default="local-cluster[2,1,2048]")
    p.add_argument("--repeat", type=int, default=2, help="rounds; the best of each way is reported")
    p.add_argument("--no-tfos", action="store_true", help="skip TensorFlowOnSpark")
    a = p.parse_args()

    have_tfos = not a.no_tfos
    if have_tfos:
        try:
            import tensorflowonspark  # noqa: F401
        except ImportError:
            print("TensorFlowOnSpark is not installed; for the comparison run\n"
                  "    .venv/bin/pip install tensorflowonspark==2.2.5 --no-deps\n"
                  "(continuing without it)", file=sys.stderr)
            have_tfos = False

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(a.master).appName("tfnb-bench-feeding")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.executor.memory", "1g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        df = make_df(spark, a.rows)
        run_ceiling(df)  # start the executors' Python workers before anything is timed
        ceiling, tfnb_runs, tfos = [], [], []
        cluster = start_tfos(spark) if have_tfos else None
        for i in range(a.repeat):
            ceiling.append(run_ceiling(df))
            tfnb_runs.append(run_tfnb(spark, df, a.rows))
            if cluster is not None:
                tfos.append(run_tfos(cluster, df))
            d = tfnb_runs[-1][2]
            print(f"round {i + 1}: ceiling {ceiling[-1][0]:.2f} s (job {ceiling[-1][1]:.2f} s) | tfnb "
                  f"{tfnb_runs[-1][0]:.2f} s = check {d['check']:.2f} + spill {d['spill']:.2f} + loop {d['loop']:.2f} "
                  f"(end to end {tfnb_runs[-1][1]:.2f} s)" + (f" | tfos {tfos[-1]:.2f} s" if tfos else ""), flush=True)
        if cluster is not None:
            cluster.shutdown()

        best_ceiling = min(ceiling)
        best = min(tfnb_runs, key=lambda r: r[0])
        d = best[2]
        print(f"\nfeeding {a.rows:,} rows x {WIDTH} float32 ({a.rows * ROW_BYTES / 1e6:.1f} MB), {a.master}, "
              f"best of {a.repeat}")
        print(_line("ceiling", best_ceiling[0], a.rows, min(c[1] for c in ceiling)))
        print(_line("tfnb", best[0], d["rows"], min(r[1] for r in tfnb_runs)))
        print(_line("  spill", d["spill"], a.rows) + "   Spark -> local Arrow file (in the task)")
        print(_line("  loop", d["loop"], d["rows"]) + "   file -> tf.data loop (each later epoch)")
        tfnb_rate = d["rows"] / best[0]
        if tfos:
            print(_line("tfos", min(tfos), a.rows))
            print(f"tfnb / TensorFlowOnSpark: {tfnb_rate / (a.rows / min(tfos)):6.1f} x   (goal >= 20)")
        print(f"tfnb / ceiling:           {tfnb_rate / (a.rows / best_ceiling[0]):6.2f} x   (goal >= 0.8)")
        print(f"tfnb spill / ceiling:     {best_ceiling[0] / d['spill']:6.2f} x   (the Spark side alone)")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
