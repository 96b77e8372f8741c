"""Steps/s of one MultiWorkerMirroredStrategy program under tfnb.run vs the same program launched by hand
as plain processes with TF_CONFIG, in the same run. Goal: tfnb / by-hand >= 0.97.

    ./dev bench overhead [--steps 300] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

from harness import median, report, session, use_checkout

use_checkout()

WARMUP = 20


def program(steps: int) -> float:
    """The measured program: MWMS, a small MLP, synthetic batches; returns steps/s after warm-up."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input((256,)), tf.keras.layers.Dense(256, activation="relu"),
                                     tf.keras.layers.Dense(256, activation="relu"), tf.keras.layers.Dense(10)])
        opt = tf.keras.optimizers.SGD(0.01)
    x = tf.random.stateless_normal((64, 256), seed=(1, 2))
    y = tf.zeros((64,), tf.int64)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def step():
        def replica():
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)), global_batch_size=128)
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(replica), axis=None)

    for _ in range(WARMUP):
        step()
    step().numpy()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    loss.numpy()
    return steps / (time.perf_counter() - t0)


def tfnb_train_fn(ctx, steps):
    return program(steps)


def by_hand(steps: int, workers: int) -> float:
    ports = []
    socks = []
    for _ in range(workers):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        ports.append(s.getsockname()[1])
        socks.append(s)
    for s in socks:
        s.close()
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for i in range(workers):
        env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
                   TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}))
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--steps", str(steps)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    outs = [p.communicate()[0] for p in procs]
    return float(outs[0].strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(program(args.steps), flush=True)
        return
    import tfnb

    spark = session(f"local[{args.workers}]", "bench-overhead")
    hand, launched = [], []
    for _ in range(args.repeats):  # interleaved, so drift in machine load hits both alike
        hand.append(by_hand(args.steps, args.workers))
        launched.append(tfnb.run(tfnb_train_fn, num_workers=args.workers, args=(args.steps,), spark=spark,
                                 display=False))
    spark.stop()
    h, t = median(hand), median(launched)
    print(f"\nbench/overhead: {args.workers}-worker MWMS, {args.steps} steps after {WARMUP} warm-up, "
          f"median of {args.repeats}")
    print(f"  by hand (processes + TF_CONFIG): {h:8.1f} steps/s   {['%.1f' % v for v in hand]}")
    print(f"  tfnb.run                       : {t:8.1f} steps/s   {['%.1f' % v for v in launched]}")
    print(f"  ratio tfnb / by hand: {t / h:.3f}  (goal >= 0.97)")
    report("overhead", {"steps/s vs by hand": t / h}, {"steps/s vs by hand": 0.97},
           by_hand=round(h, 1), tfnb=round(t, 1))


if __name__ == "__main__":
    main()
