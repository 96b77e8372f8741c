"""One TensorFlowOnSpark program, InputMode.SPARK, run by TensorFlowOnSpark 2.2.5 and by tfnb.compat.

    ./dev bench compat [--rows 200000] [--master 'local-cluster[2,1,2048]'] [--repeat 2]

The program is the same function for both: each node drains ``ctx.get_data_feed()`` with
``next_batch(1000)`` into a tf.data generator (TensorFlowOnSpark's fastest documented pattern). The
RDD: ``rows`` lists of 64 floats, two partitions, cached.

  anchor   a plain Spark pass over the cached RDD (every row unpickled in a Python task).
  tfos     TensorFlowOnSpark's ``cluster.train(rdd, 1)``. Its nodes were started (and imported
           TensorFlow) in ``TFCluster.run``, which is not timed.
  compat   tfnb.compat's ``cluster.train(rdd, 1)``, end to end: chunking the RDD, the barrier job,
           starting the node processes and importing TensorFlow all happen inside it.
  loop     inside tfnb.compat's map_fun: first ``next_batch`` to the last (the rows already on disk).

Prints rows/s for each and the ratios compat/tfos (end to end against TensorFlowOnSpark's feeding
alone) and loop/anchor. On a shared machine compare the ratios of one run, not absolute figures.

TensorFlowOnSpark is not a tfnb dependency; install it for this bench only:

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

from harness import session, tfos_available, use_checkout

use_checkout()

WIDTH = 64
BATCH = 1000


def consume(args, ctx) -> None:
    """The TensorFlowOnSpark program both run: DataFeed -> tf.data generator, timed from the inside."""
    import numpy as np
    import tensorflow as tf

    feed = ctx.get_data_feed(train_mode=True)
    seen = {"rows": 0, "start": None}

    def batches():
        while not feed.should_stop():
            batch = feed.next_batch(BATCH)
            if len(batch) == 0:
                return
            if seen["start"] is None:
                seen["start"] = time.time()
            seen["rows"] += len(batch)
            yield np.asarray(batch, dtype=np.float32)

    ds = tf.data.Dataset.from_generator(batches, output_signature=tf.TensorSpec((None, WIDTH), tf.float32))
    for _ in ds:
        pass
    report = {"rows": seen["rows"], "loop": time.time() - (seen["start"] or time.time())}
    with open(os.path.join(args.out, f"{args.tag}-{ctx.executor_id}.json"), "w") as f:
        json.dump(report, f)


def make_rdd(sc, rows: int):
    rdd = sc.parallelize(range(rows), 2).map(lambda i: [float(i + j) for j in range(WIDTH)]).cache()
    assert rdd.count() == rows
    return rdd


def run_anchor(rdd) -> float:
    start = time.perf_counter()
    rdd.map(len).sum()
    return time.perf_counter() - start


def run_compat(sc, rdd, rows: int, out: str, round_no: int) -> tuple[float, float]:
    """(train() seconds, slowest node's loop seconds)."""
    from tfnb.compat import TFCluster

    tag = f"compat{round_no}"
    cluster = TFCluster.run(sc, consume, argparse.Namespace(out=out, tag=tag), 2, 0,
                            input_mode=TFCluster.InputMode.SPARK, display=False)
    start = time.perf_counter()
    cluster.train(rdd, num_epochs=1)
    took = time.perf_counter() - start
    cluster.shutdown()
    reports = [json.load(open(p)) for p in glob.glob(os.path.join(out, f"{tag}-*.json"))]
    assert len(reports) == 2 and sum(r["rows"] for r in reports) == rows - rows % 2, reports
    return took, max(r["loop"] for r in reports)


def run_tfos(cluster, rdd) -> float:
    start = time.perf_counter()
    cluster.train(rdd, num_epochs=1)
    return time.perf_counter() - start


def _line(name: str, seconds: float, rows: int, note: str = "") -> str:
    return f"{name:8s} {rows / seconds:>12,.0f} rows/s  {seconds:7.2f} s  {note}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--master", default="local-cluster[2,1,2048]")
    p.add_argument("--repeat", type=int, default=2, help="rounds; the best of each is reported")
    p.add_argument("--no-tfos", action="store_true", help="skip TensorFlowOnSpark")
    a = p.parse_args()

    have_tfos = tfos_available(a.no_tfos)

    spark = session(a.master, "tfnb-bench-compat", **{"spark.executor.memory": "1g"})
    sc = spark.sparkContext
    out = tempfile.mkdtemp(prefix="tfnb-bench-compat-")
    try:
        rdd = make_rdd(sc, a.rows)
        run_anchor(rdd)  # start the executors' Python workers before anything is timed
        tfos_cluster = None
        if have_tfos:
            from tensorflowonspark import TFCluster as TfosCluster

            tfos_cluster = TfosCluster.run(sc, consume, argparse.Namespace(out=out, tag="tfos"), 2, 0,
                                           input_mode=TfosCluster.InputMode.SPARK)
        anchor, compat, loop, tfos = [], [], [], []
        for i in range(a.repeat):
            anchor.append(run_anchor(rdd))
            took, slowest = run_compat(sc, rdd, a.rows, out, i)
            compat.append(took)
            loop.append(slowest)
            if tfos_cluster is not None:
                tfos.append(run_tfos(tfos_cluster, rdd))
            print(f"round {i + 1}: anchor {anchor[-1]:.2f} s | compat train() {compat[-1]:.2f} s (loop "
                  f"{loop[-1]:.2f} s)" + (f" | tfos train() {tfos[-1]:.2f} s" if tfos else ""), flush=True)
        if tfos_cluster is not None:
            tfos_cluster.shutdown()

        fed = a.rows - a.rows % 2
        print(f"\nTensorFlowOnSpark program, InputMode.SPARK, {a.rows:,} rows x {WIDTH} floats, {a.master}, "
              f"best of {a.repeat}")
        print(_line("anchor", min(anchor), a.rows, "plain Spark pass over the cached RDD"))
        if tfos:
            print(_line("tfos", min(tfos), a.rows, "TensorFlowOnSpark train(); node start not counted"))
        print(_line("compat", min(compat), fed, "tfnb.compat train(), launch + TF import included"))
        print(_line("  loop", min(loop), fed // 2, "per node: DataFeed -> tf.data, rows on local disk"))
        if tfos:
            print(f"compat / TensorFlowOnSpark (train()):  {min(tfos) / min(compat):6.2f} x")
        print(f"loop (per node) / anchor:              {(fed // 2 / min(loop)) / (a.rows / min(anchor)):6.2f} x")
    finally:
        shutil.rmtree(out, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
