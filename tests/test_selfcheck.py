"""A Keras newer than the tested ones (tfnb._deps.TESTED_NEWEST) is not refused: at its first fit under a strategy a
self-check trains one step and compares it with one process's (tfnb._task.selfcheck). Simulated here by a copy of
the suite's Keras with its version raised, put first on the train_fn processes' path; a second copy has a planted
error (the optimizer doubles every gradient), which the self-check stops with one clear line."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import tfnb
from tfnb._deps import TESTED_NEWEST
from tfnb.launcher import EventKind

import keras3_train

NEWER = "{}.{}.0".format(TESTED_NEWEST["keras"][0], TESTED_NEWEST["keras"][1] + 1)


@pytest.fixture(scope="module")
def newer_keras(tmp_path_factory):
    """Two copies of the installed Keras as version NEWER: ``good`` as it is, ``doubled`` with each gradient x2."""
    source = Path(importlib.util.find_spec("keras").submodule_search_locations[0])
    out = {}
    for name in ("good", "doubled"):
        root = tmp_path_factory.mktemp(f"keras-{name}")
        shutil.copytree(source, root / "keras", ignore=shutil.ignore_patterns("__pycache__", "*_test.py"))
        version = root / "keras" / "src" / "version.py"
        version.write_text(re.sub(r'__version__ = "[^"]+"', f'__version__ = "{NEWER}"', version.read_text()))
        if name == "doubled":
            optimizer = root / "keras" / "src" / "backend" / "tensorflow" / "optimizer.py"
            text = optimizer.read_text()
            anchor = "        grads_and_vars = list(zip(grads, trainable_variables))\n"
            assert anchor in text, "the planted error's anchor moved in this Keras"
            optimizer.write_text(text.replace(anchor, "        grads = [g * 2 for g in grads]\n" + anchor, 1))
        out[name] = str(root)
    return out


def _env(first: str) -> dict:
    return {"PYTHONPATH": os.pathsep.join([first, os.environ.get("PYTHONPATH", "")])}


def fit_after_a_failed_fit(ctx, epochs):
    """A fit that fails in its first epoch (TensorBoard set up), then keras3_train's: the first one's private
    TensorBoard folder of a non-chief worker must not outlive it."""
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model, train, _, _ = keras3_train.model_and_data(keras, tf)

    class Fail(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            raise RuntimeError("planted")

    try:
        model.fit(train, epochs=1, verbose=0, callbacks=[keras.callbacks.TensorBoard(ctx.log_dir), Fail()])
    except RuntimeError:
        pass
    return keras3_train.train_fn(ctx, epochs)


def custom_loop(ctx):
    """A custom training loop as TensorFlow's multi-worker tutorial writes it; the self-check runs where it
    distributes its dataset, before its first step."""
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model, train, _, _ = keras3_train.model_and_data(keras, tf)
    batches = iter(strategy.experimental_distribute_dataset(train))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def step(batch):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(y, model(x)), global_batch_size=keras3_train.BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply_gradients(zip(grads, model.trainable_variables))

        strategy.run(replica, args=batch)

    step(next(batches))
    return keras3_train.flat_weights(model).tolist()


def test_a_newer_keras_trains_after_a_passing_self_check_and_a_wrong_one_stops(spark, newer_keras, tmp_path,
                                                                                no_orphans):
    model_dir, scratch = tmp_path / "model", tmp_path / "tmp"
    scratch.mkdir()
    seen = []
    env = {**_env(newer_keras["good"]), "TMPDIR": str(scratch)}
    tfnb.run(fit_after_a_failed_fit, num_workers=2, args=(1,), spark=spark, model_dir=str(model_dir),
                   log_dir=str(tmp_path / "logs"), env=env, display=seen.append, timeout=600)
    # trained exactly, on the newer version, after one log line naming it
    workers = keras3_train.reports(model_dir, 2)
    assert {w["keras"] for w in workers} == {NEWER}
    expected = keras3_train.one_process(1)
    for w in workers:
        np.testing.assert_allclose(w["weights"], expected["weights"], atol=1e-5)
        assert w["history"]["loss"] == pytest.approx(expected["history"]["loss"], abs=1e-5)
    lines = [line for e in seen if e.kind == EventKind.LOG
             for line in [e.data.get("line", "")] + e.data.get("lines", [])]
    passed = [line for line in lines if "passed tfnb's self-check" in line]
    assert len(passed) == 1 and f"Keras {NEWER} (tested up to" in passed[0], passed or lines[-20:]
    # the fit that raised left no private TensorBoard folder behind (on the non-chief worker)
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("tfnb-keras-worker-")]

    # the planted error: a custom loop stops before its first step, every worker with the same one line
    with pytest.raises(tfnb.WorkerError) as caught:
        tfnb.run(custom_loop, num_workers=2, spark=spark, env=_env(newer_keras["doubled"]), display=False,
                 timeout=600, max_attempts=1)
    first = str(caught.value).splitlines()[0]
    assert f"Keras {NEWER} failed tfnb's self-check" in first and first.endswith("or use tf.keras"), first
    assert "fit: the update was 2.00x the one-process update" in first, first
    low, high = ".".join(map(str, (3, 3, 3))), ".".join(map(str, TESTED_NEWEST["keras"]))
    assert f"pip install 'keras>={low},<={high}'" in str(caught.value)

    # the same check, asked from the driver before a job: a typed result
    check = tfnb.selfcheck(num_workers=2, spark=spark, env=_env(newer_keras["doubled"]), timeout=600)
    assert isinstance(check, tfnb.SelfCheck) and not check.passed and check.versions["keras"] == NEWER
    assert check.ratio == pytest.approx(2.0, abs=1e-3) and "2.00x the one-process update" in check.message
    with pytest.raises(Exception):  # frozen
        check.passed = True
