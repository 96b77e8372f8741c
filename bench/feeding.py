"""Feeding throughput: a cached DataFrame into a consuming tf.data loop, against Spark's own Arrow path.

    ./dev bench feeding [--rows 200000] [--big-rows 2000000] [--workers 1,2,4] [--repeat 1] [--no-tfos]

The DataFrame: ``rows`` x one array<float> column of 64 elements (256 B a row), cached, one
partition per worker (``df.repartition(n).cache()``, as the README recommends). Three ways, on ``--master`` (default local-cluster[2,1,2048]):

  ceiling  a no-op ``df.mapInArrow(count, barrier=True)``: Spark's own Arrow path into Python tasks.
  tfnb     ``tfnb.run(consume, num_workers=2, data=df)``; each train_fn process iterates
           ``ctx.dataset(1000)`` with a Python for-loop, twice (the first epoch streams while the
           task receives the partition, the second reads the local file).
  tfos     TensorFlowOnSpark 2.2.5, InputMode.SPARK: ``cluster.train(rdd)``, each node consuming a
           tf.data generator over ``DataFeed.next_batch(1000)`` (its fastest documented pattern).

Timed while rows move ("stream"): the ceiling's tasks from first to last batch; for tfnb the split
check (read from the cached plan; a DataFrame split some other way costs one counting job over the
cache, printed separately) + the first epoch from the moment both ends are ready (the
task has its first batch and train_fn has built ``ctx.dataset``) to train_fn's last batch;
TensorFlowOnSpark's whole ``train()`` call. ``import tensorflow`` and job launch are not counted
(tfnb overlaps them with the transfer: the task receives while train_fn imports TensorFlow); the
end-to-end wall times are printed too. Also printed: peak RSS of the task and train_fn processes
at ``--rows`` and ``--big-rows`` (bounded: it must not grow with the rows), and how the stream time
grows with the rows and with the workers (``--workers``, on local-cluster[4,1,1024]).

The last line is ``RESULT {json}`` for bench/all.py. On a shared machine compare the ratios of one
run, not absolute figures.

TensorFlowOnSpark is not a tfnb dependency; install it for this bench only (or put it on PYTHONPATH):

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


def _peak_rss_mb(pid: str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def tfnb_consume(ctx, launched: float, outdir: str) -> dict:
    entered = time.time()
    ds = ctx.dataset(BATCH)
    # The consumer is ready once its pipeline is built (TensorFlow's one-time tf.data set-up, ~0.2-0.6 s).
    ready = time.time()
    rows, first = 0, None
    for x in ds:
        first = first or time.time()
        rows += int(x.shape[0])
    epoch1 = time.time()
    again = sum(int(x.shape[0]) for x in ds)
    done = time.time()
    final = ctx.feed.state()["final"]
    report = {"rank": ctx.task_index, "rows": rows, "again": again, "ready": ready, "first_read": first,
              "build": ready - entered,
              "epoch1_end": epoch1, "loop": done - epoch1, "spill": final["seconds"],
              "received_first": final["first"], "received_last": final["last"], "wall": done - launched,
              # The train_fn process's parent is the Spark task's Python worker.
              "rss_train_fn": _peak_rss_mb(), "rss_task": _peak_rss_mb(str(os.getppid()))}
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


def make_df(spark, rows: int, partitions: int = 2, split: bool = True):
    """The fed DataFrame, cached one partition per worker: split the way the README says
    (``repartition(n).cache()``), or (``split=False``) by ``range`` alone, which only a count can vouch for."""
    from pyspark.sql import functions as F

    features = F.transform(F.array_repeat(F.lit(0.0), WIDTH), lambda _, i: (F.col("id") + i).cast("float"))
    df = spark.range(0, rows, 1, partitions).select(features.alias("features"))
    df = (df.repartition(partitions) if split else df).cache()
    assert df.count() == rows
    return df


def run_ceiling(df) -> tuple[float, float]:
    """(stream seconds, wall seconds) of a no-op barrier mapInArrow over ``df``."""
    start = time.perf_counter()
    out = df.mapInArrow(_count, "n long, stream double", barrier=True).collect()
    wall = time.perf_counter() - start
    assert sum(r["n"] for r in out) == df.count()
    return max(r["stream"] for r in out), wall


def run_tfnb(spark, df, rows: int, workers: int = 2) -> tuple[float, float, dict]:
    """(stream seconds, wall seconds, details) of feeding ``df`` to ``workers`` train_fn processes."""
    import tfnb
    from tfnb.data.feeding import split_for_workers

    # The same check tfnb.run makes before its job, timed on its own.
    start = time.perf_counter()
    split_for_workers(df, workers)
    check = time.perf_counter() - start
    outdir = tempfile.mkdtemp(prefix="tfnb-bench-feed-")
    try:
        tfnb.run(tfnb_consume, num_workers=workers, args=(time.time(), outdir), data=df, spark=spark,
                 display=False)
        reports = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(outdir, "tfnb-*.json")))]
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    fed = sum(r["rows"] for r in reports)
    assert len(reports) == workers and fed >= rows - workers * BATCH, reports
    assert all(r["again"] == r["rows"] == reports[0]["rows"] for r in reports), reports
    # Rows move once both ends are ready: the task has its first batch, train_fn has asked for data.
    moving = max(r["epoch1_end"] - max(r["received_first"], r["ready"]) for r in reports)
    details = {"rows": fed, "check": check, "moving": moving,
               "spill": max(r["spill"] for r in reports), "loop": max(r["loop"] for r in reports),
               "build": max(r["build"] for r in reports),
               "receive": max(r["received_last"] - r["received_first"] for r in reports),
               "ready_after_first_batch": max(r["ready"] - r["received_first"] for r in reports),
               # What Keras' steps_per_epoch (the final counts) costs on top of a streamed loop.
               "counts_wait": max(0.0, max(r["received_last"] for r in reports) - min(r["ready"] for r in reports)),
               "first_read_before_last_received": all(r["first_read"] < r["received_last"] for r in reports),
               "rss_task": max(r["rss_task"] for r in reports),
               "rss_train_fn": max(r["rss_train_fn"] for r in reports)}
    return check + moving, max(r["wall"] for r in reports), details


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


def _session(master: str, name: str):
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName(name)
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.executor.memory", "1g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _details(d: dict) -> str:
    return (f"check {d['check']:.2f} + moving {d['moving']:.2f} s (task receives in {d['receive']:.2f} s, "
            f"writes in {d['spill']:.2f} s; train_fn ready {d['ready_after_first_batch']:+.2f} s after the "
            f"first batch with its dataset built in {d['build']:.2f} s, counts final {d['counts_wait']:.2f} s after that; later epoch {d['loop']:.2f} s) | peak RSS task {d['rss_task']:.0f} MB, "
            f"train_fn {d['rss_train_fn']:.0f} MB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--big-rows", type=int, default=2_000_000, help="second size for the scaling line; 0 skips")
    p.add_argument("--workers", default="1,2,4", help="worker counts for the scaling line; '' skips")
    p.add_argument("--master", default="local-cluster[2,1,2048]")
    p.add_argument("--repeat", type=int, default=1, help="rounds at --rows; the best of each way is reported")
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

    result: dict = {"bench": "feeding", "rows": a.rows, "master": a.master, "ratios": {}, "goals": {}}
    spark = _session(a.master, "tfnb-bench-feeding")
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
            print(f"round {i + 1}: ceiling {ceiling[-1][0]:.2f} s (job {ceiling[-1][1]:.2f} s) | tfnb "
                  f"{tfnb_runs[-1][0]:.2f} s = {_details(tfnb_runs[-1][2])} (end to end {tfnb_runs[-1][1]:.2f} s)"
                  + (f" | tfos {tfos[-1]:.2f} s" if tfos else ""), flush=True)
        if cluster is not None:
            cluster.shutdown()
        df.unpersist()

        best_ceiling = min(ceiling)
        best = min(tfnb_runs, key=lambda r: r[0])
        d = best[2]
        print(f"\nfeeding {a.rows:,} rows x {WIDTH} float32 ({a.rows * ROW_BYTES / 1e6:.1f} MB), {a.master}, "
              f"best of {a.repeat}")
        print(_line("ceiling", best_ceiling[0], a.rows, min(c[1] for c in ceiling)))
        print(_line("tfnb", best[0], d["rows"], min(r[1] for r in tfnb_runs)))
        print(_line("  receive", d["receive"], a.rows) + "   Spark -> task -> local Arrow file")
        print(_line("  loop", d["loop"], d["rows"]) + "   local file -> tf.data loop (each later epoch)")
        print(f"  first batch reached train_fn before the task had its last batch: "
              f"{d['first_read_before_last_received']}")
        tfnb_rate = d["rows"] / best[0]
        ceiling_ratio = tfnb_rate / (a.rows / best_ceiling[0])
        result["ratios"]["feeding vs ceiling"] = round(ceiling_ratio, 3)
        result["goals"]["feeding vs ceiling"] = 0.8
        if tfos:
            print(_line("tfos", min(tfos), a.rows))
            tfos_ratio = tfnb_rate / (a.rows / min(tfos))
            print(f"tfnb / TensorFlowOnSpark: {tfos_ratio:6.1f} x   (goal >= 30)")
            result["ratios"]["feeding vs TFoS"] = round(tfos_ratio, 2)
            result["goals"]["feeding vs TFoS"] = 30
        print(f"tfnb / ceiling:           {ceiling_ratio:6.2f} x   (goal >= 0.8)")
        print(f"tfnb receive / ceiling:   {best_ceiling[0] / d['receive']:6.2f} x   (the Spark side alone)")
        from tfnb.data.feeding import split_for_workers

        counted = make_df(spark, a.rows, split=False)
        start = time.perf_counter()
        split_for_workers(counted, 2)
        count_s = time.perf_counter() - start
        counted.unpersist()
        print(f"split check: {d['check']:.2f} s on the cached repartition(n) (read from its plan), {count_s:.2f} s "
              "(one counting job) on a DataFrame cached in 2 partitions that only a count can vouch for")
        result["check_seconds"] = {"repartition(n).cache()": round(d["check"], 3), "counted": round(count_s, 3)}
        rows_line = [(a.rows, best_ceiling[0], best[0], d)]

        if a.big_rows:
            big = make_df(spark, a.big_rows)
            run_ceiling(big)
            c_big = run_ceiling(big)
            t_big = run_tfnb(spark, big, a.big_rows)
            big.unpersist()
            rows_line.append((a.big_rows, c_big[0], t_big[0], t_big[2]))
            print("\nrows scaling (2 workers): tfnb stream per 100k rows, ceiling per 100k rows, peak RSS")
            for n, c, t, dd in rows_line:
                print(f"  {n:>10,} rows: tfnb {t / n * 1e5:6.3f} s  ceiling {c / n * 1e5:6.3f} s  "
                      f"ratio {c / t:5.2f} x | peak RSS task {dd['rss_task']:.0f} MB, train_fn {dd['rss_train_fn']:.0f} MB"
                      f" | {_details(dd)}")
            result["ratios"]["feeding vs ceiling, big"] = round(c_big[0] / t_big[0], 3)
            result["goals"]["feeding vs ceiling, big"] = 0.8
            result["rss_mb"] = {str(n): [round(dd["rss_task"]), round(dd["rss_train_fn"])] for n, _, _, dd in rows_line}
    finally:
        spark.stop()

    counts = [int(w) for w in a.workers.split(",") if w.strip()]
    if counts:
        spark = _session(f"local-cluster[{max(counts)},1,1024]", "tfnb-bench-feeding-workers")
        try:
            print(f"\nworkers scaling ({a.rows:,} rows in all, local-cluster[{max(counts)},1,1024]):")
            for n in counts:
                df = make_df(spark, a.rows, n)
                run_ceiling(df)
                c = run_ceiling(df)
                t = run_tfnb(spark, df, a.rows, n)
                df.unpersist()
                print(f"  {n} worker(s): tfnb {t[0]:6.2f} s  ceiling {c[0]:6.2f} s  ratio {c[0] / t[0]:5.2f} x"
                      f" | {_details(t[2])}", flush=True)
                result.setdefault("workers", {})[str(n)] = {"tfnb": round(t[0], 3), "ceiling": round(c[0], 3)}
        finally:
            spark.stop()
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
