"""A sweep of N trials against the same N trials run one after another through tfnb.run, on the same cluster.

Each trial trains the digits MLP (scikit-learn's digits, tf-keras, one worker) with its own learning rate for a
few epochs. Both ways run the same hyperparameters (enqueued in the study, no pruning) in one Spark session
(local[2]: two task slots, so the sweep runs two trials at once), round after round, alternating which goes
first. Reported: sequential wall time / sweep wall time (goal >= 1.6 with 2 concurrent trials on 2 slots), and
how many trials' train_fn processes were forked from a warm standby (each trial after the first should be).

    ./dev bench sweep [--trials 6] [--epochs 3] [--rounds 2]
"""
from __future__ import annotations

import argparse
import os
import time

from harness import median, report, session, spread, use_checkout

use_checkout()


def digits_trial(ctx, params, epochs):
    """One trial; returns its accuracy and whether its process was forked by the executor's warm standby."""
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        warm = b"tfnb._task.warm" in f.read()
    digits = load_digits()
    x, y = (digits.data / 16.0).astype("float32"), digits.target.astype("int64")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    model = tf.keras.Sequential([tf.keras.layers.Input((64,)), tf.keras.layers.Dense(128, activation="relu"),
                                 tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(10)])
    model.compile(tf.keras.optimizers.Adam(params["learning_rate"]),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    history = model.fit(x[:1437], y[:1437], batch_size=32, epochs=epochs, validation_data=(x[1437:], y[1437:]),
                        verbose=0, callbacks=[ctx.progress_callback(batch_size=32)])
    return {"val_accuracy": history.history["val_accuracy"][-1], "warm": warm}


def one_after_another(spark, rates, epochs) -> tuple[float, list]:
    import tfnb

    start = time.perf_counter()
    out = [tfnb.run(digits_trial, num_workers=1, args=({"learning_rate": lr}, epochs), spark=spark, display=False)
           for lr in rates]
    return time.perf_counter() - start, out


def as_a_sweep(spark, rates, epochs) -> tuple[float, list]:
    import optuna

    import tfnb

    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.NopPruner())
    for lr in rates:
        study.enqueue_trial({"learning_rate": lr})
    start = time.perf_counter()
    result = tfnb.sweep(digits_trial, {"learning_rate": (1e-4, 1e-1, "log")}, study=study, n_trials=len(rates),
                        num_workers=1, args=(epochs,), metric="val_accuracy", spark=spark, display=False)
    seconds = time.perf_counter() - start
    assert all(t.state == "complete" for t in result.trials), result.summary()
    return seconds, [t.returned for t in result.trials]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import tfnb

    spark = session("local[2]", "bench-sweep", spark_ui_showConsoleProgress="false")
    rates = [10 ** (-3.5 + 2 * i / max(args.trials - 1, 1)) for i in range(args.trials)]
    # warm-up, untimed: the first job of the session and the executor's standby importing TensorFlow
    tfnb.run(digits_trial, num_workers=1, args=({"learning_rate": 1e-3}, 1), spark=spark, display=False)
    ratios, rows, warm, trials = [], [], 0, 0
    for r in range(args.rounds):
        first, second = (one_after_another, as_a_sweep) if r % 2 == 0 else (as_a_sweep, one_after_another)
        times = {}
        for way in (first, second):
            out = way(spark, rates, args.epochs)
            times[way.__name__] = out[0]
            warm += sum(t["warm"] for t in out[1])
            trials += len(out[1])
        ratios.append(times["one_after_another"] / times["as_a_sweep"])
        rows.append([r + 1, f"{times['one_after_another']:.1f}", f"{times['as_a_sweep']:.1f}", f"{ratios[-1]:.2f}"])
        print(f"round {r + 1}: one after another {times['one_after_another']:.1f} s, "
              f"sweep {times['as_a_sweep']:.1f} s, ratio {ratios[-1]:.2f}", flush=True)
    spark.stop()
    print(f"\nbench/sweep: {args.trials} trials of {args.epochs} epochs, 1 worker each, local[2]: sequential / sweep "
          f"{spread(ratios)} (goal >= 1.6); train_fn processes forked from a warm standby: {warm}/{trials}")
    report("sweep", {"sweep vs one run after another": median(ratios),
                     "trials started from a warm standby": warm / trials},
           {"sweep vs one run after another": 1.6, "trials started from a warm standby": 1.0},
           tables={"Sweep: two trials at once vs one after another": [
               ["round", "one after another (s)", "sweep (s)", "ratio"], *rows]})


if __name__ == "__main__":
    main()
