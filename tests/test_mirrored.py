"""spark-tensorflow-distributor programs on tfnb.compat: its example, a Keras 3 train, its GPU allocation rule,
local mode."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import tfnb
from tfnb.compat import MirroredStrategyRunner
from tfnb.compat.mirrored import gpus_per_task
from tfnb.errors import ClusterError


def example_train(data_path):
    """spark-tensorflow-distributor's examples/simple/example.py `train`, with offline data instead of MNIST."""
    import numpy as np
    import tensorflow as tf

    BUFFER_SIZE = 10000
    BATCH_SIZE = 64

    def make_datasets():
        with np.load(data_path) as d:
            mnist_images, mnist_labels = d["x"], d["y"]
        dataset = tf.data.Dataset.from_tensor_slices((
            tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
            tf.cast(mnist_labels, tf.int64))
        )
        dataset = dataset.repeat().shuffle(BUFFER_SIZE).batch(BATCH_SIZE)
        return dataset

    def build_and_compile_cnn_model():
        model = tf.keras.Sequential([
            tf.keras.layers.Conv2D(32, 3, activation='relu', input_shape=(28, 28, 1)),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation='relu'),
            tf.keras.layers.Dense(10, activation='softmax'),
        ])
        model.compile(
            loss=tf.keras.losses.sparse_categorical_crossentropy,
            optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
            metrics=['accuracy'],
        )
        return model

    train_datasets = make_datasets()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train_datasets = train_datasets.with_options(options)
    multi_worker_model = build_and_compile_cnn_model()
    history = multi_worker_model.fit(x=train_datasets, epochs=3, steps_per_epoch=5)
    return {"epochs": len(history.history["loss"]),
            "multi_worker": isinstance(tf.distribute.get_strategy(), tf.distribute.MultiWorkerMirroredStrategy)}


@pytest.fixture(scope="module")
def digits_28(tmp_path_factory):
    """scikit-learn's digits, scaled to MNIST's 28x28 uint8 layout."""
    import numpy as np
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.kron(d.images, np.ones((3, 3)))  # 8x8 -> 24x24
    images = np.pad(images, ((0, 0), (2, 2), (2, 2))) * (255 / 16)
    path = tmp_path_factory.mktemp("digits") / "digits28.npz"
    np.savez(path, x=images.astype("uint8"), y=d.target.astype("int64"))
    return str(path)


def test_the_original_example_runs_with_the_import_changed(spark, digits_28, no_orphans):
    # The original calls MirroredStrategyRunner(num_slots=8).run(train) on a GPU cluster; here: 2 CPU tasks.
    result = MirroredStrategyRunner(num_slots=2, use_gpu=False, spark=spark).run(example_train, data_path=digits_28)
    assert result == {"epochs": 3, "multi_worker": True}
    # a rerun in the same session works (the original needed a private TensorFlow reset for that)
    again = MirroredStrategyRunner(num_slots=2, use_gpu=False, spark=spark).run(example_train, data_path=digits_28)
    assert again == result


def keras3_train(data_path):
    """The example's train written for Keras 3 (``import keras``), with no strategy of its own: it runs in the
    runner's scope, where Keras 3's fit needs tfnb's corrections under MultiWorkerMirroredStrategy."""
    import keras
    import numpy as np
    import tensorflow as tf

    with np.load(data_path) as d:
        x, y = (d["x"][:640] / 255.0).astype("float32"), d["y"][:640]
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.layers.Input((28, 28)), keras.layers.Flatten(),
                              keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(64).repeat(), epochs=3, steps_per_epoch=5,
                        verbose=0)
    return {"keras": keras.__version__.split(".")[0], "epochs": len(history.history["loss"]),
            "strategy": type(model.distribute_strategy).__name__,
            "replicas": model.distribute_strategy.num_replicas_in_sync,
            "learned": history.history["loss"][-1] < history.history["loss"][0]}


def test_keras3_train_runs_in_the_runners_strategy(spark, digits_28, no_orphans):
    result = MirroredStrategyRunner(num_slots=2, use_gpu=False, spark=spark).run(keras3_train, data_path=digits_28)
    # MultiWorkerMirroredStrategy's class, over both tasks
    assert result == {"keras": "3", "epochs": 3, "strategy": "CollectiveAllReduceStrategy", "replicas": 2,
                      "learned": True}


def own_strategy(out):
    import tensorflow as tf

    outer = type(tf.distribute.get_strategy()).__name__
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        v = tf.Variable(1.0)
    return {"outer": outer, "replicas": strategy.num_replicas_in_sync, "var": float(v.numpy()), "out": out}


def test_use_custom_strategy_lets_train_build_its_own(spark, no_orphans):
    result = MirroredStrategyRunner(num_slots=2, use_gpu=False, use_custom_strategy=True, spark=spark).run(
        own_strategy, out="x")
    # no strategy around train: it built the multi-worker one itself, over both tasks
    assert result == {"outer": "_DefaultDistributionStrategy", "replicas": 2, "var": 1.0, "out": "x"}


