"""Feeding throughput: a cached DataFrame into a consuming tf.data loop, against Spark's own Arrow path.

    ./dev bench feeding [--rows 200000 2000000 10000000] [--workers 2 4] [--rounds 3] [--no-tfos] [--task-only]
    ./dev bench feeding --autotune [--rows 1000000] [--rounds 5]

The DataFrame: ``rows`` x one array<float> column of 64 elements (256 B a row), cached, one
partition per worker (``df.repartition(n).cache()``, as the docs recommend), on
``local-cluster[workers,1,...]`` with executors large enough to cache the largest size. Ways:

  ceiling  a no-op ``df.mapInArrow(count, barrier=True)``: Spark's own Arrow path into Python tasks.
  tfnb     ``tfnb.run(consume, num_workers=n, data=df)``; each train_fn process iterates
           ``ctx.dataset(1000)`` with a Python for-loop, twice (the first epoch streams while the
           task receives the partition, the second reads the local copy).
  bare     the same ``tfnb.run`` without ``data=``: the run's own cost, for the marginal below.
  task     (``--task-only``, instead of the others) the same ``tfnb.run`` whose train_fn reads nothing: the
           task's side alone, receiving the partition and writing the local file, first to last batch as the
           ceiling is timed. A diagnostic that splits the gap between the two ends; no goal.
  tfos     TensorFlowOnSpark 2.2.5, InputMode.SPARK: ``cluster.train(rdd)``, each node consuming a
           tf.data generator over ``DataFeed.next_batch(1000)`` (its fastest documented pattern),
           at the first size with 2 workers.

Two ratios per size, each the median of ``--rounds`` rounds that interleave the ways:

- **tfnb / ceiling** (rows while they move, "stream"): the ceiling's tasks from first to last batch;
  for tfnb the split check + the first epoch from the moment both ends are ready (the task has its
  first batch and train_fn has built ``ctx.dataset``) to train_fn's last batch. Unchanged definition,
  so ratios stay comparable between runs.
- **data= marginal / mapInArrow pass** (end to end): the wall time of the mapInArrow job against what
  ``data=`` adds to a run (the run with data minus the bare run, less the consumer's second epoch as
  train_fn times it: one pass against one pass).

Also printed: peak RSS of the task and train_fn processes (bounded: it must not grow with the rows)
and the scaling curve, seconds per 100k rows of tfnb and the ceiling at every size and worker count,
which ``bench/all.py`` copies into results.md and draws.

``--autotune`` (instead of the above, no Spark): ``ctx.dataset`` over a finished local part of
``rows`` rows (what every epoch after the first reads), as it is (tf.data autotuning off) against the
same dataset with ``options.autotune.enabled = True``, interleaved round by round in one process, under
three consumers: a bare loop, a user's ``map(num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)`` on top,
and tf-keras ``fit`` of a small MLP. The ratio is seconds off / seconds on (above 1: autotuning helps).

TensorFlowOnSpark is not a tfnb dependency; install it for this bench only (or put it on PYTHONPATH):

    .venv/bin/pip install tensorflowonspark==2.2.5 --no-deps
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import tempfile
import time

from harness import median, report, session, spread, tfos_available, use_checkout

use_checkout()

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


def _task_rss_mb(spill_path: str) -> float:
    """Peak RSS of the Spark task's Python worker that wrote ``spill_path``. train_fn's parent is the executor's
    warm standby, not the task; a spill in /dev/shm is named after the task's pid (tfnb-feed-<uid>-<pid>-...)."""
    import re

    m = re.search(r"tfnb-feed-\d+-(\d+)-", spill_path)
    try:
        return _peak_rss_mb(m.group(1)) if m else float("nan")
    except OSError:
        return float("nan")


def tfnb_consume(ctx, outdir: str) -> dict:
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
              "received_first": final["first"], "received_last": final["last"],
              "rss_train_fn": _peak_rss_mb(), "rss_task": _task_rss_mb(ctx.feed.path)}
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


def _nothing(ctx) -> None:
    return None


def _fed_run(spark, df, workers: int, train_fn) -> tuple[float, list]:
    """(wall seconds of the tfnb.run call, what each train_fn wrote) of ``train_fn(ctx, outdir)`` fed ``df``."""
    import tfnb

    outdir = tempfile.mkdtemp(prefix="tfnb-bench-feed-")
    standbys_ready(workers)
    try:
        start = time.perf_counter()
        tfnb.run(train_fn, num_workers=workers, args=(outdir,), data=df, spark=spark, display=False)
        wall = time.perf_counter() - start
        return wall, [json.load(open(p)) for p in sorted(glob.glob(os.path.join(outdir, "*.json")))]
    finally:
        shutil.rmtree(outdir, ignore_errors=True)


