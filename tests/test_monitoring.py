"""The whole monitoring loop with real processes: training in one "cell" (a 2-worker tfnb.run whose chief
syncs event files to persistent storage), the driver-side evaluator and TensorBoard in another. The
evaluator's summaries and the synced training summaries must show up in the same TensorBoard WHILE
training runs; a real browser takes a screenshot of it (so the test carries the ``browser`` marker and
conftest checks for chromium before the test starts training, not midway)."""
from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest

import tfnb
from browser import running_chromium


def build_model():
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def data(seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(256, 8)).astype("float32")
    return x, (x[:, 0] + x[:, 1] > 0).astype("int64")


def train_until_seen(ctx, log_url, flag):
    """Trains, and after epoch 2 the chief holds training open until the test has seen TensorBoard."""
    import tensorflow as tf

    x, y = data(ctx.task_index)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32).with_options(options)
    with strategy.scope():
        model = build_model()

    class HoldOpen(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            deadline = time.monotonic() + 300
            while epoch == 1 and ctx.is_chief and not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.2)

    local_logs = os.path.join(ctx.local_dir, "logs")
    callbacks = [tf.keras.callbacks.ModelCheckpoint(os.path.join(ctx.model_dir, "ckpt-{epoch}"),
                                                    save_weights_only=True),
                 tf.keras.callbacks.TensorBoard(local_logs), HoldOpen()]
    sync = tfnb.EventSync(local_logs, log_url, interval=1) if ctx.is_chief else None
    if sync:
        sync.start()
    try:
        model.fit(ds, epochs=4, steps_per_epoch=4, callbacks=callbacks, verbose=0)
    finally:
        if sync:
            sync.stop()
    return "trained"


def _scalar_tags(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=30) as r:
        return json.load(r)


@pytest.mark.slow
@pytest.mark.browser
def test_eval_and_training_summaries_in_one_tensorboard_while_training(spark, tmp_path, artifacts, no_orphans):
    from tfnb._status import read_status
    from tfnb.monitor.tensorboard import Launched, Reused, ensure_tensorboard, stop

    model_dir, log_url, tb_dir = tmp_path / "model", tmp_path / "persistent-logs", tmp_path / "tb"
    flag = tmp_path / "seen"
    tb_dir.mkdir()
    result = {}
    # cell 1: training
    trainer = threading.Thread(target=lambda: result.setdefault("value", tfnb.run(
        train_until_seen, num_workers=2, args=(str(log_url), str(flag)), spark=spark, model_dir=str(model_dir),
        display=False, timeout=900)))
    trainer.start()
    # cell 2: evaluator + driver-side sync + TensorBoard
    evaluator = tfnb.Evaluator(build_model, lambda: data(99), str(model_dir), str(log_url), interval=1,
                               best_metric="accuracy").start()
    sync = tfnb.EventSync(str(log_url), str(tb_dir), interval=1).start()
    board = ensure_tensorboard(str(tb_dir), reload_interval=1)
    try:
        assert isinstance(board, (Launched, Reused)), board
        deadline = time.monotonic() + 600
        tags = {}
        while time.monotonic() < deadline:
            assert evaluator.error is None and not evaluator.skipped, (evaluator.error, evaluator.skipped)
            tags = _scalar_tags(board.port)
            if any(t.startswith("epoch_") for t in tags.get("eval", {})) and \
                    any(t.startswith("epoch_") for t in tags.get("train", {})):
                break
            time.sleep(1)
        assert "eval" in tags and "train" in tags, tags
        state_when_seen = read_status(str(model_dir))["state"]
        _screenshot(f"http://127.0.0.1:{board.port}/#scalars", artifacts / "monitoring_tensorboard.png",
                    tmp_path / "browser")
        flag.touch()
        trainer.join(timeout=900)
        assert result.get("value") == "trained"
        evaluator.join(timeout=300)
        assert state_when_seen == "running"  # both appeared while training was still going
        assert {"epoch_loss", "epoch_accuracy"} <= set(tags["eval"])
        steps = [r.step for r in evaluator.history]
        assert steps == [0, 1, 2, 3]  # ckpt-1..4, each once (steps are 0-based like Keras epoch summaries)
    finally:
        flag.touch()
        sync.stop()
        evaluator.stop()
        if isinstance(board, Launched):
            stop(board.instance)


def _screenshot(url: str, path: Path, workdir: Path) -> None:
    with running_chromium(workdir, height=900) as page:
        page.goto(url)
        page.wait_for_selector("text=eval", timeout=60000)
        page.wait_for_selector("text=train", timeout=60000)
        page.wait_for_timeout(1500)  # let the charts draw
        page.screenshot(path=str(path))