@pytest.mark.parametrize("bad", [0, -1])
def test_num_slots_must_be_positive(bad):
    with pytest.raises(ValueError, match=f"num_slots is set to {bad}"):
        MirroredStrategyRunner(num_slots=bad).run(lambda: None)


def test_gpu_training_without_gpu_scheduling_is_a_clear_error(spark):
    with pytest.raises(ClusterError, match="spark.task.resource.gpu.amount is not set.*use_gpu=False"):
        MirroredStrategyRunner(num_slots=2, spark=spark)


def uses_task_context():
    from pyspark import BarrierTaskContext

    return BarrierTaskContext.get().partitionId()


def test_barrier_task_context_in_train_points_to_the_equivalent(spark, monkeypatch, no_orphans):
    monkeypatch.setenv("TFNB_PREIMPORT", "")
    with pytest.raises(tfnb.WorkerError) as info:
        MirroredStrategyRunner(num_slots=2, use_gpu=False, use_custom_strategy=True, spark=spark).run(
            uses_task_context)
    message = str(info.value)
    assert "BarrierTaskContext.get() is not available" in message and "TF_CONFIG" in message


# ---------------------------------------------------------------- GPU allocation (the original's integration test)


@pytest.mark.parametrize("task_amount", [1, 2, 4])
@pytest.mark.parametrize("num_slots", [2, 4, 6, 8])
def test_allocation_rule(task_amount, num_slots):
    tasks = -(-num_slots // task_amount)
    shares = [gpus_per_task(num_slots, tasks, rank) for rank in range(tasks)]
    assert sum(shares) == num_slots and max(shares) <= task_amount and max(shares) - min(shares) <= 1
    assert shares == sorted(shares, reverse=True)  # the remainder goes to the first tasks


def count_gpus(out_dir):
    import json as _json

    rank = _json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    cuda = os.environ["CUDA_VISIBLE_DEVICES"]
    Path(out_dir, f"{rank}.json").write_text(_json.dumps(cuda.split(",") if cuda else []))
    return rank


def test_equal_gpu_allocation(tmp_path, monkeypatch, no_orphans):
    """The original's test_equal_gpu_allocation: 2 executors with 4 (stub) GPUs, 4 GPUs per task."""
    from conftest import gpu_local_cluster

    monkeypatch.setenv("TFNB_PREIMPORT", "")
    session = gpu_local_cluster(tmp_path, 4)
    for num_slots, expected in [(2, [2]), (4, [4]), (6, [3, 3]), (8, [4, 4])]:
        out = tmp_path / f"slots{num_slots}"
        out.mkdir()
        runner = MirroredStrategyRunner(num_slots=num_slots, use_custom_strategy=True, spark=session)
        assert runner.get_num_tasks() == len(expected)
        assert runner.run(count_gpus, out_dir=str(out)) == 0  # the chief's return value
        used = [json.loads((out / f"{rank}.json").read_text()) for rank in range(len(expected))]
        assert [len(gpus) for gpus in used] == expected
        assert all(set(gpus) <= {"0", "1", "2", "3"} for gpus in used)


def visible_devices():
    return os.environ["CUDA_VISIBLE_DEVICES"]


@pytest.mark.parametrize("old_cuda_state", [None, "10,11,12,13"])
def test_local_mode_uses_the_drivers_gpus_and_restores_the_env(tmp_path, monkeypatch, old_cuda_state):
    from conftest import spark_session, stub_gpus

    session = spark_session("local[2]", **{"spark.driver.resource.gpu.amount": "4",
                                           "spark.driver.resource.gpu.discoveryScript": stub_gpus(tmp_path, 4)})
    if old_cuda_state is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", old_cuda_state)
    allowed = {"10", "11", "12", "13"} if old_cuda_state else {"0", "1", "2", "3"}
    for num_slots in (1, 2, 3):
        seen = MirroredStrategyRunner(num_slots=num_slots, local_mode=True, use_custom_strategy=True,
                                      spark=session).run(visible_devices).split(",")
        assert len(set(seen)) == num_slots and set(seen) <= allowed
        assert os.environ.get("CUDA_VISIBLE_DEVICES") == old_cuda_state
    with pytest.raises(ClusterError, match="num_slots=5 GPUs requested"):
        MirroredStrategyRunner(num_slots=5, local_mode=True, spark=session).run(visible_devices)
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == old_cuda_state


def test_local_mode_on_cpu_runs_one_process_under_mirrored_strategy(spark):
    def train(x):
        import tensorflow as tf

        return type(tf.distribute.get_strategy()).__name__, os.environ["CUDA_VISIBLE_DEVICES"], x

    assert MirroredStrategyRunner(num_slots=1, local_mode=True, use_gpu=False, spark=spark).run(train, x=3) == (
        "MirroredStrategy", "", 3)