def run_tfnb(spark, df, rows: int, workers: int = 2) -> tuple[float, float, dict]:
    """(stream seconds, wall seconds of the tfnb.run call, details) of feeding ``df`` to ``workers`` train_fns."""
    from tfnb.data.feeding import split_for_workers

    # The same check tfnb.run makes before its job, timed on its own.
    start = time.perf_counter()
    split_for_workers(df, workers)
    check = time.perf_counter() - start
    wall, reports = _fed_run(spark, df, workers, tfnb_consume)
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
    return check + moving, wall, details


def standbys_ready(workers: int, timeout: float = 120.0) -> None:
    """Wait until the last run's warm standbys have imported TensorFlow, so every timed run starts alike."""
    from tfnb._task.warm import _sockets

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = [p for p in _sockets() if p.endswith(".sock")]
        if len(ready) >= workers and len(ready) == len(_sockets()):
            return
        time.sleep(0.2)


def task_only(ctx, outdir: str) -> None:
    final = ctx.feed.state(lambda s: s["final"] is not None)["final"]
    with open(os.path.join(outdir, f"task-{ctx.task_index}.json"), "w") as f:
        json.dump(final["last"] - final["first"], f)


def run_task_only(spark, df, workers: int) -> float:
    """Seconds the slowest task takes to receive and write its partition while train_fn reads none of it."""
    return max(_fed_run(spark, df, workers, task_only)[1])


def measure_task_only(spark, rows: int, workers: int, rounds: int) -> None:
    df = make_df(spark, rows, workers)
    run_ceiling(df)
    run_task_only(spark, df, workers)
    ratios = []
    for i in range(rounds):
        c, t = run_ceiling(df)[0], run_task_only(spark, df, workers)
        ratios.append(c / t)
        print(f"  {rows:>10,} rows, {workers} workers, round {i + 1}: ceiling {c:.2f} s | task alone {t:.2f} s",
              flush=True)
    df.unpersist()
    print(f"  {rows:>10,} rows: task alone (train_fn reads nothing) / ceiling {spread(ratios)}", flush=True)


def run_bare(spark, workers: int) -> float:
    """Wall seconds of the same tfnb.run without data=: what a run costs before any row moves."""
    import tfnb

    standbys_ready(workers)
    start = time.perf_counter()
    tfnb.run(_nothing, num_workers=workers, spark=spark, display=False)
    return time.perf_counter() - start


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


def _details(d: dict) -> str:
    return (f"check {d['check']:.2f} + moving {d['moving']:.2f} s (task receives in {d['receive']:.2f} s, "
            f"writes in {d['spill']:.2f} s; train_fn ready {d['ready_after_first_batch']:+.2f} s after the "
            f"first batch, counts final {d['counts_wait']:.2f} s after that; later epoch {d['loop']:.2f} s) | "
            f"peak RSS task {d['rss_task']:.0f} MB, train_fn {d['rss_train_fn']:.0f} MB")


