"""MLflow tracking against a real MLflow tracking server on loopback (``mlflow server``, sqlite backend store,
artifacts proxied by the server into a local folder), run from its own virtualenv: one MLflow run per tfnb.run
(relaunch included) trained on a Spark-managed table (``data=``), one metric point per epoch, params, the model
(with a signature and an input example) registered, loaded back from the registry and predicting like model_dir's,
the Evaluator's metrics in the same run, a dead server not stopping training, the error when MLflow is missing or
older than Databricks Runtime 15.4 LTS ML's, and the notebook's environment left alone. The MLflow 2 of the
Databricks ML runtimes is exercised by tests/test_databricks.py (the simulated 15.4 LTS ML has MLflow 2.13.1).

The server's virtualenv is built once (pip install mlflow, a minute or two) and cached under
~/.cache/tfnb-mlflow-server/<hash of its requirements>."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import tfnb
from components import free_port, need
from environments import MLFLOW_SERVER, mlflow_server_venv

mlflow = pytest.importorskip("mlflow", reason="mlflow-skinny not installed: pip install 'tfnb[mlflow]'")


@contextlib.contextmanager
def tracking_server(root: Path):
    """A real MLflow tracking server on loopback, its store and artifacts under ``root``, started (not yet waited for)
    and stopped with its whole process group at the end. Yields (url, wait)."""
    try:
        venv = mlflow_server_venv()
    except RuntimeError as e:
        need("an MLflow tracking server", False,
             f"pip install {' '.join(MLFLOW_SERVER)} into a virtualenv failed ({e})")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    # tracking only: not the server's job runners (six more processes, for MLflow's GenAI jobs)
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    with open(root / "server.log", "wb") as out:
        proc = subprocess.Popen(
            [venv / "bin" / "mlflow", "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
             "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1"], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def wait():
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            log = (root / "server.log").read_text()[-2000:]
            assert proc.poll() is None, f"mlflow server exited: {log}"
            assert time.monotonic() < deadline, f"mlflow server not up: {log}"
            time.sleep(0.5)

    try:
        yield url, wait
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(3)
        except subprocess.TimeoutExpired:  # uvicorn's graceful shutdown can take a while; the data is throwaway
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """:func:`tracking_server`, for this module's tests."""
    with tracking_server(tmp_path_factory.mktemp("mlflow-server")) as server:
        yield server


@pytest.fixture
def client(mlflow_server, spark, monkeypatch):
    url, wait = mlflow_server
    wait()  # the server started while Spark did
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    return mlflow.MlflowClient(url)


def only_run(client, experiment: str):
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment}"
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def steps(client, run_id: str, key: str) -> dict[int, float]:
    history = client.get_metric_history(run_id, key)
    points = [m.step for m in history]
    assert len(points) == len(set(points)), f"{key}: more than one point per step: {points}"
    return {m.step: m.value for m in history}


# ---------------------------------------------------------------- a real Keras run, with the Evaluator


def fit_save(ctx, epochs):
    """tf-keras under MultiWorkerMirroredStrategy on the rows of ``data=`` (a table), ckpt-{epoch} weights and the
    chief's model.keras in model_dir."""
    import tempfile

    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                     tf.keras.layers.Dense(1, activation="sigmoid")])
        model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    ckpt = tf.keras.callbacks.ModelCheckpoint(os.path.join(ctx.model_dir, "ckpt-{epoch}"), save_weights_only=True)
    model.fit(ctx.dataset(16, label_col="y", strategy=strategy), epochs=epochs, steps_per_epoch=ctx.steps_per_epoch(16),
              verbose=0, callbacks=[ctx.progress_callback(batch_size=16), ckpt])
    # every worker saves (the variables are synchronised); only the chief's copy lands in model_dir
    where = ctx.model_dir if ctx.is_chief else tempfile.mkdtemp()
    model.save(os.path.join(where, "model.keras"))
    return ctx.attempt


