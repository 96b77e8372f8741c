"""The self-check (docs/keras3.md): SGD steps of a tiny linear model under the run's strategy, three ways, against
the same steps in numpy. Run at the first model method under a strategy where a version is newer than the tested
ones, or alone by ``tfnb.selfcheck``; every worker takes part in the verdict, so all train or all stop."""
from __future__ import annotations

import os
import re
import sys

from .._deps import TESTED_NEWEST, _version, tested_range

FEATURES, LR, ROWS_PER_REPLICA = 4, 0.1, 4


def versions(keras, tf) -> dict:
    """The versions of Keras, TensorFlow and Spark in this process; Spark's read from pyspark's version.py without
    importing it (pip, Spark's python/ folder or a zip alike), None where it cannot be told."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("pyspark")
        text = spec.loader.get_data(os.path.join(os.path.dirname(spec.origin), "version.py")).decode()
        spark = re.search(r"__version__[^=\n]*=\s*['\"]([^'\"]+)", text).group(1)
    except Exception:  # noqa: BLE001 - no pyspark here: nothing to compare
        spark = None
    return {"keras": keras.__version__, "tensorflow": tf.__version__, "spark": spark}


_NAMES = {"keras": "Keras", "tensorflow": "TensorFlow", "spark": "Spark"}


def untested(found: dict) -> list[str]:
    """Those of ``found`` newer than the tested ones, as "Keras 3.16.0 (tested up to 3.15.1)"."""
    return [f"{_NAMES[name]} {version} (tested up to {'.'.join(map(str, TESTED_NEWEST[name]))})"
            for name, version in found.items() if version and _version(version, 3) > TESTED_NEWEST[name]]


def _start():
    import numpy as np

    w0 = np.linspace(-0.5, 0.5, FEATURES, dtype="float32").reshape(FEATURES, 1)
    return w0, np.array([0.1], "float32")


def _data(n: int):
    """Two global batches of ``ROWS_PER_REPLICA`` rows a replica: (x, y) of each."""
    import numpy as np

    rng = np.random.default_rng(7)
    rows = ROWS_PER_REPLICA * n
    return [(rng.standard_normal((rows, FEATURES)).astype("float32"),
             rng.standard_normal((rows, 1)).astype("float32")) for _ in range(2)]


def one_process(batches):
    """SGD on mean squared error over ``batches`` in one process: the flat weights at the start and after each step,
    and each step's loss."""
    import numpy as np

    w, b = _start()
    weights, losses = [np.concatenate([w.ravel(), b])], []
    for x, y in batches:
        err = x @ w + b - y
        losses.append(float(np.mean(err ** 2)))
        w, b = w - LR * 2.0 / len(x) * x.T @ err, b - LR * 2.0 / len(x) * err.sum(0)
        weights.append(np.concatenate([w.ravel(), b]))
    return weights, losses


def _model(keras, strategy):
    w0, b0 = _start()
    with strategy.scope():
        # zeros, then the start's weights: a random initializer would draw from the seed the user's training uses
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(1, kernel_initializer="zeros", bias_initializer="zeros")])
        model.compile(keras.optimizers.SGD(LR), "mse")
        model.set_weights([w0, b0])
    return model


def _flat(model):
    import numpy as np

    return np.concatenate([np.asarray(v).ravel() for v in model.get_weights()])


def _dataset(tf, x, y, batch: int):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).with_options(options)


def _worker_slice(strategy, rows: int):
    """This worker's rows of a global batch of ``rows``: its input pipeline's share."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return slice(0, rows)
    jobs = resolver.cluster_spec().as_dict()
    order = [(job, i) for job in ("chief", "worker") for i in range(len(jobs.get(job, ())))]
    index, count = order.index((resolver.task_type, resolver.task_id)), len(order)
    return slice(index * rows // count, (index + 1) * rows // count)


def _fit(keras, tf, strategy, batches):
    """Two steps of ``fit``: the weights after its first step and at the end, and the epoch's loss."""
    import numpy as np

    model = _model(keras, strategy)
    first = []

    class First(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if not first:
                first.append(_flat(self.model))

    x, y = (np.concatenate(parts) for parts in zip(*batches))
    history = model.fit(_dataset(tf, x, y, len(batches[0][0])), epochs=1, verbose=0, shuffle=False,
                        callbacks=[First()])
    return first[0], _flat(model), float(history.history["loss"][0])


def _custom_loop(keras, tf, strategy, batches):
    """One step of a custom loop (``strategy.run`` + ``apply_gradients``)."""
    model = _model(keras, strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(LR)
    x, y = batches[0]

    @tf.function
    def step(batch):
        def replica(bx, by):
            with tf.GradientTape() as tape:
                per_example = tf.reduce_mean(tf.square(model(bx) - by), axis=-1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=len(x))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))

        strategy.run(replica, args=batch)

    step(next(iter(strategy.experimental_distribute_dataset(_dataset(tf, x, y, len(x))))))
    return _flat(model), None, None