def measure(spark, rows: int, workers: int, rounds: int, tfos_cluster=None) -> dict:
    """Ceiling, tfnb and the bare run, interleaved round by round over one cached frame; medians."""
    df = make_df(spark, rows, workers)
    run_ceiling(df)       # the executors' Python workers start before anything is timed
    run_bare(spark, workers)  # and tfnb's warm standbys
    got: dict = {"ceiling": [], "tfnb": [], "wall": [], "bare": [], "ceiling_wall": [], "tfos": [], "details": []}
    for i in range(rounds):
        c, c_wall = run_ceiling(df)
        t, t_wall, d = run_tfnb(spark, df, rows, workers)
        bare = run_bare(spark, workers)
        for key, value in (("ceiling", c), ("ceiling_wall", c_wall), ("tfnb", t), ("wall", t_wall), ("bare", bare),
                           ("details", d)):
            got[key].append(value)
        if tfos_cluster is not None:
            got["tfos"].append(run_tfos(tfos_cluster, df))
        print(f"  {rows:>10,} rows, {workers} workers, round {i + 1}: ceiling {c:.2f} s | tfnb {t:.2f} s = "
              f"{_details(d)} | data= marginal {t_wall - bare - d['loop']:.2f} s vs ceiling job {c_wall:.2f} s",
              flush=True)
    df.unpersist()
    stream = [c / t for c, t in zip(got["ceiling"], got["tfnb"])]
    # the marginal from the medians of each way (a difference of two run times is noisier than either), less
    # the consumer's second epoch: a read of the local copy, training's work, where the ceiling passes once
    added = median(got["wall"]) - median(got["bare"]) - median([d["loop"] for d in got["details"]])
    marginal = median(got["ceiling_wall"]) / max(added, 0.01)
    middle = sorted(range(rounds), key=lambda i: stream[i])[rounds // 2]
    return {"rows": rows, "workers": workers, "stream": stream, "marginal": marginal, "added": added,
            "ceiling_wall": median(got["ceiling_wall"]),
            "ceiling_per_100k": median(got["ceiling"]) / rows * 1e5, "tfnb_per_100k": median(got["tfnb"]) / rows * 1e5,
            "details": got["details"][middle], "tfos": got["tfos"], "tfnb_rate": rows / median(got["tfnb"])}


# ---------------------------------------------------------------- --autotune: tf.data autotuning off / on


def _finished_part(rows: int, workdir: str):
    """A WorkerContext over a whole local part of ``rows`` rows (features[64] and a label), as the task leaves
    it for train_fn's later epochs."""
    import numpy as np
    import pyarrow as pa

    from tfnb._task import feed
    from tfnb._task.context import WorkerContext

    spec = feed.FeedSpec((feed.FeedColumn("features", "float32", True), feed.FeedColumn("y", "float32", False)))

    def batches():
        rng = np.random.default_rng(0)
        for start in range(0, rows, 10_000):
            x = rng.standard_normal((min(10_000, rows - start), WIDTH), dtype=np.float32)
            offsets = pa.array(np.arange(0, x.size + 1, WIDTH, dtype="int32"))
            yield pa.RecordBatch.from_arrays([pa.ListArray.from_arrays(offsets, pa.array(x.ravel())),
                                              pa.array(x.sum(axis=1))], names=["features", "y"])

    stream = feed.FeedStream(spec, workdir, 1, counts=[rows])
    stream.pump(batches(), lambda rows, done: None)
    return WorkerContext(task_index=0, num_workers=1, job_name="chief", cluster_spec={}, tf_config={},
                         feed=stream.info)


def _autotune_consumers(tf):
    """name -> (what it adds to ctx.dataset's pipeline, what consumes one epoch of it)."""
    w = tf.random.normal((WIDTH, WIDTH))
    model = tf.keras.Sequential([tf.keras.layers.Input((WIDTH,)), tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile("adam", "mse")

    def loop(ds) -> int:
        return sum(int(x.shape[0]) for x, _ in ds)

    def user_map(ds):
        return ds.map(lambda x, y: (tf.nn.relu(tf.matmul(x, w)), y),
                      num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    return {"loop": (lambda ds: ds, loop), "map(AUTOTUNE)": (user_map, loop),
            "keras fit": (lambda ds: ds, lambda ds: model.fit(ds, epochs=1, verbose=0))}


def measure_autotune(rows: int, rounds: int) -> None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")   # tfnb.run's default: tf-keras
    import tensorflow as tf

    workdir = tempfile.mkdtemp(prefix="tfnb-bench-autotune-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        ctx = _finished_part(rows, workdir)
        on = tf.data.Options()
        on.autotune.enabled = True
        ratios, table = {}, [["consumer", "autotune off s (median [range])", "on s", "off / on (median [range])"]]
        for name, (build, consume) in _autotune_consumers(tf).items():
            pipelines = {"off": build(ctx.dataset(BATCH, label_col="y")),
                         "on": build(ctx.dataset(BATCH, label_col="y").with_options(on))}
            for ds in pipelines.values():
                consume(ds)   # warm: tracing, Keras' first-call set-up
            took: dict = {"off": [], "on": []}
            for i in range(rounds):
                for way in ("off", "on") if i % 2 == 0 else ("on", "off"):
                    start = time.perf_counter()
                    consume(pipelines[way])
                    took[way].append(time.perf_counter() - start)
                print(f"  {name}, round {i + 1}: off {took['off'][-1]:.2f} s, on {took['on'][-1]:.2f} s", flush=True)
            ratio = [a / b for a, b in zip(took["off"], took["on"])]
            ratios[f"ctx.dataset autotune off / on, {name}"] = median(ratio)
            table.append([name, spread(took["off"]), spread(took["on"]), spread(ratio)])
            print(f"  {name}: off / on {spread(ratio)}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{rows:,} rows x {WIDTH} float32, batch {BATCH}, {rounds} rounds:\n"
          + "\n".join(" | ".join(map(str, r)) for r in table))
    report("feeding-autotune", ratios, {}, tables={"ctx.dataset: tf.data autotuning off / on": table})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[200_000, 2_000_000, 10_000_000],
                   help="sizes for the scaling curve (the first also runs TensorFlowOnSpark)")
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--rounds", type=int, default=3, help="rounds per size; ratios are the medians")
    p.add_argument("--no-tfos", action="store_true", help="skip TensorFlowOnSpark")
    p.add_argument("--task-only", action="store_true",
                   help="instead: the ceiling against the task's side alone (train_fn reads nothing)")
    p.add_argument("--autotune", action="store_true",
                   help="instead: ctx.dataset with tf.data autotuning off (as it is) and on, no Spark")
    a = p.parse_args()
    if a.autotune:
        measure_autotune(a.rows[0] if a.rows != p.get_default("rows") else 1_000_000, a.rounds)
        return

    have_tfos = tfos_available(a.no_tfos)

    ratios, goals, curve = {}, {}, []
    for workers in a.workers:
        # executors big enough to cache the largest frame: 256 B a row, memory-backed spill beside it
        mem = max(1536, 6144 // workers)
        master = f"local-cluster[{workers},1,{mem + 512}]"
        spark = session(master, f"tfnb-bench-feeding-{workers}", **{"spark.executor.memory": f"{mem}m"})
        print(f"\n{workers} workers on {master} (executor memory {mem} MB):", flush=True)
        try:
            for n, rows in enumerate(a.rows):
                if a.task_only:
                    measure_task_only(spark, rows, workers, a.rounds)
                    continue
                cluster = start_tfos(spark) if have_tfos and n == 0 and workers == 2 else None
                m = measure(spark, rows, workers, a.rounds, cluster)
                if cluster is not None:
                    cluster.shutdown()
                curve.append(m)
                label = "" if n == 0 else (", big" if n == 1 else ", largest")
                if workers != 2:
                    label += f", {workers} workers"
                ratios[f"feeding vs ceiling{label}"] = median(m["stream"])
                goals[f"feeding vs ceiling{label}"] = 0.8
                if n > 0:
                    ratios[f"data= marginal vs mapInArrow pass{label}"] = m["marginal"]
                    goals[f"data= marginal vs mapInArrow pass{label}"] = 0.9
                if m["tfos"]:
                    ratios["feeding vs TFoS"] = m["tfnb_rate"] / (rows / median(m["tfos"]))
                    goals["feeding vs TFoS"] = 30
                print(f"  {rows:>10,} rows: tfnb / ceiling {spread(m['stream'])}, data= marginal / mapInArrow pass "
                      f"{m['marginal']:.2f} ({m['added']:.2f} s added vs {m['ceiling_wall']:.2f} s), per 100k rows tfnb {m['tfnb_per_100k']:.3f} s, ceiling "
                      f"{m['ceiling_per_100k']:.3f} s | {_details(m['details'])}", flush=True)
        finally:
            spark.stop()
    if a.task_only:
        return

    table = [["workers", "rows", "tfnb s / 100k rows", "ceiling s / 100k rows", "tfnb / ceiling (median [range])",
              "data= marginal / mapInArrow pass", "peak RSS task / train_fn MB"]]
    for m in curve:
        d = m["details"]
        table.append([m["workers"], f"{m['rows']:,}", f"{m['tfnb_per_100k']:.3f}", f"{m['ceiling_per_100k']:.3f}",
                      spread(m["stream"]), f"{m['marginal']:.2f}", f"{d['rss_task']:.0f} / {d['rss_train_fn']:.0f}"])
    print("\nscaling: " + "\n".join(" | ".join(map(str, r)) for r in table))
    report("feeding", ratios, goals, tables={"Feeding: the scaling curve": table},
           curve=[{k: m[k] for k in ("rows", "workers", "tfnb_per_100k", "ceiling_per_100k")} for m in curve])


if __name__ == "__main__":
    main()