def model_fn():
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(1, activation="sigmoid")])
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    return model


def val_data():
    import numpy as np

    x = np.random.default_rng(7).normal(size=(64, 8)).astype("float32")
    return x, (x.sum(axis=1) > 0).astype("float32")


@pytest.fixture
def table(spark, tmp_path):
    """A Spark-managed table of 256 rows (``x``: 8 floats, ``y``: 0/1), in a database of its own under tmp_path."""
    import numpy as np

    x = np.random.default_rng(3).normal(size=(256, 8)).astype("float32")
    rows = [(v.tolist(), float(v.sum() > 0)) for v in x]
    spark.sql(f"CREATE DATABASE tfnb_mlflow LOCATION '{tmp_path / 'warehouse'}'")
    try:
        spark.createDataFrame(rows, "x array<float>, y double").write.saveAsTable("tfnb_mlflow.rows")
        yield "tfnb_mlflow.rows"
    finally:
        spark.sql("DROP DATABASE tfnb_mlflow CASCADE")


def test_table_to_registered_model_with_epochs_params_and_eval(spark, client, table, tmp_path, no_orphans):
    """A table in (data=), one MLflow run out with the epochs, the Evaluator's results and the model, which carries
    a signature and an input example and is registered; loaded from the registry, it predicts like model_dir's."""
    import numpy as np

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    df = spark.read.table(table)
    example = np.array([r.x for r in df.limit(3).collect()], dtype="float32")
    ev = tfnb.Evaluator(model_fn, val_data, str(model_dir), str(tmp_path / "tb"), interval=0.5, export_format="keras",
                        export_dir=str(tmp_path / "export"), mlflow=True).start()
    assert tfnb.run(fit_save, num_workers=2, args=(3,), spark=spark, model_dir=str(model_dir), display=False,
                    timeout=600, data=df, mlflow={"experiment": "tfnb-keras", "registered_model_name": "tfnb-digits",
                                                  "input_example": example}) == 1
    ev.join(120)

    run = only_run(client, "tfnb-keras")
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["num_workers"] == "2" and params["num_ps"] == "0" and params["args.0"] == "3"
    assert params["spark.master"] == "local[2]" and params["spark.app.id"] == spark.sparkContext.applicationId
    assert params["model_dir"] == str(model_dir) and "max_attempts" in params
    assert run.data.tags["tfnb.state"] == "succeeded" and run.data.tags["tfnb.attempt"] == "1"
    # one point per epoch, step = Keras' 0-based epoch; values are the chief's epoch-end logs
    for key in ("loss", "accuracy", "steps_per_sec", "examples_per_sec"):
        assert sorted(steps(client, run.info.run_id, key)) == [0, 1, 2], key
    assert all(0 < v < 5 for v in steps(client, run.info.run_id, "loss").values())
    # the Evaluator found the run through model_dir and logged each checkpoint at the same steps
    assert sorted(steps(client, run.info.run_id, "eval_loss")) == [0, 1, 2]
    best = ev.best
    assert run.data.tags["tfnb.eval.best_step"] == str(best.step)
    assert run.data.tags["tfnb.eval.best_checkpoint"] == best.checkpoint

    # the model: MLflow's TensorFlow flavour with a signature and the input example, registered as version 1;
    # loaded from the registry it predicts like model_dir's model.keras
    import tensorflow as tf
    from mlflow import tensorflow as mlflow_tensorflow

    assert run.data.tags["tfnb.model.registered"] == "models:/tfnb-digits/1"
    info = mlflow.models.get_model_info(run.data.tags["tfnb.model.uri"])
    assert "tensorflow" in info.flavors and list(info.signature.inputs.inputs[0].shape) == [-1, 8]
    assert info.saved_input_example_info is not None
    version = client.get_model_version("tfnb-digits", "1")
    assert version.run_id == run.info.run_id and version.status == "READY"
    logged = mlflow_tensorflow.load_model("models:/tfnb-digits/1")
    saved = tf.keras.models.load_model(model_dir / "model.keras")
    x = val_data()[0]
    np.testing.assert_allclose(logged.predict(x, verbose=0), saved.predict(x, verbose=0), rtol=1e-6)
    served = mlflow.pyfunc.load_model("models:/tfnb-digits/1").predict(example)  # as a serving endpoint would
    np.testing.assert_allclose(np.asarray(served).reshape(-1), saved.predict(example, verbose=0).reshape(-1),
                               rtol=1e-6)
    # the Evaluator's best model, exported and logged to the same run
    (tmp_path / "dl").mkdir()  # MLflow 2 wants it there
    best_file = client.download_artifacts(run.info.run_id, "best_model/best.keras", str(tmp_path / "dl"))
    np.testing.assert_allclose(tf.keras.models.load_model(best_file).predict(x, verbose=0),
                               tf.keras.models.load_model(tmp_path / "export" / "best.keras").predict(x, verbose=0),
                               rtol=1e-6)


