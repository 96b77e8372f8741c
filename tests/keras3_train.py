"""A Keras 3 (``import keras``) training that can be checked against one process: digits, a small MLP, plain SGD,
no shuffling, fixed seeds. tests/test_keras3.py runs it under tfnb.run with the suite's Keras, and
tests/scripts/keras3_floor.py with the simulated Databricks Runtime 15.4 LTS ML's (Keras 3.3.3, TensorFlow 2.16.1).

Under MultiWorkerMirroredStrategy Keras splits each global batch of the (unsharded, batched) dataset between the
workers, so N workers over batches of ``BATCH`` rows take the same steps as one process over the same batches:
the weights, the per-epoch loss and metrics, evaluate and predict must all come out as one process's.
"""
from __future__ import annotations

import json
import os

BATCH = 64  # global batch: split between the workers
ROWS = 512  # training rows (a multiple of BATCH); the next TEST rows are the test set
TEST = 200


def data():
    import numpy as np
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int64)


def model_and_data(keras, tf):
    """The compiled model (in the current strategy's scope) and the train / test datasets."""
    x, y = data()
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.layers.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    train = tf.data.Dataset.from_tensor_slices((x[:ROWS], y[:ROWS])).batch(BATCH)
    test = tf.data.Dataset.from_tensor_slices((x[ROWS:ROWS + TEST], y[ROWS:ROWS + TEST])).batch(BATCH // 2)
    return model, train, test, x[ROWS:ROWS + TEST]


def flat_weights(model):
    import numpy as np

    return np.concatenate([np.asarray(v).ravel() for v in model.get_weights()])


def train_fn(ctx, epochs, die_after_epoch=None):
    """Every worker writes ``worker-<i>.json`` (its weights, history, evaluate, predict) to model_dir; worker 1 of
    the first attempt exits after epoch ``die_after_epoch``'s backup was written, as a crashed process would."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tfnb._task import keras3

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    # which defects this Keras has: probed after the strategy (it configures collectives before any tensor)
    before = {p.name: p.probe() for p in keras3.PATCHES}
    with strategy.scope():
        model, train, test, test_x = model_and_data(keras, tf)
    began = []

    class Chaos(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            began.append(epoch)

        def on_epoch_end(self, epoch, logs=None):
            if ctx.attempt == 1 and ctx.task_index == 1 and epoch == die_after_epoch:
                os._exit(3)

    callbacks = [ctx.progress_callback(batch_size=BATCH // ctx.num_workers),
                 keras.callbacks.BackupAndRestore(os.path.join(ctx.model_dir, "backup")),
                 keras.callbacks.ModelCheckpoint(os.path.join(ctx.model_dir, "ckpt-{epoch}.weights.h5"),
                                                 save_weights_only=True),
                 keras.callbacks.TensorBoard(ctx.log_dir), Chaos()]
    history = model.fit(train, epochs=epochs, verbose=0, callbacks=callbacks)
    evaluated = model.evaluate(test, verbose=0, return_dict=True)
    predicted = model.predict(tf.data.Dataset.from_tensor_slices(test_x).batch(BATCH // 2), verbose=0)
    # saving is collective: every worker saves, the chief's copy is the one kept
    model.save(os.path.join(ctx.model_dir if ctx.is_chief else ctx.local_dir, "model.keras"))
    report = {"attempt": ctx.attempt, "began": began, "keras": keras.__version__, "probes_before": before,
              "patches": list(keras._tfnb.applied), "history": history.history,
              "probes_after": {p.name: p.probe() for p in keras3.PATCHES},
              "evaluate": evaluated, "weights": flat_weights(model).tolist(),
              "predict_error": float(np.abs(predicted - model(test_x).numpy()).max()),
              "predict_rows": int(predicted.shape[0])}
    with open(os.path.join(ctx.model_dir, f"worker-{ctx.task_index}.json"), "w") as f:
        json.dump(report, f)
    return ctx.attempt


def one_process(epochs):
    """The same training in this process, without a strategy: what every worker must end with."""
    import keras
    import tensorflow as tf

    model, train, test, _ = model_and_data(keras, tf)
    history = model.fit(train, epochs=epochs, verbose=0)
    return {"history": history.history, "evaluate": model.evaluate(test, verbose=0, return_dict=True),
            "weights": flat_weights(model).tolist()}


def reports(model_dir, num_workers, kind="worker"):
    """Every worker's ``<kind>-<i>.json``: ``worker`` from train_fn, ``fed`` from fed_fn."""
    out = []
    for i in range(num_workers):
        with open(os.path.join(model_dir, f"{kind}-{i}.json")) as f:
            out.append(json.load(f))
    return out


def fed_fn(ctx):
    """Each worker reads its own rows of the fed DataFrame through ctx.dataset (a dataset distributed from a
    function) and writes ``fed-<i>.json``: its weights after an epoch, and evaluate on its own rows."""
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model, _, _, _ = model_and_data(keras, tf)
    ds = ctx.dataset(16, label_col="label", strategy=strategy)
    model.fit(ds, epochs=1, steps_per_epoch=ctx.steps_per_epoch(16), verbose=0)
    report = {"weights": flat_weights(model).tolist(), "patches": list(keras._tfnb.applied),
              "evaluate": model.evaluate(ds, steps=2, verbose=0, return_dict=True)}
    with open(os.path.join(ctx.model_dir, f"fed-{ctx.task_index}.json"), "w") as f:
        json.dump(report, f)
