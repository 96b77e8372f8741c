"""The front door as a Databricks user meets it: import ``dbc/tfnb.dbc``, attach a cluster, Run All. On two
simulated runtimes (tests/dbsim: Runtime 15.4 LTS ML with Spark 3.5.0 and TensorFlow 2.16.1; a Spark 4.0
runtime without TensorFlow on a Unity Catalog workspace with no DBFS root), each notebook of the committed
archive runs in its own fresh Python process, top to bottom, once, with nothing of tfnb installed beforehand;
what the README's three steps promise is what is checked: training on the digits, an evaluator that saw every
checkpoint, TensorBoard serving the synced logs. Both Run Alls track to a real MLflow tracking server (as a
Databricks workspace's MLflow would be; tests/test_mlflow.py's server): the runtimes' own MLflow (2.13.1 on 15.4 LTS
ML, 3.0.1 on the Spark 4 runtime) logs the training, the sweep's parent and child runs and the models; 03_train trains
on the digits table 01_data_ingest wrote, registers its model in the server's registry, loads it back and predicts.
Also the messages a user meets when a volume is missing."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import dbsim
from test_mlflow import tracking_server

ROOT = Path(__file__).resolve().parent.parent
ARCHIVE = ROOT / "dbc" / "tfnb.dbc"
ORDER = ["00_constants", "01_data_ingest", "02_model", "03_train", "04_evaluate", "05_tensorboard", "06_sweep"]
SWEEP = {"SWEEP_TRIALS": "2", "SWEEP_EPOCHS": "1"}  # a small search: two one-epoch trials, side by side
WIDGETS = {"RUN_NAME", "NUM_WORKERS", "FRESH_RUN", "EPOCHS", "BATCH_SIZE", "LEARNING_RATE", "VOLUME", "BASE_DIR",
           "DATA_URL", "S3_ENDPOINT_URL", "SYNC_INTERVAL", "EVAL_INTERVAL"}


def _found(pattern: str, text: str) -> re.Match:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in:\n{text[-3000:]}"
    return m


def _run_all(cluster: dbsim.Cluster, params: dict, env: dict) -> dict[str, dbsim.NotebookResult]:
    results = {}
    for name in ORDER:
        results[name] = cluster.run(ARCHIVE, name, params={**params, **SWEEP} if name == "06_sweep" else params,
                                    env=env).check()
        assert not results[name].restarts, f"{name} restarted Python: {results[name].restarts}"
        ran = [c.index for c in results[name].commands]
        assert len(ran) == len(set(ran)), f"{name} ran a command twice: {ran}"
    return results


def _check_the_run(cluster: dbsim.Cluster, results: dict, wheel_dir: str, mlflow_url: str) -> None:
    # the first notebook that needs tfnb installed it from the archive's wheel, where executors read it
    install = results["01_data_ingest"].command("tfnb_install(")
    assert "tfnb is not installed; installing from the wheel this archive carries (archive)" in install.stdout
    assert f"installing {wheel_dir}/tfnb-" in install.stdout and "tfnb 0.1.0 ready" in install.stdout
    assert list(cluster.host_path(wheel_dir).glob("tfnb-*.whl"))
    run_dir = _found(r"run dir: (\S+)", results["00_constants"].stdout).group(1)
    # the user's own run folder, recorded as theirs
    assert run_dir.endswith(f"/{cluster.user}/digits"), run_dir
    assert cluster.host_path(f"{run_dir}/tfnb-owner.txt").read_text() == f"{cluster.user}\n"
    train = results["03_train"].stdout
    assert float(_found(r"final training accuracy: ([0-9.]+) after 8 epochs", train).group(1)) >= 0.9
    assert "[worker 1]" in train and "rows of tfnb_digits" in train  # the workers' lines reached the cell
    # the model the training saved, registered with its signature, loaded back from the registry, predicting
    # the table and the registered model are this user's: names in a namespace the workspace shares
    assert f"rows of tfnb_digits_{re.sub(r'[^0-9a-z_]', '_', cluster.user.lower())}" in train
    registered = _found(r"registered models:/(tfnb_digits_\w+)/(\d+); loaded from the registry it predicts 360 "
                        r"validation rows with accuracy ([0-9.]+)", train)
    assert float(registered.group(3)) >= 0.9
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_url)
    version = client.get_model_version(registered.group(1), registered.group(2))
    run = client.get_run(version.run_id)
    assert run.data.tags["tfnb.state"] == "succeeded" and run.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "accuracy")) == list(range(8))
    evaluate = results["04_evaluate"].stdout
    assert float(_found(r"validation accuracy ([0-9.]+)", evaluate).group(1)) >= 0.9
    evaluated = _found(r"evaluated (\d+) checkpoints: (.*)", evaluate).group(2).split(", ")
    written = sorted(p.name for p in cluster.host_path(f"{run_dir}/model").glob("ckpt-*"))
    assert sorted(evaluated) == written == sorted(f"ckpt-{e}.weights.h5" for e in range(1, 9)), (evaluated, written)
    served = _found(r"TensorBoard serves runs: (.*)", results["05_tensorboard"].stdout).group(1).split(", ")
    assert "eval" in served and any(r.startswith("train") for r in served), served
    sweep = results["06_sweep"].stdout
    assert float(_found(r"best validation accuracy ([0-9.]+) \(trial", sweep).group(1)) > 0.5, sweep[-3000:]
    # the sweep: a parent run with a child run per trial, the best one holding its model; the study in the run dir
    parent, best = _found(r"MLflow parent run (\w+); the best trial's run (\w+) holds its model", sweep).groups()
    children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    assert len(children) == 2 and best in {c.info.run_id for c in children}
    assert client.get_run(best).data.tags["tfnb.sweep.best"] == "true"
    assert _found(r"study kept in (\S+)", sweep).group(1) == f"{run_dir}/sweep/study.db"
    assert cluster.host_path(f"{run_dir}/sweep/study.db").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_runtime_15_4_ml_import_attach_run_all(tmp_path):
    with tracking_server(tmp_path) as (url, wait), dbsim.cluster(dbsim.RUNTIME_A) as cluster:
        wait()
        results = _run_all(cluster, {}, {"MLFLOW_TRACKING_URI": url})
        # the runtime's TensorFlow 2.16.1 (Keras 3.3.3) stays: the install cell adds tfnb alone
        assert "missing" not in results["03_train"].command("tfnb_install(").stdout
        assert WIDGETS <= set(results["00_constants"].widgets)  # a user sees the parameters as widgets
        _check_the_run(cluster, results, f"/dbfs/tmp/tfnb/{cluster.user}/wheels", url)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_spark_4_runtime_without_a_volume_says_how_to_create_one():
    with dbsim.cluster(dbsim.RUNTIME_B, executors=1) as cluster:  # no notebook gets past its set-up to a Spark job
        # a Unity Catalog workspace with no DBFS root and no volume chosen: one message, naming how to create one
        first = cluster.run(ARCHIVE, "01_data_ingest")
        assert first.failure is not None and first.failure.index == 4, first.failure  # the install cell, Cmd 4
        assert "set the VOLUME widget" in first.failure.message
        assert "CREATE VOLUME main.default.tfnb" in first.failure.message
        assert "VOLUME" in first.widgets  # the widget it names is there to fill in
        missing = cluster.run(ARCHIVE, "00_constants")
        assert missing.failure is not None and "CREATE VOLUME main.default.tfnb" in missing.failure.message
        # a volume that does not exist is named as such
        wrong = cluster.run(ARCHIVE, "00_constants", params={"VOLUME": "main.default.nope"})
        assert "Volume main.default.nope (/Volumes/main/default/nope) does not exist" in wrong.failure.message


@pytest.mark.long  # ./dev matrix: the Spark 4 / Python 3.12 / MLflow 3.0 runtime's whole Run All
@pytest.mark.timeout(2400)
def test_spark_4_runtime_without_tensorflow_runs_all_with_a_volume(tmp_path):
    with tracking_server(tmp_path) as (url, wait), dbsim.cluster(dbsim.RUNTIME_B) as cluster:
        # with the volume as a job parameter, every notebook runs; TensorFlow comes with the install cell
        wait()
        results = _run_all(cluster, {"VOLUME": "main.default.tfnb"}, {"MLFLOW_TRACKING_URI": url})
        brought = results["03_train"].command("tfnb_install(").stdout
        assert "tensorflow>=2.16, tensorboard>=2.16 missing" in brought
        _check_the_run(cluster, results, f"/Volumes/main/default/tfnb/tfnb/{cluster.user}/wheels", url)
