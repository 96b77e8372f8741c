"""``./dev demo`` (``python -m tools.demo``): real distributed training on scikit-learn's digits, on an embedded local Spark.

Two workers train a small Keras 3 model with MultiWorkerMirroredStrategy, each on its own shard,
with checkpoints (BackupAndRestore, so a relaunched run resumes) and TensorBoard logs. The chief
evaluates on held-out digits and returns the accuracy.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time


def load_digits_split(seed: int = 0):
    """(x_train, y_train, x_test, y_test) from scikit-learn's bundled 8x8 digits, scaled to [0, 1]."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    cut = int(len(x) * 0.8)
    return x[:cut], y[:cut], x[cut:], y[cut:]


def train_digits(ctx, epochs: int = 8, batch_size: int = 32, learning_rate: float = 0.01, package: str = "keras"):
    """train_fn for tfnb.run: Keras 3 under MultiWorkerMirroredStrategy, each worker on its own shard of digits.
    ``package="tf_keras"`` trains the same model with tf-keras."""
    import importlib

    import numpy as np
    import tensorflow as tf

    x_train, y_train, x_test, y_test = load_digits_split()
    # Each worker takes a distinct, equal-length shard: MWMS needs the same number of steps everywhere.
    per_worker = len(x_train) // ctx.num_workers
    lo = ctx.task_index * per_worker
    x_shard, y_shard = x_train[lo:lo + per_worker], y_train[lo:lo + per_worker]
    steps = per_worker // batch_size

    keras = importlib.import_module(package)
    keras.utils.set_random_seed(0)  # the same first weights on every run of this Keras
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    options = tf.data.Options()  # the shard is this worker's already: TensorFlow must not shard it again
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    # fit takes each batch as a global one, split over the workers' steps: with batches of batch_size x workers
    # rows every worker steps through its own shard batch_size rows at a time
    train = (tf.data.Dataset.from_tensor_slices((x_shard, y_shard)).shuffle(len(x_shard), seed=ctx.task_index)
             .repeat().batch(batch_size * ctx.num_workers).with_options(options))
    with strategy.scope():
        model = keras.Sequential([
            keras.layers.Input(shape=(64,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    callbacks = [ctx.progress_callback(batch_size=batch_size, every_n_steps=5)]
    if ctx.model_dir:
        callbacks.append(keras.callbacks.BackupAndRestore(os.path.join(ctx.model_dir, "backup")))
        callbacks.append(keras.callbacks.ModelCheckpoint(
            os.path.join(ctx.model_dir, "ckpt-{epoch}.weights.h5"), save_weights_only=True))
    if ctx.log_dir:
        callbacks.append(keras.callbacks.TensorBoard(ctx.log_dir, update_freq="epoch"))
    history = model.fit(train, epochs=epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=2)
    # Every held-out digit, scored in this process (the weights are the same on every worker).
    logits = model(x_test, training=False)
    loss = float(keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y_test, logits))
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    if ctx.model_dir:
        # Saving is a collective under MultiWorkerMirroredStrategy: every worker saves, only the
        # chief's copy is kept.
        model.save(os.path.join(ctx.model_dir if ctx.is_chief else ctx.local_dir, "model.keras"))
    return {"accuracy": float(accuracy), "loss": float(loss),
            "train_accuracy": float(history.history["accuracy"][-1]), "epochs": epochs,
            "attempt": ctx.attempt}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfnb demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", default="tfnb-demo", help="where the model and TensorBoard logs go")
    parser.add_argument("--master", default=None, help="Spark master (default: local[WORKERS])")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import tfnb

    out = os.path.abspath(args.out)
    model_dir, log_dir = os.path.join(out, "model"), os.path.join(out, "logs")
    shutil.rmtree(model_dir, ignore_errors=True)  # a fresh run, not a resume of the last demo
    start = time.monotonic()
    spark = (SparkSession.builder.master(args.master or f"local[{args.workers}]").appName("tfnb-demo")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        result = tfnb.run(train_digits, num_workers=args.workers, args=(args.epochs, args.batch_size),
                          spark=spark, model_dir=model_dir, log_dir=log_dir)
    finally:
        spark.stop()
    took = time.monotonic() - start
    print(f"\ntfnb demo: {args.workers} workers, {args.epochs} epochs on scikit-learn digits")
    print(f"  test accuracy : {result['accuracy']:.3f}  (chance is 0.100)")
    print(f"  model         : {os.path.join(model_dir, 'model.keras')}")
    print(f"  checkpoints   : {model_dir}")
    print(f"  tensorboard   : tensorboard --logdir {log_dir}")
    print(f"  time          : {took:.1f} s")
    return 0 if result["accuracy"] > 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
