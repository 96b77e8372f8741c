"""Keras 3 (``import keras``) under tfnb.run against the same model under tf-keras, in the same bench run; and
Keras 3's per-step cost under tfnb.run beside one process's Keras 3 ``fit``.

Each round runs, one after the other: a 2-worker MultiWorkerMirroredStrategy ``fit`` of Keras 3 under tfnb.run
(local[2]), the same with each step's metrics all-reduced over the workers (tfnb's correction before it read them at
epoch ends only), the same of tf-keras (``tf.keras`` with ``TF_USE_LEGACY_KERAS=1``, as tfnb sets it), and a plain
Keras 3 ``fit`` in one fresh process without a strategy. Same model, data, global batch and steps everywhere; the
first epoch (tracing, warm-up) is left out and the steady-state steps/s is that of the epochs after it.

The model: an MLP 256-512-512-10 (~400k parameters) on random float32 rows, global batch 256, plain SGD,
accuracy as a metric: 1.6 MB of gradients a step, so the all-reduce is a part of the step, not all of it.
Ratios: Keras 3 / tf-keras steps/s (goal >= 0.95), the median of the rounds' ratios; Keras 3 under tfnb.run vs
one process (ms a step, no goal).

``--breakdown`` instead times, in one pair of worker processes, 20-step chunks of four variants of the step in
turn (Keras 3 as tfnb corrects it, Keras 3 without the all-reduce of the step's metrics, tf-keras, tf-keras with
``distribute_reduction_method="first"``): what the step's collectives cost, at a granularity load cannot skew.

    ./dev bench keras3 [--rounds 5] [--steps 80] [--epochs 4] [--breakdown]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

from harness import median, report, session, spread, use_checkout

use_checkout()

FEATURES, HIDDEN, CLASSES, BATCH = 256, 512, 10, 256


def dataset(tf, steps: int):
    """``steps`` global batches of random rows, repeated: the same in every run and every process."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * BATCH, FEATURES), dtype=np.float32)
    y = rng.integers(0, CLASSES, steps * BATCH)
    options = tf.data.Options()  # in-memory data: say DATA rather than let AUTO try files first
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).cache().repeat().with_options(options)


def build(keras, strategy=None):
    """The compiled model, in ``strategy``'s scope when one is given."""
    keras.utils.set_random_seed(1)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential([keras.layers.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="relu"),
                                  keras.layers.Dense(HIDDEN, activation="relu"), keras.layers.Dense(CLASSES)])
        model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return model


def timed_fit(keras, tf, epochs: int, steps: int, strategy=None) -> dict:
    """Fit the model; seconds of each epoch.

    The timer has epoch hooks only: a per-batch hook would make tf-keras convert each step's logs and Keras 3 call
    its callbacks in the training thread, and neither would be measuring ``fit`` alone."""
    model = build(keras, strategy)
    seconds = []

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds.append(time.perf_counter() - self.start)

    model.fit(dataset(tf, steps), epochs=epochs, steps_per_epoch=steps, shuffle=False, verbose=0, callbacks=[Timer()])
    return {"epoch_seconds": seconds, "params": model.count_params()}


def legacy_keras(tf):
    """``tf.keras``, checked to be tf-keras (tfnb set TF_USE_LEGACY_KERAS=1 where it is installed)."""
    if not tf.keras.Model.__module__.startswith("tf_keras"):
        raise RuntimeError(f"tf.keras is {tf.keras.Model.__module__}, not tf-keras: pip install tf-keras")
    return tf.keras


