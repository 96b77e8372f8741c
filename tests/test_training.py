"""Real TensorFlow clusters under tfnb.run: Keras model.fit under MultiWorkerMirroredStrategy (twice in one
session) and ParameterServerStrategy with ps tasks. Relaunch and resume: tests/test_recovery.py."""
from __future__ import annotations

import os
import sys

import tfnb


def random_binary_dataset(ctx):
    """Each worker's own fixed random data (no auto-sharding), repeated in batches of 32."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(ctx.task_index)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32).with_options(options)


def fit_small_model(ctx, epochs):
    """A tf-keras MLP on fixed random data under MultiWorkerMirroredStrategy with BackupAndRestore."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ds = random_binary_dataset(ctx)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                     tf.keras.layers.Dense(1, activation="sigmoid")])
        model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    epochs_run = []

    class Record(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            epochs_run.append(epoch)

    backup = tf.keras.callbacks.BackupAndRestore(os.path.join(ctx.model_dir, "backup"))
    history = model.fit(ds, epochs=epochs, steps_per_epoch=4, callbacks=[backup, Record()], verbose=0)
    generated = [m.__file__ for name, m in sys.modules.items() if name.startswith("__autograph_generated_file")]
    return {"keras": type(model).__module__, "attempt": ctx.attempt, "epochs_run": epochs_run,
            "loss": history.history["loss"], "mwms": isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
            "replicas": strategy.num_replicas_in_sync, "generated": generated}


def test_keras_fit_under_mwms_twice_in_one_session(spark, tmp_path, no_orphans):
    first = tfnb.run(fit_small_model, num_workers=2, args=(2,), spark=spark, model_dir=str(tmp_path / "a"),
                     display=False, timeout=600)
    second = tfnb.run(fit_small_model, num_workers=2, args=(2,), spark=spark, model_dir=str(tmp_path / "b"),
                      display=False, timeout=600)
    for result in (first, second):
        assert result["mwms"] and result["replicas"] == 2
        assert result["keras"].startswith("tf_keras")  # the Keras that trains under MWMS
        assert result["epochs_run"] == [0, 1] and len(result["loss"]) == 2
        # the sources TensorFlow's autograph wrote to the temporary folder went with the process
        assert result["generated"] and not [f for f in result["generated"] if os.path.exists(f)]


def train_with_parameter_servers(ctx):
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)

    def dataset_fn(input_context):
        x = tf.random.stateless_normal((128, 4), seed=(1, 2))
        y = tf.reduce_sum(x, axis=1, keepdims=True)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)

    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(1)])
        model.compile(tf.keras.optimizers.SGD(0.05), "mse", steps_per_execution=2)
    history = model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=3, steps_per_epoch=6,
                        verbose=0)
    devices = sorted({v.device for v in model.variables})
    return {"job_name": ctx.job_name, "cluster": dict(ctx.cluster_spec), "devices": devices,
            "loss": history.history["loss"]}


def test_parameter_server_strategy_with_ps_tasks(no_orphans):
    from conftest import spark_session

    session = spark_session("local[3]")
    result = tfnb.run(train_with_parameter_servers, num_workers=2, num_ps=1, spark=session, display=False,
                      timeout=600)
    assert result["job_name"] == "chief"
    assert set(result["cluster"]) == {"chief", "worker", "ps"} and len(result["cluster"]["ps"]) == 1
    assert any("/job:ps" in d for d in result["devices"])  # variables live on the ps task
    assert result["loss"][-1] < result["loss"][0]
