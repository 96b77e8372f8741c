"""Call -> first training step under tfnb.run, broken into phases, against the floor measured in the same run.

Floor = a warm empty barrier job (2 tasks) + ``import tensorflow`` in a fresh process: the two costs no
launcher can avoid. Goal: tfnb's call -> first step <= 1.0 x floor (issue 12).
The last line is ``RESULT {json}`` for bench/all.py.

    ./dev bench launch [--repeats 3] [--workers 2]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from harness import median, report, session, use_checkout

use_checkout()


def one_step(strategy):
    """One training step of a small model under ``strategy``; returns the time it finished."""
    import time as _t

    import tensorflow as tf

    with strategy.scope():
        w = tf.Variable(tf.zeros((64, 10)))
        opt = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def step(x):
        def replica(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(x @ w))
            opt.apply_gradients([(tape.gradient(loss, w), w)])
            return loss

        return strategy.reduce("SUM", strategy.run(replica, args=(x,)), axis=None)

    step(tf.ones((32, 64))).numpy()
    return _t.time()


def first_step(ctx):
    """MWMS init + one training step; reports a timestamp after each phase (``ctx.report``)."""
    import time as _t

    ctx.report(phase="train_fn entered", t=_t.time())
    import tensorflow as tf

    ctx.report(phase="tensorflow imported", t=_t.time())
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ctx.report(phase="strategy ready", t=_t.time())
    done = one_step(strategy)
    ctx.report(phase="first step done", t=done)
    return done


def measure_tfnb(spark, workers):
    import tfnb

    marks = {}

    def display(event):
        if event.job_name != "chief":
            return
        if event.kind == "state" and event.data.get("state") in ("starting", "training"):
            marks.setdefault("task " + event.data["state"], event.time)
        elif event.kind == "progress" and "phase" in event.data:
            marks.setdefault(event.data["phase"], event.data["t"])

    t0 = time.time()
    # a first run: a fresh process per task (bench/rerun measures reruns with warm standbys)
    done = tfnb.run(first_step, num_workers=workers, spark=spark, display=display, warm=False)
    marks["first step done"] = done
    return {k: v - t0 for k, v in sorted(marks.items(), key=lambda kv: kv[1])}


def measure_empty_barrier(spark, workers):
    t0 = time.perf_counter()
    spark.range(0, workers, 1, workers).mapInArrow(lambda it: it, "id long", barrier=True).collect()
    return time.perf_counter() - t0


def measure_import_tf():
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import tensorflow"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    spark = session(f"local[{args.workers}]", "bench-launch")
    measure_empty_barrier(spark, args.workers)  # warm the JVM and Python workers
    measure_import_tf()
    barrier, imports, runs = [], [], []
    for _ in range(args.repeats):
        barrier.append(measure_empty_barrier(spark, args.workers))
        imports.append(measure_import_tf())
        runs.append(measure_tfnb(spark, args.workers))
    spark.stop()
    floor = median(barrier) + median(imports)
    total = median(r["first step done"] for r in runs)
    print(f"\nbench/launch: {args.workers} workers, local[{args.workers}], median of {args.repeats}")
    print(f"  floor: empty barrier job {median(barrier):.2f} s + import tensorflow "
          f"{median(imports):.2f} s = {floor:.2f} s")
    print("  tfnb phases (seconds since tfnb.run was called, chief, median):")
    for name in runs[0]:
        vals = [r[name] for r in runs if name in r]
        print(f"    {name:<22} {median(vals):6.2f}")
    print(f"  call -> first step: {total:.2f} s")
    print(f"  ratio to floor: {total / floor:.2f}  (goal <= 1.0)")
    report("launch", {"launch vs floor": total / floor}, {"launch vs floor": 1.0}, seconds=round(total, 2),
           floor=round(floor, 2))


if __name__ == "__main__":
    main()
