"""The front door as a Databricks user meets it: import ``dbc/tfnb.dbc``, attach a cluster, Run All. On two
simulated runtimes (tests/dbsim: Runtime 15.4 LTS ML with Spark 3.5.0 and TensorFlow 2.16.1; a Spark 4.0
runtime without TensorFlow on a Unity Catalog workspace with no DBFS root), each notebook of the committed
archive runs in its own fresh Python process, top to bottom, once, with nothing of tfnb installed beforehand;
what the README's three steps promise is what is checked: training on the digits, an evaluator that saw every
checkpoint, TensorBoard serving the synced logs. Also the messages a user meets when a volume is missing."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import dbsim

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


def _run_all(cluster: dbsim.Cluster, params: dict) -> dict[str, dbsim.NotebookResult]:
    results = {}
    for name in ORDER:
        results[name] = cluster.run(ARCHIVE, name, params={**params, **SWEEP} if name == "06_sweep" else params).check()
        assert not results[name].restarts, f"{name} restarted Python: {results[name].restarts}"
        ran = [c.index for c in results[name].commands]
        assert len(ran) == len(set(ran)), f"{name} ran a command twice: {ran}"
    return results


def _check_the_run(cluster: dbsim.Cluster, results: dict, wheel_dir: str) -> None:
    # the first notebook that needs tfnb installed it from the archive's wheel, where executors read it
    install = results["01_data_ingest"].command("tfnb_install(")
    assert "tfnb is not installed; installing from the wheel this archive carries (archive)" in install.stdout
    assert f"installing {wheel_dir}/tfnb-" in install.stdout and "tfnb 0.1.0 ready" in install.stdout
    assert list(cluster.host_path(wheel_dir).glob("tfnb-*.whl"))
    run_dir = _found(r"run dir: (\S+)", results["00_constants"].stdout).group(1)
    train = results["03_train"].stdout
    assert float(_found(r"final training accuracy: ([0-9.]+) after 8 epochs", train).group(1)) >= 0.9
    assert "[worker 1]" in train and "staged" in train  # the workers' lines reached the cell
    evaluate = results["04_evaluate"].stdout
    assert float(_found(r"validation accuracy ([0-9.]+)", evaluate).group(1)) >= 0.9
    evaluated = _found(r"evaluated (\d+) checkpoints: (.*)", evaluate).group(2).split(", ")
    written = sorted(p.name for p in cluster.host_path(f"{run_dir}/model").glob("ckpt-*"))
    assert sorted(evaluated) == written == sorted(f"ckpt-{e}.weights.h5" for e in range(1, 9)), (evaluated, written)
    served = _found(r"TensorBoard serves runs: (.*)", results["05_tensorboard"].stdout).group(1).split(", ")
    assert "eval" in served and any(r.startswith("train") for r in served), served
    sweep = results["06_sweep"].stdout
    assert float(_found(r"best validation accuracy ([0-9.]+) \(trial", sweep).group(1)) > 0.5, sweep[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_runtime_15_4_ml_import_attach_run_all():
    with dbsim.cluster(dbsim.RUNTIME_A) as cluster:
        results = _run_all(cluster, {})
        # the runtime's TensorFlow 2.16.1 (Keras 3.3.3) stays: the install cell adds tfnb alone
        assert "missing" not in results["03_train"].command("tfnb_install(").stdout
        assert WIDGETS <= set(results["00_constants"].widgets)  # a user sees the parameters as widgets
        _check_the_run(cluster, results, "/dbfs/tmp/tfnb/wheels")


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_spark_4_runtime_without_tensorflow_needs_a_volume_then_runs_all():
    with dbsim.cluster(dbsim.RUNTIME_B) as cluster:
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
        # with the volume as a job parameter, every notebook runs; TensorFlow comes with the install cell
        results = _run_all(cluster, {"VOLUME": "main.default.tfnb"})
        brought = results["03_train"].command("tfnb_install(").stdout
        assert "tensorflow>=2.16, tensorboard>=2.16 missing" in brought
        _check_the_run(cluster, results, "/Volumes/main/default/tfnb/tfnb/wheels")