# ---------------------------------------------------------------- a Keras 3 model in model_dir


def finish(ctx):
    return ctx.attempt


def test_keras3_model_in_model_dir_is_logged_in_the_keras_flavour(spark, client, tmp_path, no_tensorflow, no_orphans):
    """What a Keras 3 train_fn leaves (model.save(model_dir + "/model.keras"), here saved by this process) is logged
    as an MLflow model of the keras flavour that loads back, requiring keras, with its input example and the signature
    MLflow infers from it; a newer weights file is not the model."""
    import importlib.metadata

    import keras
    import numpy as np

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile("adam", "binary_crossentropy")
    model.save(model_dir / "model.keras")
    os.utime(model_dir / "model.keras", (time.time() - 60,) * 2)
    model.save_weights(model_dir / "ckpt-1.weights.h5")  # a checkpoint written after it: weights, not a model
    example = val_data()[0][:3]
    assert tfnb.run(finish, num_workers=2, spark=spark, model_dir=str(model_dir), display=False, timeout=300,
                    mlflow={"experiment": "tfnb-keras3", "input_example": example}) == 1

    run = only_run(client, "tfnb-keras3")
    uri = f"runs:/{run.info.run_id}/model"
    info = mlflow.models.get_model_info(uri)
    assert "keras" in info.flavors and info.saved_input_example_info is not None
    assert [list(s.shape) for s in (info.signature.inputs.inputs + info.signature.outputs.inputs)] == [[-1, 8], [-1, 1]]
    # MLflow 3: a LoggedModel of the run; MLflow 2: the run's artifact
    logged_as = run.data.tags["tfnb.model.uri"]
    if mlflow.__version__.startswith("2."):
        assert logged_as == uri
    else:
        (found,) = client.search_logged_models(experiment_ids=[run.info.experiment_id])
        assert logged_as == found.model_uri and found.source_run_id == run.info.run_id and found.name == "model"
    assert "tfnb.model.registered" not in run.data.tags
    requirements = Path(mlflow.pyfunc.get_model_dependencies(uri)).read_text().split()
    assert f"keras=={importlib.metadata.version('keras')}" in requirements and not any(
        r.startswith("tf-keras") for r in requirements)
    logged = mlflow.keras.load_model(uri)
    x = val_data()[0]
    assert type(logged).__module__.startswith("keras.")
    np.testing.assert_allclose(logged.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)


# ---------------------------------------------------------------- relaunch, active run, failures (no TensorFlow)


