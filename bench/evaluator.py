"""Benchmark tfnb.Evaluator: checkpoint complete -> evaluation start, against the poll interval.

A trainer process (its own Python, as a Spark task would be) fits a small tf-keras model on
scikit-learn's digits and writes a checkpoint per epoch with
``ModelCheckpoint(model_dir + "/ckpt-{epoch}", save_weights_only=True)``, ``--period`` seconds
apart, noting the moment each ``ckpt-N.index`` is in place (TensorFlow writes the index last, so
that is when the checkpoint is complete). The notebook side runs ``tfnb.Evaluator`` in a background
thread with ``interval=--interval``, exporting the best model (.keras) as it goes.

Figures: latency = EvalResult.started_at - completion time, per checkpoint (min/p50/p95/max), the
anchor ``interval + 0.5 s`` (the goal) and the ratio p95 / anchor (goal <= 1), checkpoints written vs
evaluated (goal: every one, exactly once, skipped = 0). A text histogram shows the spread against
the interval.

Usage:
    .venv/bin/python bench/evaluator.py [--checkpoints 20] [--period 2.5] [--interval 1.0]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import report, use_checkout

use_checkout()
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def _digits():
    import numpy as np
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = (d.data / 16.0).astype("float32"), d.target.astype("int64")
    order = np.random.default_rng(0).permutation(len(x))
    return x[order], y[order]


def build_model():
    import tf_keras as keras

    model = keras.Sequential([keras.layers.Input(shape=(64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(0.003),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def val_dataset():
    import tensorflow as tf

    x, y = _digits()
    return tf.data.Dataset.from_tensor_slices((x[1400:], y[1400:])).batch(256)


def _trainer(model_dir: str, epochs: int, period: float, out: str) -> None:
    """The training process: an epoch, a checkpoint, the completion time, then wait out the period."""
    import tf_keras as keras

    x, y = _digits()
    model = build_model()

    with open(out, "w") as log:
        def after_checkpoint(epoch, logs):
            index = Path(model_dir) / f"ckpt-{epoch + 1}.index"
            assert index.exists(), index
            # the index is written last (then renamed into place): its mtime is the completion time
            log.write(json.dumps({"checkpoint": index.stem, "complete": index.stat().st_mtime}) + "\n")
            log.flush()
            # checkpoints at least a period apart (the first epoch traces, so a fixed clock would
            # make the next ones come in a burst: not the steady state this measures)
            time.sleep(max(0.0, period - (time.time() - index.stat().st_mtime)))

        model.fit(x[:1400], y[:1400], epochs=epochs, batch_size=64, verbose=0, callbacks=[
            keras.callbacks.ModelCheckpoint(model_dir + "/ckpt-{epoch}", save_weights_only=True),
            keras.callbacks.LambdaCallback(on_epoch_end=after_checkpoint)])


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoints", type=int, default=20)
    p.add_argument("--period", type=float, default=2.5, help="seconds between checkpoints")
    p.add_argument("--interval", type=float, default=1.0, help="the evaluator's poll interval")
    p.add_argument("--_trainer", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._trainer:
        _trainer(a._trainer[0], int(a._trainer[1]), float(a._trainer[2]), a._trainer[3])
        return 0

    import tensorflow  # noqa: F401 - a notebook has it imported already; imports are not what is measured

    from tfnb._status import write_status
    from tfnb.monitor.evaluator import Evaluator

    work = Path(tempfile.mkdtemp(prefix="tfnb-bench-eval-"))
    try:
        model_dir, log_dir, times = work / "model", work / "logs", work / "complete.jsonl"
        write_status(str(model_dir), "running")
        ev = Evaluator(build_model, val_dataset, str(model_dir), str(log_dir), interval=a.interval,
                       export_format="keras", best_metric="loss").start()
        trainer = subprocess.Popen([sys.executable, __file__, "--_trainer", str(model_dir), str(a.checkpoints),
                                    str(a.period), str(times)])
        rc = trainer.wait()
        write_status(str(model_dir), "succeeded" if rc == 0 else "failed")
        ev.join()
        if rc:
            print(f"trainer failed with exit code {rc}")
            return 1
        complete = {r["checkpoint"]: r["complete"] for r in map(json.loads, times.read_text().splitlines())}
        evaluated = [Path(r.checkpoint).name for r in ev.history]
        latency = {Path(r.checkpoint).name: r.started_at - complete[Path(r.checkpoint).name] for r in ev.history}
        eval_secs = [r.seconds for r in ev.history]
    finally:
        shutil.rmtree(work, ignore_errors=True)

    lat = list(latency.values())
    anchor = a.interval + 0.5
    print(f"tfnb.Evaluator: {a.checkpoints} checkpoints, >= {a.period:g} s apart, poll interval {a.interval:g} s")
    print(f"  written {len(complete)}, evaluated {len(evaluated)}, evaluated more than once "
          f"{len(evaluated) - len(set(evaluated))}, skipped {len(complete) - len(set(evaluated))} "
          f"(reported skipped: {len(ev.skipped)})")
    print(f"  evaluation time per checkpoint: p50 {_pct(eval_secs, 50):.2f} s, max {max(eval_secs):.2f} s")
    print(f"  complete -> evaluation start: min {min(lat):.2f} s  p50 {_pct(lat, 50):.2f} s  "
          f"p95 {_pct(lat, 95):.2f} s  max {max(lat):.2f} s")
    worst = sorted(latency.items(), key=lambda kv: -kv[1])[:3]
    print("  slowest: " + ", ".join(f"{name} {v:.2f} s" for name, v in worst))
    print(f"  anchor (goal) interval + 0.5 s = {anchor:.2f} s;  p95 / anchor = {_pct(lat, 95) / anchor:.2f}  "
          f"max / anchor = {max(lat) / anchor:.2f}  (goal <= 1)")
    print("  latency histogram (| marks the interval):")
    width = anchor / 10
    buckets = [0] * 13
    for v in lat:
        buckets[min(12, int(v / width))] += 1
    for i, n in enumerate(buckets):
        lo = i * width
        mark = "|" if lo <= a.interval < lo + width else " "
        label = f"{lo:5.2f}-{lo + width:5.2f} s" if i < 12 else f">= {lo:5.2f} s  "
        print(f"   {label} {mark} {'#' * n}")
    ok = len(set(evaluated)) == len(complete) == len(evaluated) and _pct(lat, 95) <= anchor
    print(f"  goal met: {ok}")
    report("evaluator", {"evaluator p95 lag vs goal": _pct(lat, 95) / anchor}, {"evaluator p95 lag vs goal": 1.0},
           written=len(complete), evaluated=len(evaluated), skipped=len(complete) - len(set(evaluated)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