def _train_on_batch(keras, tf, strategy, batches):
    """One ``train_on_batch``, each worker with its rows of the global batch; the loss it returns."""
    import numpy as np

    model = _model(keras, strategy)
    x, y = batches[0]
    mine = _worker_slice(strategy, len(x))
    out = model.train_on_batch(x[mine], y[mine])  # the loss of the global batch, every worker's rows
    return _flat(model), None, float(np.ravel(out)[0])


WAYS = {"fit": _fit, "custom loop": _custom_loop, "train_on_batch": _train_on_batch}


def check(keras, strategy) -> dict:
    """The check, on every worker: ``passed`` (the same on all), ``ratio`` (the worst way's update over the
    one-process update, averaged over workers), ``details`` (what differs) and each way's ``ratios``."""
    import numpy as np
    import tensorflow as tf

    from ..errors import summary

    batches = _data(int(strategy.num_replicas_in_sync))
    weights, losses = one_process(batches)
    start, expected = weights[0], weights[1] - weights[0]
    local, errors = np.zeros((3, len(WAYS)), "float32"), {}  # each way's failed, update ratio, no ratio
    for i, (way, run) in enumerate(WAYS.items()):
        try:
            got, last, got_loss = run(keras, tf, strategy, batches)
            local[1, i] = np.dot(got - start, expected) / np.dot(expected, expected)
            ok = np.allclose(got, weights[1], rtol=1e-4, atol=1e-6) and (
                last is None or np.allclose(last, weights[2], rtol=1e-4, atol=1e-6))
        except Exception as e:  # noqa: BLE001 - an error is a failed check, reported in one line
            local[:, i] = 1.0, 0.0, 1.0
            errors[way] = f"it raised {type(e).__name__}: {summary(e, 120)}"
            continue
        loss = float(np.mean(losses)) if way == "fit" else losses[0]
        if ok and got_loss is not None and abs(got_loss - loss) > 1e-4 * max(1.0, loss):
            ok, errors[way] = False, f"its loss was {got_loss:.6g}, one process's {loss:.6g}"
        local[0, i] = not ok
    agreed = strategy.reduce("MEAN", strategy.run(lambda: tf.constant(local)), axis=None).numpy()
    failed = agreed[0] > 0
    mean_ratio = [float("nan") if nan > 0 else float(r) for r, nan in zip(agreed[1], agreed[2])]
    details = [f"{way}: " + (errors.get(way) or (f"the update was {ratio:.2f}x the one-process update"
                                                 if ratio == ratio else "failed on another worker"))
               for way, bad, ratio in zip(WAYS, failed, mean_ratio) if bad]
    worst = max((r for r in mean_ratio if r == r), key=lambda r: abs(r - 1.0), default=float("nan"))
    return {"passed": not failed.any(), "ratio": worst, "details": details, "ratios": dict(zip(WAYS, mean_ratio))}


def check_or_refuse(keras, strategy, newer: list[str]) -> None:
    """The self-check where ``newer`` names untested versions: a line from the chief if it passes, else ConfigError."""
    if not newer:
        return
    import tensorflow as tf

    from ..errors import KERAS3_SELFCHECK, ConfigError

    result = check(keras, strategy)
    mwms = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)  # of class CollectiveAllReduceStrategy
    name = "MultiWorkerMirroredStrategy" if mwms else "MirroredStrategy"  # the two that ready() checks under
    if not result["passed"]:
        checks = ", ".join(f"{way} {r:.2f}x" if r == r else f"{way} none" for way, r in result["ratios"].items())
        checks = f"Updates over the one-process update: {checks}. {'; '.join(result['details'])}."
        raise ConfigError(KERAS3_SELFCHECK.format(
            what=f"Keras {keras.__version__}", detail=result["details"][0], strategy=name,
            untested=" and ".join(newer) + (" is" if len(newer) == 1 else " are"),
            checks=checks, **tested_range()))
    if getattr(strategy.extended, "should_checkpoint", True):  # the chief
        print(f"tfnb: {', '.join(newer)}: untested, passed tfnb's self-check under {name} "
              f"(fit, custom loop and train_on_batch trained as one process; TensorFlow {tf.__version__})",
              file=sys.stderr, flush=True)