def epochs_then_die(ctx, epochs, die_in_attempt):
    """Epoch ends reported like ctx.progress_callback() does, in lock step like a collective, with the chief
    checkpointing the finished epoch count; worker 1 dies after epoch 0 of attempt ``die_in_attempt``."""
    import json as _json
    import time as _time

    folder = Path(ctx.model_dir)
    done = folder / "done.json"
    for epoch in range(_json.loads(done.read_text()) if done.exists() else 0, epochs):
        # no task starts an epoch before every peer has (a peer that died blocks the rest, as in all-reduce)
        (folder / f"at-{ctx.attempt}-{epoch}-{ctx.task_index}").touch()
        while not all((folder / f"at-{ctx.attempt}-{epoch}-{i}").exists() for i in range(ctx.num_workers)):
            _time.sleep(0.05)
        _time.sleep(0.2)
        ctx.report(epoch=epoch + 1, epochs=epochs, epoch_end=True, loss=1.0 / (epoch + 1), accuracy=0.5)
        if ctx.is_chief:
            done.write_text(_json.dumps(epoch + 1))
        if ctx.attempt == die_in_attempt and ctx.task_index == 1 and epoch == 0:
            while not done.exists():  # dies once the chief has checkpointed the epoch, so it is not run again
                _time.sleep(0.05)
            os._exit(7)
    return ctx.attempt


@pytest.fixture
def no_tensorflow(monkeypatch):
    monkeypatch.setenv("TFNB_PREIMPORT", "")
    monkeypatch.setenv("TFNB_WARM", "0")
    monkeypatch.setenv("TFNB_FAILURE_GRACE", "1")


def test_relaunch_is_recorded_in_the_same_single_run(spark, client, tmp_path, no_tensorflow, no_orphans):
    attempt = tfnb.run(epochs_then_die, num_workers=2, args=(3, 1), spark=spark, model_dir=str(tmp_path),
                       max_attempts=2, display=False, timeout=300, mlflow="tfnb-relaunch", cpus_per_worker=1,
                       env={"AWS_SECRET_ACCESS_KEY": "hunter2-secret"})
    assert attempt == 2
    run = only_run(client, "tfnb-relaunch")
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["tfnb.attempt"] == "2" and tags["tfnb.state"] == "succeeded"
    assert "worker 1's train_fn process exited with code 7" in tags["tfnb.relaunch.2"]
    assert steps(client, run.info.run_id, "loss") == {0: 1.0, 1: 0.5, 2: pytest.approx(1 / 3)}
    # the resource options: as given, else what the session's conf gives every task (no GPU here)
    params = run.data.params
    assert (params["cpus_per_worker"], params["gpus_per_worker"], params["ps_placement"]) == ("1", "0", "executors")
    logged = json.dumps([run.data.params, run.data.tags])
    assert "hunter2" not in logged and "AWS_SECRET" not in logged  # env values are often credentials


def test_active_run_is_used_and_left_open(spark, client, tmp_path, no_tensorflow, no_orphans):
    experiment_id = client.create_experiment("tfnb-active")
    with mlflow.start_run(experiment_id=experiment_id) as outer:
        tfnb.run(epochs_then_die, num_workers=2, args=(2, 0), spark=spark, model_dir=str(tmp_path),
                 display=False, timeout=300, mlflow=True)
        assert client.get_run(outer.info.run_id).info.status == "RUNNING"
    run = only_run(client, "tfnb-active")
    assert run.info.run_id == outer.info.run_id and run.data.params["num_workers"] == "2"
    assert sorted(steps(client, run.info.run_id, "loss")) == [0, 1]


def test_failed_run_ends_failed_and_a_dead_server_does_not_stop_training(spark, client, tmp_path, no_tensorflow,
                                                                         monkeypatch, caplog, no_orphans):
    def boom(ctx):
        raise ValueError("bad data in shard 3")

    with pytest.raises(tfnb.WorkerError):
        tfnb.run(boom, num_workers=2, spark=spark, display=False, timeout=300, mlflow="tfnb-failed")
    run = only_run(client, "tfnb-failed")
    assert run.info.status == "FAILED" and "ValueError: bad data in shard 3" in run.data.tags["tfnb.error"]

    # nothing listens there: MLflow's own retries off so the failure comes at once
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with caplog.at_level(logging.WARNING, logger="tfnb.monitor.tracking"):
        assert tfnb.run(epochs_then_die, num_workers=2, args=(2, 0), spark=spark, model_dir=str(tmp_path),
                        display=False, timeout=300, mlflow=True) == 1
    warnings = [r.getMessage() for r in caplog.records if r.name == "tfnb.monitor.tracking"]
    assert len(warnings) == 1 and "MLflow tracking of tfnb run" in warnings[0], warnings