def train_fn(ctx, flavour: str, epochs: int, steps: int) -> dict:
    """One 2-worker MultiWorkerMirroredStrategy fit: ``keras3`` (``import keras``) or ``tf-keras`` (``tf.keras``)."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if flavour.startswith("keras3"):
        import keras

        if flavour == "keras3-step-reduce":
            step_reduce(keras, strategy)
        out = timed_fit(keras, tf, epochs, steps, strategy)
        return {**out, "keras": keras.__version__, "patches": list(keras._tfnb.applied or ())}
    import tf_keras

    return {**timed_fit(legacy_keras(tf), tf, epochs, steps, strategy), "keras": tf_keras.__version__}


def step_reduce(keras, strategy) -> None:
    """tfnb's corrections as they were before: each step's metrics all-reduced over every worker (a collective a
    step), for the comparison in the same bench run."""
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer

    from tfnb._task.keras3 import ready

    ready(keras, strategy)  # the corrections, then the per-step reduction over tfnb's
    local = trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and trainer._collective_all_reduce_multi_worker(strategy):
            return tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return local(values, strategy, reduction)

    trainer.reduce_per_replica = reduce_per_replica


def one_process(epochs: int, steps: int) -> dict:
    """The same Keras 3 fit in a fresh process, no strategy: the whole global batch on one process."""
    proc = subprocess.run([sys.executable, __file__, "--one-process", "--epochs", str(epochs), "--steps", str(steps)],
                          stdout=subprocess.PIPE, text=True, check=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def steps_per_sec(out: dict, steps: int) -> float:
    """Steady state: the steps of every epoch after the first, over their seconds."""
    measured = out["epoch_seconds"][1:]
    return steps * len(measured) / sum(measured)


def breakdown_fn(ctx, rounds: int, steps: int) -> dict:
    """Steps/s of four variants of the step, ``steps``-step chunks in turn, ``rounds`` times (after 2 unmeasured)."""
    import keras
    import tensorflow as tf
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    data = dataset(tf, steps)
    models = {"Keras 3 (tfnb's corrections)": build(keras, strategy),
              "Keras 3, step metrics not all-reduced": build(keras, strategy),
              "tf-keras": build(legacy_keras(tf), strategy), "tf-keras, reduction 'first'": build(tf.keras, strategy)}
    models["tf-keras, reduction 'first'"].distribute_reduction_method = "first"
    corrected = None
    for name, model in models.items():
        model.fit(data, epochs=1, steps_per_epoch=2, verbose=0, shuffle=False)  # traces; the first applies tfnb's
        corrected = corrected or trainer.reduce_per_replica
        if "not all-reduced" in name:  # this worker's own running metrics: no collective after the gradients'
            trainer.reduce_per_replica = lambda values, strategy, reduction: tree.map_structure(
                lambda v: v.values[0] if isinstance(v, tf.distribute.DistributedValues) else v, values)
            model.make_train_function(force=True)
            model.fit(data, epochs=1, steps_per_epoch=2, verbose=0, shuffle=False)
            trainer.reduce_per_replica = corrected
    iterators = {name: iter(strategy.experimental_distribute_dataset(data)) for name in models}
    rates = {name: [] for name in models}
    for r in range(rounds + 2):
        for name, model in models.items():
            start = time.perf_counter()
            for _ in range(steps):
                logs = model.train_function(iterators[name])
            float(logs["loss"])
            if r >= 2:
                rates[name].append(steps / (time.perf_counter() - start))
    return rates


def breakdown(spark, rounds: int) -> None:
    import tfnb

    load = os.getloadavg()[0]
    rates = tfnb.run(breakdown_fn, num_workers=2, args=(rounds, 20), spark=spark, display=False, timeout=1800)
    base = rates["Keras 3 (tfnb's corrections)"]
    print(f"\nbench/keras3 --breakdown: 2 workers, local[2], {rounds} rounds of 20-step chunks; "
          f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    for name, values in rates.items():
        vs = [a / b for a, b in zip(values, base)]
        print(f"  {name:38s}: {1000 / median(values):5.1f} ms a step; steps/s vs Keras 3 {spread(vs)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (Keras 3, tf-keras, one process)")
    parser.add_argument("--steps", type=int, default=80, help="steps an epoch")
    parser.add_argument("--epochs", type=int, default=4, help="epochs a fit (the first one is not measured)")
    parser.add_argument("--breakdown", action="store_true", help="the step's variants instead (see above)")
    parser.add_argument("--one-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error(f"--epochs {args.epochs}: the first epoch is warm-up, so at least 2 are needed")
    if args.one_process:
        import keras
        import tensorflow as tf

        print(json.dumps({**timed_fit(keras, tf, args.epochs, args.steps), "keras": keras.__version__}), flush=True)
        return
    import tfnb

    spark = session("local[2]", "bench-keras3")
    if args.breakdown:
        breakdown(spark, args.rounds * 8)
        spark.stop()
        return
    load = [os.getloadavg()[0]]
    rates = {"keras3": [], "keras3-step-reduce": [], "tf-keras": [], "one process": []}
    info = {}
    for i in range(args.rounds):  # interleaved, so drift in machine load hits every side alike
        for flavour in ("keras3", "keras3-step-reduce", "tf-keras"):
            info[flavour] = tfnb.run(train_fn, num_workers=2, args=(flavour, args.epochs, args.steps), spark=spark,
                                     display=False, timeout=900)
            rates[flavour].append(steps_per_sec(info[flavour], args.steps))
        info["one process"] = one_process(args.epochs, args.steps)
        rates["one process"].append(steps_per_sec(info["one process"], args.steps))
        load.append(os.getloadavg()[0])
        print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items())
              + f" steps/s; load average {load[-1]:.1f}", flush=True)
    spark.stop()
    vs_tf_keras = [a / b for a, b in zip(rates["keras3"], rates["tf-keras"])]
    vs_one = [b / a for a, b in zip(rates["keras3"], rates["one process"])]  # ms a step: tfnb.run / one process
    ms = {k: 1000 / median(v) for k, v in rates.items()}
    vs_step_reduce = [a / b for a, b in zip(rates["keras3"], rates["keras3-step-reduce"])]
    names = {"keras3": "Keras 3, tfnb.run, 2 workers", "keras3-step-reduce": "  the same, metrics reduced each step",
             "tf-keras": "tf-keras, tfnb.run, 2 workers", "one process": "Keras 3, one process"}
    print(f"\nbench/keras3: MLP {FEATURES}-{HIDDEN}-{HIDDEN}-{CLASSES} ({info['keras3']['params']:,} parameters), "
          f"global batch {BATCH}, {args.steps} steps x {args.epochs - 1} epochs after a warm-up epoch, "
          f"{args.rounds} interleaved rounds; Keras {info['keras3']['keras']}, tf-keras {info['tf-keras']['keras']}; "
          f"load average {min(load):.1f}-{max(load):.1f}")
    print(f"  Keras 3 corrections applied: {', '.join(info['keras3']['patches']) or 'none'}")
    for k, v in rates.items():
        print(f"  {names[k]:30s}: {median(v):6.1f} steps/s {ms[k]:6.1f} ms a step   {['%.1f' % r for r in v]}")
    print(f"  Keras 3 / tf-keras steps/s under tfnb.run: {spread(vs_tf_keras)}  (goal >= 0.95)")
    print(f"  Keras 3 steps/s, metrics read at epoch ends / reduced each step: {spread(vs_step_reduce)}  "
          "(goal >= 1.1)")
    print(f"  Keras 3 ms a step, tfnb.run / one process: {spread(vs_one)}  "
          f"({ms['keras3'] - ms['one process']:+.1f} ms a step; no goal)")
    table = [["run", "steps/s (median)", "ms a step", "steps/s, each round"]]
    table += [[names[k], f"{median(v):.1f}", f"{ms[k]:.1f}", ", ".join(f"{r:.1f}" for r in v)]
              for k, v in rates.items()]
    table += [["Keras 3 / tf-keras, steps/s", spread(vs_tf_keras), "", "goal >= 0.95"],
              ["Keras 3, metrics at epoch ends / reduced each step, steps/s", spread(vs_step_reduce), "",
               "goal >= 1.1"],
              ["Keras 3 tfnb.run / one process, ms a step", spread(vs_one), "", "no goal"]]
    report("keras3", {"Keras 3 vs tf-keras steps/s": median(vs_tf_keras),
                      "Keras 3 vs per-step metric reduction steps/s": median(vs_step_reduce)},
           {"Keras 3 vs tf-keras steps/s": 0.95, "Keras 3 vs per-step metric reduction steps/s": 1.1},
           tables={"Keras 3 under tfnb.run: vs tf-keras, and vs one process": table},
           load=[round(v, 1) for v in load], patches=info["keras3"]["patches"])


if __name__ == "__main__":
    main()
