"""tfnb.Evaluator against real tf-keras and Keras 3 checkpoints, real TensorBoard event files and a real S3 server."""
from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from s3server import rclone_s3  # noqa: F401

from tfnb._status import write_status
from tfnb.errors import ConfigError, EvaluatorError
from tfnb.monitor.evaluator import Evaluator
from tfnb.monitor.sync import EventSync

import tensorflow as tf  # hard dependencies: a broken install fails here, it does not skip
# tf_keras by name (what tfnb's workers train with): tf.keras is Keras 3 unless TF_USE_LEGACY_KERAS=1
# was set before the first TensorFlow import of this test process
import tf_keras as keras
WAIT = 120  # seconds: generous upper bound for background work on a contended 2-core box


# ---------------------------------------------------------------- a tiny real model and data

def _data():
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data[:400] / 16.0).astype("float32")
    y = digits.target[:400].astype("int64")
    return x, y


def build_model(hidden: int = 16):
    model = keras.Sequential([keras.layers.Input(shape=(64,)),
                                 keras.layers.Dense(hidden, activation="relu"),
                                 keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def val_dataset():
    x, y = _data()
    return tf.data.Dataset.from_tensor_slices((x[300:], y[300:])).batch(50)


def train(model_dir: str, epochs: int, log_dir: str | None = None, on_epoch=None):
    """Train the way the demo does: ModelCheckpoint ckpt-{epoch} weights + BackupAndRestore."""
    x, y = _data()
    model = build_model()
    callbacks = [keras.callbacks.BackupAndRestore(os.path.join(model_dir, "backup")),
                 keras.callbacks.ModelCheckpoint(os.path.join(model_dir, "ckpt-{epoch}"),
                                                    save_weights_only=True)]
    if log_dir:
        callbacks.append(keras.callbacks.TensorBoard(log_dir, update_freq="epoch"))
    if on_epoch:
        callbacks.append(keras.callbacks.LambdaCallback(on_epoch_end=on_epoch))
    model.fit(x[:300], y[:300], validation_data=val_dataset(), epochs=epochs, batch_size=32, verbose=0,
              callbacks=callbacks)
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    """Three real ModelCheckpoint checkpoints (ckpt-1..3) from one short training, reused read-only."""
    model_dir = tmp_path_factory.mktemp("trained")
    train(str(model_dir), epochs=3)
    return model_dir


def copy_ckpt(src: Path, name: str, dst: Path, new_name: str | None = None) -> list[Path]:
    out = []
    for f in sorted(src.glob(name + ".*")):
        target = dst / f.name.replace(name, new_name or name, 1)
        shutil.copyfile(f, target)
        out.append(target)
    return out


def expected_loss(prefix: Path) -> float:
    model = build_model()
    model.load_weights(str(prefix)).expect_partial()
    return model.evaluate(val_dataset(), return_dict=True, verbose=0)["loss"]


def scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """What TensorBoard's own reader finds in ``run_dir``: tag -> {step: value}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        if not tag.startswith("epoch_"):
            continue  # the callback's model graph/config
        out[tag] = {e.step: float(tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)}
    return out


def wait_for(predicate, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def counted_polls(ev: Evaluator) -> threading.Semaphore:
    """Released after each of the evaluator's polls: a test waits for full looks, not a guessed sleep."""
    polls = threading.Semaphore(0)
    poll = ev._poll

    def counted_poll(finished):
        try:
            return poll(finished)
        finally:
            polls.release()

    ev._poll = counted_poll
    return polls


# ---------------------------------------------------------------- tests

def test_evaluates_every_checkpoint_once_while_training_and_stops_when_run_succeeded(tmp_path):
    model_dir, log_dir = tmp_path / "model", tmp_path / "logs"
    write_status(str(model_dir), "running", run_id="r1")
    ev = Evaluator(build_model, val_dataset, str(model_dir), str(log_dir), interval=0.1,
                        export_format="keras")
    ev.start()

    def slow_epoch(epoch, logs):
        # let each checkpoint be seen before the next one lands, as with real epochs
        wait_for(lambda: len(ev.history) >= epoch + 1 or ev.error, f"evaluation of epoch {epoch + 1}")

    train(str(model_dir), epochs=3, log_dir=str(log_dir), on_epoch=slow_epoch)
    write_status(str(model_dir), "succeeded", run_id="r1")
    assert ev.join(timeout=WAIT), "evaluator did not stop after training succeeded"
    assert ev.state == "finished" and not ev.running

    names = [Path(r.checkpoint).name for r in ev.history]
    assert names == ["ckpt-1", "ckpt-2", "ckpt-3"]           # each once, in order; backup/ ignored
    assert [r.step for r in ev.history] == [0, 1, 2]
    assert ev.skipped == ()
    for r in ev.history:
        assert r.metrics["loss"] == pytest.approx(expected_loss(model_dir / Path(r.checkpoint).name), rel=1e-4)
        assert 0.0 <= r.metrics["accuracy"] <= 1.0
        assert r.started_at >= r.found_at

    # eval scalars sit at the same steps as the Keras TensorBoard callback's train/validation ones
    ev_scalars, train_scalars = scalars(log_dir / "eval"), scalars(log_dir / "train")
    assert set(ev_scalars) == {"epoch_loss", "epoch_accuracy"}
    assert sorted(ev_scalars["epoch_loss"]) == sorted(train_scalars["epoch_loss"]) == [0, 1, 2]
    assert ev_scalars["epoch_loss"][2] == pytest.approx(ev.history[2].metrics["loss"], rel=1e-6)

    # best model exported and loadable, best.json names it
    best = min(ev.history, key=lambda r: r.metrics["loss"])
    assert ev.best == best and best.best
    info = json.loads((log_dir / "best.json").read_text())
    assert info["step"] == best.step and info["metrics"]["loss"] == pytest.approx(best.metrics["loss"])
    exported = keras.models.load_model(str(log_dir / "best.keras"))
    assert exported.evaluate(val_dataset(), return_dict=True, verbose=0)["loss"] == pytest.approx(
        best.metrics["loss"], rel=1e-4)
    assert not [p for p in log_dir.iterdir() if ".tfnb-tmp-" in p.name]

    frame = ev.history_frame()
    assert list(frame["step"]) == [0, 1, 2] and {"loss", "accuracy", "checkpoint"} <= set(frame.columns)


def test_half_written_checkpoint_is_retried_then_evaluated(tmp_path, checkpoints, caplog):
    model_dir, log_dir = tmp_path / "model", tmp_path / "logs"
    model_dir.mkdir()
    index, data = [checkpoints / ("ckpt-2" + s) for s in (".index", ".data-00000-of-00001")]
    full = data.read_bytes()
    # 1) the index has landed but its data file has not (a copier that writes the index first)
    shutil.copyfile(index, model_dir / index.name)
    caplog.set_level(logging.INFO, logger="tfnb.monitor.evaluator")
    ev = Evaluator(build_model, val_dataset, str(model_dir), str(log_dir), interval=0.1,
                   export_format=None, max_retries=1000)
    polls = counted_polls(ev)
    ev.start()
    for _ in range(2):  # two full looks at the index-only checkpoint, not a guessed sleep
        assert polls.acquire(timeout=WAIT), "the evaluator did not poll"
    assert ev.history == () and ev.skipped == ()
    # 2) the data file is there but truncated: loading fails and is retried
    (model_dir / data.name).write_bytes(full[: len(full) // 2])
    wait_for(lambda: "not loadable yet" in caplog.text, "a failed load attempt")
    assert ev.history == ()
    # 3) the write completes
    with open(model_dir / data.name, "ab") as f:
        f.write(full[len(full) // 2:])
    wait_for(lambda: len(ev.history) == 1, "the evaluation of the completed checkpoint")
    write_status(str(model_dir), "succeeded")
    ev.join(timeout=WAIT)
    assert [r.step for r in ev.history] == [1] and ev.skipped == ()
    assert ev.history[0].metrics["loss"] == pytest.approx(expected_loss(checkpoints / "ckpt-2"), rel=1e-4)


def test_corrupt_checkpoint_is_reported_and_skipped(tmp_path, checkpoints, caplog):
    model_dir, log_dir = tmp_path / "model", tmp_path / "logs"
    model_dir.mkdir()
    for name in ("ckpt-1", "ckpt-2", "ckpt-3"):
        copy_ckpt(checkpoints, name, model_dir)
    data = model_dir / "ckpt-2.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    for i in range(len(raw) // 10, len(raw) * 9 // 10, 64):     # damaged bytes: checksum mismatch
        raw[i] ^= 0xFF
    data.write_bytes(bytes(raw))
    write_status(str(model_dir), "succeeded")
    ev = Evaluator(build_model, val_dataset, str(model_dir), str(log_dir), interval=0.05,
                   export_format=None, max_retries=2)
    with caplog.at_level(logging.WARNING, logger="tfnb.monitor.evaluator"):
        history = ev.run(until_done=True)
    assert [Path(r.checkpoint).name for r in history] == ["ckpt-1", "ckpt-3"]
    assert [Path(s.checkpoint).name for s in ev.skipped] == ["ckpt-2"]
    assert "corrupt" in ev.skipped[0].reason and "Checksum" in ev.skipped[0].reason
    assert "skipping checkpoint" in caplog.text and "ckpt-2" in caplog.text
    assert sorted(scalars(log_dir / "eval")["epoch_loss"]) == [0, 2]


def test_checkpoint_missing_data_after_training_ended_is_skipped(tmp_path, checkpoints):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    copy_ckpt(checkpoints, "ckpt-1", model_dir)
    shutil.copyfile(checkpoints / "ckpt-3.index", model_dir / "ckpt-3.index")
    write_status(str(model_dir), "failed")
    ev = Evaluator(build_model, val_dataset, str(model_dir), str(tmp_path / "logs"), interval=0.05,
                   export_format=None, max_retries=2)
    assert [r.step for r in ev.run()] == [0]
    assert [Path(s.checkpoint).name for s in ev.skipped] == ["ckpt-3"]
    assert "incomplete" in ev.skipped[0].reason


def test_checkpoint_rewritten_under_the_same_name_is_evaluated_again(tmp_path, checkpoints):
    """ModelCheckpoint(save_best_only=True) with a fixed name rewrites one checkpoint: each version counts."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    copy_ckpt(checkpoints, "ckpt-1", model_dir, "best")
    ev = Evaluator(build_model, val_dataset, str(model_dir), str(tmp_path / "logs"), interval=0.05,
                   export_format=None).start()
    wait_for(lambda: len(ev.history) == 1 or ev.error, "the first version")
    copy_ckpt(checkpoints, "ckpt-3", model_dir, "best")
    wait_for(lambda: len(ev.history) == 2 or ev.error, "the rewritten version")
    write_status(str(model_dir), "succeeded")
    ev.join(timeout=WAIT)
    # no number in the name: the step is the optimizer's iteration count saved in the checkpoint
    assert [r.step for r in ev.history] == [10, 30]
    assert ev.history[1].metrics["loss"] == pytest.approx(expected_loss(checkpoints / "ckpt-3"), rel=1e-4)


def test_model_fn_error_is_raised_from_join_and_stop(tmp_path):
    def broken_model():
        raise RuntimeError("no such layer")

    ev = Evaluator(broken_model, val_dataset, str(tmp_path / "model"), str(tmp_path / "logs"), interval=0.1)
    ev.start()
    with pytest.raises(EvaluatorError, match="model_fn.*no such layer") as err:
        ev.join(timeout=WAIT)
    assert isinstance(err.value.__cause__, RuntimeError)
    assert ev.state == "failed" and isinstance(ev.error, EvaluatorError)
    with pytest.raises(EvaluatorError):
        ev.stop()

    def broken_data():
        raise OSError("validation file missing")

    with pytest.raises(EvaluatorError, match="dataset_fn.*validation file missing"):
        Evaluator(build_model, broken_data, str(tmp_path / "model"), str(tmp_path / "logs")).run()


def test_checkpoint_from_another_architecture_stops_with_a_clear_error(tmp_path, checkpoints):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    copy_ckpt(checkpoints, "ckpt-1", model_dir)
    ev = Evaluator(lambda: build_model(hidden=7), val_dataset, str(model_dir), str(tmp_path / "logs"),
                   interval=0.05, export_format=None)
    with pytest.raises(EvaluatorError, match="does not fit the model"):
        ev.run(until_done=False)


# ---------------------------------------------------------------- Keras 3: .weights.h5 and .keras checkpoints


def build_keras3(hidden: int = 16):
    """build_model's network in Keras 3 (``import keras``; tf.keras is tf-keras in this process)."""
    import keras as keras3

    model = keras3.Sequential([keras3.layers.Input(shape=(64,)), keras3.layers.Dense(hidden, activation="relu"),
                               keras3.layers.Dense(10)])
    model.compile(optimizer=keras3.optimizers.Adam(0.01),
                  loss=keras3.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


@pytest.fixture(scope="module")
def keras3_checkpoints(tmp_path_factory) -> Path:
    """What Keras 3's ModelCheckpoint can write, from one short training: ``h5/ckpt-{1..3}.weights.h5`` and
    ``zip/ckpt-{1..3}.keras``, with the trained model saved whole as ``zip/model.keras`` at the end."""
    import keras as keras3

    root = tmp_path_factory.mktemp("keras3")
    x, y = _data()
    keras3.utils.set_random_seed(3)
    model = build_keras3()
    model.fit(x[:300], y[:300], epochs=3, batch_size=32, verbose=0, callbacks=[
        keras3.callbacks.ModelCheckpoint(str(root / "h5" / "ckpt-{epoch}.weights.h5"), save_weights_only=True),
        keras3.callbacks.ModelCheckpoint(str(root / "zip" / "ckpt-{epoch}.keras"))])
    model.save(root / "zip" / "model.keras")
    return root


@functools.lru_cache(maxsize=None)  # the tests share checkpoints: each reference evaluation once
def keras3_loss(path: Path) -> float:
    model = build_keras3()
    model.load_weights(str(path))
    return model.evaluate(val_dataset(), return_dict=True, verbose=0)["loss"]


def test_keras3_weights_files_are_evaluated_and_the_best_exported_as_keras3(tmp_path, keras3_checkpoints):
    model_dir, log_dir = keras3_checkpoints / "h5", tmp_path / "logs"
    write_status(str(tmp_path), "succeeded")
    ev = Evaluator(build_keras3, val_dataset, str(model_dir), str(log_dir), model_dir=str(tmp_path),
                   interval=0.05, export_format="keras")
    assert [r.step for r in ev.run()] == [0, 1, 2] and ev.skipped == ()
    assert [Path(r.checkpoint).name for r in ev.history] == [f"ckpt-{i}.weights.h5" for i in (1, 2, 3)]
    for r in ev.history:
        assert r.metrics["loss"] == pytest.approx(keras3_loss(Path(r.checkpoint)), rel=1e-4)
    assert sorted(scalars(log_dir / "eval")["epoch_loss"]) == [0, 1, 2]
    import keras as keras3

    exported = keras3.saving.load_model(log_dir / "best.keras")
    assert type(exported).__module__.startswith("keras.")  # a Keras 3 file, loaded by Keras 3
    assert exported.evaluate(val_dataset(), return_dict=True, verbose=0)["loss"] == pytest.approx(
        ev.best.metrics["loss"], rel=1e-4)


def test_numbered_keras_files_are_checkpoints_and_a_savedmodel_export_serves(tmp_path, keras3_checkpoints):
    """ckpt-{epoch}.keras files count, the final model.keras does not; the step is the saved iteration count."""
    write_status(str(tmp_path), "succeeded")
    ev = Evaluator(build_keras3, val_dataset, str(keras3_checkpoints / "zip"), str(tmp_path / "logs"),
                   model_dir=str(tmp_path), interval=0.05, step="iterations", export_format="savedmodel")
    assert [Path(r.checkpoint).name for r in ev.run()] == ["ckpt-1.keras", "ckpt-2.keras", "ckpt-3.keras"]
    assert [r.step for r in ev.history] == [10, 20, 30]  # 300 rows in batches of 32 per epoch
    assert ev.history[2].metrics["loss"] == pytest.approx(keras3_loss(keras3_checkpoints / "zip/model.keras"), rel=1e-4)
    served = tf.saved_model.load(str(tmp_path / "logs" / "best")).signatures["serving_default"]
    x = _data()[0][300:]
    reference = build_keras3()
    reference.load_weights(ev.best.checkpoint)
    np.testing.assert_allclose(next(iter(served(tf.constant(x)).values())).numpy(), reference.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)


def test_tf_keras_model_with_other_metrics_reads_keras3_weights_files(tmp_path, keras3_checkpoints):
    write_status(str(tmp_path), "succeeded")
    ev = Evaluator(build_model, val_dataset, str(keras3_checkpoints / "h5"), str(tmp_path / "logs"),
                   model_dir=str(tmp_path), interval=0.05, export_format=None, metrics=["accuracy", "mse"])
    assert [r.metrics["loss"] for r in ev.run()] == pytest.approx(
        [keras3_loss(keras3_checkpoints / "h5" / f"ckpt-{i}.weights.h5") for i in (1, 2, 3)], rel=1e-4)
    assert ev.skipped == () and all("mse" in r.metrics for r in ev.history)


def test_weights_file_keras_is_writing_is_left_until_closed(tmp_path, keras3_checkpoints, caplog):
    """Keras writes .weights.h5 in place: a file still open for writing, or torn, is never loaded, never
    given up on while training runs, and evaluated once whole; after training one that never closed is skipped."""
    import h5py

    model_dir, source = tmp_path / "model", keras3_checkpoints / "h5"
    model_dir.mkdir()
    write_status(str(model_dir), "running")
    whole = (source / "ckpt-3.weights.h5").read_bytes()
    (model_dir / "ckpt-3.weights.h5").write_bytes(whole[: len(whole) // 2])  # torn: never completes
    caplog.set_level(logging.INFO, logger="tfnb.monitor.evaluator")
    ev = Evaluator(build_keras3, val_dataset, str(model_dir), str(tmp_path / "logs"), interval=0.05,
                   export_format=None, max_retries=1)
    polls = counted_polls(ev)
    ev.start()
    # ckpt-2 written the way Keras writes it: every variable in place and flushed, the file still open
    with h5py.File(source / "ckpt-2.weights.h5", "r") as src, h5py.File(model_dir / "ckpt-2.weights.h5", "w") as dst:
        for key in src:
            src.copy(src[key], dst, name=key)
        dst.flush()
        for _ in range(3):  # three full looks at the open file, not a guessed sleep
            assert polls.acquire(timeout=WAIT), "the evaluator did not poll"
        assert ev.history == () and ev.skipped == () and ev.error is None
    wait_for(lambda: len(ev.history) == 1 or ev.error, "the evaluation of the closed file")
    assert ev.skipped == () and "not loadable" not in caplog.text  # the torn ckpt-3 was never loaded
    write_status(str(model_dir), "succeeded")
    assert ev.join(timeout=WAIT)
    assert [r.step for r in ev.history] == [1]
    assert ev.history[0].metrics["loss"] == pytest.approx(keras3_loss(source / "ckpt-2.weights.h5"), rel=1e-4)
    assert [(Path(s.checkpoint).name, s.reason) for s in ev.skipped] == [
        ("ckpt-3.weights.h5", "incomplete: the file was never closed after training ended")]


def test_weights_file_rewritten_while_it_is_copied_is_taken_again(tmp_path, keras3_checkpoints):
    """save_best_only rewrites one file in place: a version that lands while the evaluator copies the file makes
    that copy worthless, and the evaluator takes the file again, not counting it as a failure (max_retries=1)."""
    model_dir, source = tmp_path / "model", keras3_checkpoints / "h5"
    model_dir.mkdir()
    shutil.copyfile(source / "ckpt-1.weights.h5", model_dir / "best.weights.h5")
    write_status(str(model_dir), "succeeded")
    ev = Evaluator(build_keras3, val_dataset, str(model_dir), str(tmp_path / "logs"), interval=0.05,
                   export_format=None, max_retries=1)
    store, copies = ev._checkpoints.store, []
    get = store.get

    def get_then_rewrite(rel, local_path, **kwargs):
        get(rel, local_path, **kwargs)
        copies.append(rel)
        if len(copies) == 1:  # Keras' next save of the file, as the first copy ends
            shutil.copyfile(source / "ckpt-3.weights.h5", model_dir / "best.weights.h5")

    store.get = get_then_rewrite
    assert [r.metrics["loss"] for r in ev.run()] == pytest.approx([keras3_loss(source / "ckpt-3.weights.h5")], rel=1e-4)
    assert copies == ["best.weights.h5"] * 2 and ev.skipped == ()


def test_keras3_checkpoint_of_another_architecture_stops_with_a_clear_error(tmp_path, keras3_checkpoints):
    ev = Evaluator(lambda: build_keras3(hidden=7), val_dataset, str(keras3_checkpoints / "h5"),
                   str(tmp_path / "logs"), interval=0.05, export_format=None)
    with pytest.raises(EvaluatorError, match="ckpt-1.weights.h5 does not fit the model.*shape"):
        ev.run(until_done=False)


def test_keras3_model_on_tf_keras_checkpoints_names_the_fix(tmp_path, checkpoints):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    copy_ckpt(checkpoints, "ckpt-1", model_dir)
    ev = Evaluator(build_keras3, val_dataset, str(model_dir), str(tmp_path / "logs"), interval=0.05,
                   export_format=None)
    with pytest.raises(EvaluatorError, match=r"ckpt-1 is a TensorFlow checkpoint of tf-keras' save_weights.*"
                                             r"build it with tf.keras.*ckpt-\{epoch\}.weights.h5"):
        ev.run(until_done=False)
    assert ev.history == () and ev.skipped == ()


def test_checkpoint_manager_layout_and_saved_step(tmp_path):
    """tf.train.CheckpointManager(Checkpoint(model=...)) files; step read from the checkpoint."""
    model_dir = tmp_path / "model"
    x, y = _data()
    model = build_model()
    step = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=model.optimizer, step=step),
                                         str(model_dir), max_to_keep=5)
    for _ in range(2):
        model.fit(x[:300], y[:300], epochs=1, batch_size=100, verbose=0)
        step.assign(int(model.optimizer.iterations))
        manager.save()
    write_status(str(model_dir), "succeeded")
    ev = Evaluator(build_model, val_dataset, str(model_dir), str(tmp_path / "logs"), interval=0.05,
                   step="iterations", export_format=None)
    assert [r.step for r in ev.run()] == [3, 6]
    reference = build_model()
    tf.train.Checkpoint(model=reference).restore(manager.latest_checkpoint).expect_partial()
    assert ev.history[-1].metrics["loss"] == pytest.approx(
        reference.evaluate(val_dataset(), return_dict=True, verbose=0)["loss"], rel=1e-4)


def test_s3_checkpoints_and_s3_log_dir(tmp_path, checkpoints, rclone_s3, monkeypatch):
    """Checkpoints and status on S3, eval summaries and best model written to S3, read back locally."""
    client = rclone_s3.client()
    client.create_bucket(Bucket="evalrun")
    for f in sorted(checkpoints.glob("ckpt-*")):
        client.upload_file(str(f), "evalrun", f"model/{f.name}")
    client.put_object(Bucket="evalrun", Key="model/tfnb_status.json", Body=b'{"state": "succeeded"}')
    options = {"endpoint_url": rclone_s3.endpoint_url, "aws_access_key_id": rclone_s3.access_key,
               "aws_secret_access_key": rclone_s3.secret_key, "region_name": "us-east-1"}
    temp = tmp_path / "temp"  # this test's own temp folder: other tests' downloads do not land there
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    # mode="max" on a falling loss: only the first checkpoint is best, one SavedModel export
    ev = Evaluator(build_model, val_dataset, "s3://evalrun/model", "s3://evalrun/logs", interval=0.1,
                   best_metric="loss", mode="max", storage_options=options)
    assert [r.step for r in ev.run()] == [0, 1, 2]
    assert [r.best for r in ev.history] == [True, False, False]
    assert ev.history[0].checkpoint == "s3://evalrun/model/ckpt-1"
    keys = {o["Key"] for o in client.list_objects_v2(Bucket="evalrun", Prefix="logs/")["Contents"]}
    assert "logs/best.json" in keys and "logs/best/saved_model.pb" in keys
    best = json.loads(client.get_object(Bucket="evalrun", Key="logs/best.json")["Body"].read())
    assert best["step"] == 0 and best["format"] == "savedmodel"
    assert not list(temp.glob("tfnb-eval-*"))   # downloads cleaned up
    local = tmp_path / "tb"
    EventSync("s3://evalrun/logs", str(local), storage_options=options).stop()  # one pass: S3 -> local
    assert sorted(scalars(local / "eval")["epoch_accuracy"]) == [0, 1, 2]


def test_unreadable_status_file_stops_the_evaluator_after_a_few_polls(tmp_path, rclone_s3):
    """A model_dir whose status cannot be read (here: no such bucket) ends the loop with that error."""
    options = {"endpoint_url": rclone_s3.endpoint_url, "key": rclone_s3.access_key,
               "secret": rclone_s3.secret_key, "region": "us-east-1"}
    ev = Evaluator(build_model, val_dataset, str(tmp_path / "ckpts"), str(tmp_path / "logs"), interval=0.05,
                   model_dir="s3://no-such-bucket/run", storage_options=options, export_format=None)
    with pytest.raises(EvaluatorError, match=r"cannot read the run status in s3://no-such-bucket/run "
                                             r"\(5 polls in a row\).*bucket 'no-such-bucket' does not exist"):
        ev.run()
    assert ev.state == "failed"


def test_timeout_stops_a_run_that_never_ends(tmp_path, checkpoints):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    copy_ckpt(checkpoints, "ckpt-1", model_dir)
    ev = Evaluator(build_model, val_dataset, str(model_dir), str(tmp_path / "logs"), interval=0.05,
                   timeout=1.0, export_format=None)
    assert [r.step for r in ev.run(until_done=True)] == [0]
    assert ev.state == "timed out"


@pytest.mark.parametrize("kwargs, fix", [
    ({"interval": 0}, "interval=0"),
    ({"mode": "best"}, "mode='best'"),
    ({"step": "batch"}, "step='batch'"),
    ({"export_format": "onnx"}, "export_format='onnx'"),
    ({"metrics": "accuracy"}, "metrics=\\['accuracy'\\]"),
    ({"max_retries": 0}, "max_retries=0"),
])
def test_bad_arguments_fail_at_construction(tmp_path, kwargs, fix):
    with pytest.raises(ConfigError, match=fix):
        Evaluator(build_model, val_dataset, str(tmp_path), str(tmp_path / "logs"), **kwargs)