# ---------------------------------------------------------------- bad input


def test_missing_mlflow_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed: import mlflow raises ImportError
    with pytest.raises(tfnb.MissingDependencyError, match=r"pip install 'tfnb\[mlflow\]'"):
        tfnb.run(lambda ctx: None, num_workers=2, mlflow=True)
    with pytest.raises(tfnb.MissingDependencyError, match=r"tfnb\[mlflow\]"):
        tfnb.Evaluator(model_fn, val_data, "/tmp/x", "/tmp/y", mlflow="exp")


def test_mlflow_older_than_runtime_15_4_ml_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(mlflow, "__version__", "2.9.2")  # Databricks Runtime 14.3 LTS ML's
    with pytest.raises(tfnb.MissingDependencyError,
                       match=r"MLflow 2.9.2 is too old: tfnb needs MLflow >= 2.13.*Runtime ML 15.4 LTS or later"):
        tfnb.run(lambda ctx: None, num_workers=2, mlflow=True)


@pytest.mark.parametrize("value", [1, "", "  ", ["exp"]])
def test_bad_mlflow_value_is_refused(value):
    with pytest.raises(tfnb.ConfigError, match="mlflow=.* must be True .* an experiment name"):
        tfnb.run(lambda ctx: None, num_workers=2, mlflow=value)


@pytest.mark.parametrize("value, message", [
    ({"experiment": "x", "registered_model": "m"}, "has 'registered_model', which tfnb does not know; its keys are "
                                                   "experiment, registered_model_name, input_example"),
    ({"registered_model_name": ""}, r"mlflow={'registered_model_name': ''} must be a name"),
])
def test_bad_mlflow_settings_are_refused(value, message):
    with pytest.raises(tfnb.ConfigError, match=message):
        tfnb.run(lambda ctx: None, num_workers=2, mlflow=value)


def test_loading_a_model_leaves_the_notebook_environment_alone(tmp_path):
    """The Evaluator and MLflow's model logging import TensorFlow with tf.keras meaning tf-keras (as in the workers)
    without setting TF_USE_LEGACY_KERAS in the notebook's process: its child processes never see it."""
    code = "\n".join([
        "import os, subprocess, sys",
        "from tfnb.monitor.eval_model import EvalModel",
        "from tfnb.monitor.tracking import _load_keras",
        "def model_fn():",
        "    import tensorflow as tf",
        "    m = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(1)])",
        "    m.compile('adam', 'mse')",
        "    return m",
        "import numpy as np",
        "ev = EvalModel(model_fn, lambda: (np.zeros((4, 4), 'float32'), np.zeros((4, 1), 'float32')), None, '')",
        f"ev.prepare({str(tmp_path / 'tb')!r}, {{}})",
        "model = ev._model",
        f"model.save({str(tmp_path / 'm.keras')!r})",
        f"loaded = _load_keras({str(tmp_path / 'm.keras')!r})",
        "child = subprocess.run([sys.executable, '-c', 'import os; print(os.environ.get(\"TF_USE_LEGACY_KERAS\"))'],",
        "                       capture_output=True, text=True).stdout.strip()",
        "print(type(model).__module__.split('.')[0], type(loaded).__module__.split('.')[0],",
        "      os.environ.get('TF_USE_LEGACY_KERAS'), child)",
    ])
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-4:] == ["tf_keras", "tf_keras", "None", "None"], out.stdout
