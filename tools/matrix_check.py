"""The correctness check of one version-matrix cell (tools/matrix.py runs it with the cell's Python).

N workers (2, then 4) train under MultiWorkerMirroredStrategy through the real ``tfnb.run`` on local Spark
(``local[N]``): scikit-learn's digits, a small MLP, plain SGD (a scale error moves the weights N times as far, so it
shows), fixed seeds, no shuffling, global batches of BATCH rows. Three ways, each from the same initial weights:

* ``fit``: EPOCHS epochs of ``model.fit`` over the batched dataset, then ``evaluate`` and ``predict``;
* ``custom loop``: ``strategy.run`` of a step that computes ``tf.nn.compute_average_loss`` over the global batch and
  calls ``optimizer.apply_gradients``, over ``strategy.experimental_distribute_dataset``;
* ``train_on_batch``: every worker passes its share of each global batch (Keras 3), or the whole global batch, which
  tf-keras splits between the workers as it does a dataset.

Passes when, for every way, every worker's weights equal each other's (ATOL_WORKERS) and equal one process's over
the same global batches without a strategy (ATOL), the per-epoch loss and accuracy (``fit``), the per-epoch mean
loss (custom loop) and the per-step loss (``train_on_batch``) equal the one-process values (ATOL), ``evaluate``
equals one process's on every worker and ``predict`` returns every row in order. With ``--mlflow SERVER_PYTHON``,
the 2-worker run also logs to a real ``mlflow server`` on loopback (tfnb.run(mlflow=...)), and the run must be
FINISHED with one ``loss`` point per epoch equal to the one-process loss.

``--plain``: Keras without tfnb under ``MirroredStrategy`` over 2 logical CPU devices in one process, the same three
ways; a Keras whose distributed update is off by a factor fails here (Keras 3.6.0: ``fit`` moves 2.0x as far).

The last line of stdout is the result as JSON: ``{"ok": bool, "checks": [...], "reason": str, "versions": {...}}``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request

BATCH = 64  # global batch, split between the workers
ROWS = 512  # training rows (a multiple of BATCH); the next TEST rows are the test set
TEST = 200
EPOCHS = 2
LR = 0.1
ATOL = 1e-5  # against one process: float32 all-reduce sums in another order
ATOL_WORKERS = 1e-6  # between workers: the same all-reduced values
WAYS = ("fit", "custom loop", "train_on_batch")


def _keras(legacy: bool):
    if legacy:
        import tensorflow as tf

        return tf.keras
    import keras

    return keras


def _data():
    import numpy as np
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int64)


def _model(keras, strategy):
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.layers.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(keras.optimizers.SGD(LR), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return model


def _flat(model):
    import numpy as np

    return np.concatenate([np.asarray(v).ravel() for v in model.get_weights()]).tolist()


def _worker_slice(strategy, rows: int) -> slice:
    """This worker's share of a global batch of ``rows``: the same share tfnb's self-check feeds each worker."""
    from tfnb._task.selfcheck import _worker_slice as share

    return share(strategy, rows)


def train_three_ways(keras, tf, strategy, callbacks=(), legacy=False) -> dict:
    """The three ways under ``strategy`` (the default strategy: one process); what each ended with."""
    import numpy as np

    x, y = _data()
    train = tf.data.Dataset.from_tensor_slices((x[:ROWS], y[:ROWS])).batch(BATCH)
    test = tf.data.Dataset.from_tensor_slices((x[ROWS:ROWS + TEST], y[ROWS:ROWS + TEST])).batch(BATCH // 2)
    out = {}

    model = _model(keras, strategy)
    out["init"] = _flat(model)
    history = model.fit(train, epochs=EPOCHS, verbose=0, shuffle=False, callbacks=list(callbacks))
    predicted = model.predict(tf.data.Dataset.from_tensor_slices(x[ROWS:ROWS + TEST]).batch(BATCH // 2), verbose=0)
    out["fit"] = {"weights": _flat(model), "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
                  "evaluate": {k: float(v) for k, v in model.evaluate(test, verbose=0, return_dict=True).items()},
                  "predict_rows": int(predicted.shape[0]),
                  "predict_error": float(np.abs(predicted - model(x[ROWS:ROWS + TEST]).numpy()).max())}

    model = _model(keras, strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(LR)
        optimizer.build(model.trainable_variables)

    @tf.function(autograph=False)  # no Python control flow to convert; the source file is not read
    def step(bx, by):
        def replica(bx, by):
            with tf.GradientTape() as tape:
                per_example = keras.losses.sparse_categorical_crossentropy(by, model(bx, training=True),
                                                                           from_logits=True)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(replica, args=(bx, by)), axis=None)

    losses = []
    for _ in range(EPOCHS):
        steps = [float(step(bx, by)) for bx, by in strategy.experimental_distribute_dataset(train)]
        losses.append(float(np.mean(steps)))
    out["custom loop"] = {"weights": _flat(model), "history": {"loss": losses}}

    model = _model(keras, strategy)
    # Keras 3 runs train_on_batch's arrays as each replica's own; tf-keras distributes them as a dataset, splitting
    # the global batch between the workers itself
    mine = slice(0, BATCH) if legacy else _worker_slice(strategy, BATCH)
    losses = []
    for _ in range(EPOCHS):
        for b in range(0, ROWS, BATCH):
            logs = model.train_on_batch(x[b:b + BATCH][mine], y[b:b + BATCH][mine])
            losses.append(float(np.ravel(logs)[0]))
    out["train_on_batch"] = {"weights": _flat(model), "history": {"loss": losses}}
    return out


def train_fn(ctx, legacy):
    """Each worker writes ``check-<task_index>.json`` (train_three_ways' result) to model_dir."""
    keras = _keras(legacy)
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    out = train_three_ways(keras, tf, strategy, [ctx.progress_callback(batch_size=BATCH // ctx.num_workers)], legacy)
    out["keras"] = getattr(keras, "__version__", "tf-keras")
    with open(os.path.join(ctx.model_dir, f"check-{ctx.task_index}.json"), "w") as f:
        json.dump(out, f)
    return ctx.task_index


def _ratio(got, want, init) -> float:
    """got's update along one process's update, as a multiple of it (1.0: the same step; 2.0: twice as far)."""
    import numpy as np

    g, w = np.asarray(got) - np.asarray(init), np.asarray(want) - np.asarray(init)
    return float(np.dot(g, w) / np.dot(w, w))


def compare(workers: list[dict], expected: dict, label: str) -> list[str]:
    """What differs from one process (empty: nothing), each naming the way and the worker."""
    import numpy as np

    fails = []
    for way in WAYS:
        for i, w in enumerate(workers):
            got, want = np.asarray(w[way]["weights"]), np.asarray(expected[way]["weights"])
            if i and np.abs(got - np.asarray(workers[0][way]["weights"])).max() > ATOL_WORKERS:
                fails.append(f"{label} {way}: worker {i}'s weights differ from worker 0's by "
                             f"{np.abs(got - np.asarray(workers[0][way]['weights'])).max():.2g}")
                continue
            err = float(np.abs(got - want).max())
            if not np.isfinite(err) or err > ATOL:
                fails.append(f"{label} {way}: weights {err:.2g} off one process's "
                             f"({_ratio(got, want, expected['init']):.2f}x its update)")
                break
            for name, values in expected[way]["history"].items():
                have = w[way]["history"].get(name)
                if have is None or len(have) != len(values):
                    fails.append(f"{label} {way}: {len(have or [])} {name} values, one process {len(values)}")
                    break
                off = np.abs(np.asarray(have) - np.asarray(values))
                if not np.isfinite(off).all() or off.max() > ATOL:
                    k = int(np.argmax(np.where(np.isfinite(off), off, np.inf)))
                    fails.append(f"{label} {way}: {name} {have[k]:.4f} where one process has {values[k]:.4f} "
                                 f"({'epoch' if way != 'train_on_batch' else 'step'} {k + 1})")
                    break
            if way == "fit":
                for name, value in expected[way]["evaluate"].items():
                    if abs(w[way]["evaluate"].get(name, float("nan")) - value) > ATOL or \
                            np.isnan(w[way]["evaluate"].get(name, float("nan"))):
                        fails.append(f"{label} evaluate: {name} {w[way]['evaluate'].get(name, float('nan')):.4f} on "
                                     f"worker {i}, one process {value:.4f}")
                        break
                if w[way]["predict_rows"] != TEST or w[way]["predict_error"] > ATOL:
                    fails.append(f"{label} predict: {w[way]['predict_rows']} rows of {TEST}, "
                                 f"error {w[way]['predict_error']:.2g} on worker {i}")
            if fails:
                break
    return fails


@contextlib.contextmanager
def mlflow_server(server_python: str, root: str):
    """A real ``mlflow server`` (sqlite store) on loopback from the virtualenv of ``server_python``; yields its URL."""
    import socket

    with socket.socket() as s:  # a free loopback port (the server binds it with SO_REUSEADDR)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    mlflow_bin = os.path.join(os.path.dirname(server_python), "mlflow")
    log = open(os.path.join(root, "server.log"), "wb")
    proc = subprocess.Popen([mlflow_bin, "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
                             "--artifacts-destination", f"{root}/artifacts", "--host", "127.0.0.1", "--port",
                             str(port), "--workers", "1"], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                lines = [ln for ln in open(os.path.join(root, "server.log")).read().splitlines() if ln.strip()]
                raise RuntimeError(f"mlflow server did not start: {lines[-1] if lines else 'no output'}")
            time.sleep(0.5)
        yield url
    finally:
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def check_mlflow(url: str, expected: dict) -> list[str]:
    import mlflow

    client = mlflow.MlflowClient(url)
    exp = client.get_experiment_by_name("tfnb-matrix")
    if exp is None:
        return ["mlflow: no experiment tfnb-matrix on the server"]
    runs = client.search_runs([exp.experiment_id])
    if len(runs) != 1:
        return [f"mlflow: {len(runs)} runs in tfnb-matrix, want 1"]
    run = runs[0]
    fails = []
    if run.info.status != "FINISHED" or run.data.params.get("num_workers") != "2":
        fails.append(f"mlflow: run {run.info.status}, params {dict(run.data.params)}")
    points = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss")}
    want = dict(enumerate(expected["fit"]["history"]["loss"]))
    if sorted(points) != sorted(want) or any(abs(points[s] - want[s]) > ATOL for s in want):
        fails.append(f"mlflow: loss points {points}, one process {want}")
    return fails


def versions(legacy: bool) -> dict:
    import importlib.metadata as md
    import platform

    out = {"python": platform.python_version()}
    for dist in ("tensorflow", "keras", "pyspark", "tf-keras", "mlflow-skinny", "mlflow", "numpy"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[dist] = md.version(dist)
    with contextlib.suppress(Exception):  # the Keras on the path (an overlay wins over the installed one)
        import keras

        out["keras"] = getattr(keras, "__version__", "tf-keras")
    out["legacy"] = legacy
    return out


def plain(legacy: bool) -> dict:
    """Keras alone under MirroredStrategy over 2 logical CPUs, one process: no tfnb anywhere. One step each way, so
    the ratio of the updates is the factor Keras is off by."""
    global ROWS, EPOCHS
    ROWS, EPOCHS = BATCH, 1
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    keras = _keras(legacy)
    assert "tfnb" not in sys.modules
    expected = train_three_ways(keras, tf, tf.distribute.get_strategy(), legacy=legacy)
    got = train_three_ways(keras, tf, tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), legacy=legacy)
    fails = compare([got], expected, "plain MirroredStrategy, 2 replicas")
    return {"checks": ["plain, one step: " + ", ".join(WAYS)], "fails": fails}


def with_tfnb(worker_counts, legacy: bool, mlflow_python: str | None) -> dict:
    import tensorflow as tf
    from pyspark.sql import SparkSession

    import tfnb

    keras = _keras(legacy)
    expected = train_three_ways(keras, tf, tf.distribute.get_strategy(), legacy=legacy)
    checks, fails = [], []
    root = tempfile.mkdtemp(prefix="tfnb-matrix-")
    for n in worker_counts:
        spark = (SparkSession.builder.master(f"local[{n}]").appName(f"tfnb-matrix-{n}")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        try:
            model_dir = os.path.join(root, f"w{n}")
            os.makedirs(model_dir)
            opts = {}
            server = contextlib.nullcontext()
            if mlflow_python and n == worker_counts[0]:
                os.makedirs(os.path.join(root, "mlflow"))
                server = mlflow_server(mlflow_python, os.path.join(root, "mlflow"))
            with server as url:
                if url:
                    os.environ["MLFLOW_TRACKING_URI"] = url
                    opts["mlflow"] = {"experiment": "tfnb-matrix"}
                tfnb.run(train_fn, num_workers=n, args=(legacy,), spark=spark, model_dir=model_dir, display=False,
                         timeout=900, legacy_keras=True if legacy else None, **opts)
                workers = []
                for i in range(n):
                    with open(os.path.join(model_dir, f"check-{i}.json")) as f:
                        workers.append(json.load(f))
                fails += compare(workers, expected, f"{n} workers")
                checks.append(f"{n} workers: " + ", ".join(WAYS) + ", evaluate, predict")
                if url:
                    fails += check_mlflow(url, expected)
                    checks.append("MLflow " + versions(legacy).get("mlflow-skinny", versions(legacy).get("mlflow", "?"))
                                  + " server run")
        finally:
            spark.stop()
    shutil.rmtree(root, ignore_errors=True)
    return {"checks": checks, "fails": fails}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", default="2,4", help="worker counts, comma separated (default 2,4)")
    p.add_argument("--legacy", action="store_true", help="tf.keras as tf-keras (tfnb.run legacy_keras=True)")
    p.add_argument("--plain", action="store_true", help="Keras alone under MirroredStrategy, no tfnb")
    p.add_argument("--mlflow", metavar="SERVER_PYTHON", help="also log the first run to an mlflow server "
                   "started from this virtualenv's python")
    a = p.parse_args(argv)
    if a.legacy:
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    start = time.monotonic()
    try:
        if a.plain:
            result = plain(a.legacy)
        else:
            result = with_tfnb([int(n) for n in a.workers.split(",")], a.legacy, a.mlflow)
        reason = "; ".join(result["fails"])
    except BaseException as e:  # noqa: BLE001 - a crash is the cell's result
        traceback.print_exc()
        result = {"checks": []}
        last = [ln for ln in traceback.format_exception_only(type(e), e)[-1].strip().splitlines() if ln.strip()]
        reason = f"crashed: {last[0][:400] if last else type(e).__name__}"
    out = {"ok": not reason, "checks": result["checks"], "reason": reason, "versions": versions(a.legacy),
           "seconds": round(time.monotonic() - start)}
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
