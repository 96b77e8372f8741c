"""Keras 3 (``import keras``) under tfnb.run: trains across workers as one process would, with its callbacks, and
corrects Keras only where a defect reproduces (tfnb/_task/keras3.py, docs/keras3.md). The Databricks 15.4 LTS ML
floor (Keras 3.3.3 on TensorFlow 2.16.1, Spark 3.5) runs the same checks in tests/test_runtime_sim.py (./dev matrix)."""
from __future__ import annotations

import numpy as np
import pytest

import tfnb
from tfnb.launcher import EventKind

import keras3_train



def _epoch_ends(seen):
    return [e.data for e in seen if e.kind == EventKind.PROGRESS and e.job_name == "chief" and e.data.get("epoch_end")]


def check_like_one_process(model_dir, num_workers, expected, reported=None):
    """Every worker ended where one process over the same batches ends: weights, history, evaluate, predict."""
    workers = keras3_train.reports(model_dir, num_workers)
    for w in workers:
        np.testing.assert_allclose(w["weights"], workers[0]["weights"], atol=1e-6)  # gradients are all-reduced
        np.testing.assert_allclose(w["weights"], expected["weights"], atol=1e-5)
        for name, values in expected["history"].items():  # a resumed run's history starts at its first epoch
            np.testing.assert_allclose(w["history"][name], values[-len(w["history"][name]):], atol=1e-5, err_msg=name)
        for name, value in expected["evaluate"].items():
            assert w["evaluate"][name] == pytest.approx(value, abs=1e-5), name  # global, the same on every worker
        assert w["predict_rows"] == keras3_train.TEST and w["predict_error"] < 1e-5  # every row, in order
    if reported is not None:  # what tfnb showed per epoch: the global values
        for name in ("loss", "accuracy"):
            assert [r[name] for r in reported] == pytest.approx(expected["history"][name], abs=1e-5), name
    return workers


def test_two_workers_train_as_one_process_through_a_killed_worker(spark, tmp_path, no_orphans):
    """Worker 1 dies after epoch 0's backup; the relaunch restores it on both workers and the run ends exactly where
    one undisturbed process over the same batches ends, with Keras' own callbacks writing the chief's files only."""
    model_dir, log_dir = tmp_path / "model", tmp_path / "logs"
    seen = []
    attempt = tfnb.run(keras3_train.train_fn, num_workers=2, args=(2, 0), spark=spark, model_dir=str(model_dir),
                       log_dir=str(log_dir), display=seen.append, max_attempts=2, timeout=600, profile_steps=(3, 4))
    assert attempt == 2 and len([e for e in seen if e.kind == EventKind.ATTEMPT]) == 1
    expected = keras3_train.one_process(2)
    workers = check_like_one_process(model_dir, 2, expected)
    assert workers[0]["began"] == [1]  # epoch 0's backup was restored on both workers
    # what tfnb showed per epoch is the global value: the first attempt's epoch 1, then the relaunch's epoch 2
    reported = {r["epoch"]: r for r in _epoch_ends(seen)}
    for name in ("loss", "accuracy"):
        assert [reported[e][name] for e in (1, 2)] == pytest.approx(expected["history"][name], abs=1e-5), name
    # each correction applies where its defect reproduces, and retires once corrected: with this Keras (3.15) the
    # defects upstream fixed after 3.3 are not found (the floor's run in test_runtime_sim.py finds and corrects them)
    found = {n for n, yes in workers[0]["probes_before"].items() if yes}
    assert found == {"symbolic-build", "metric-reduction", "backup-and-restore", "model-checkpoint", "tensorboard"}
    assert set(workers[0]["patches"]) == found and not any(workers[0]["probes_after"].values())
    # the chief's files only: one checkpoint per epoch, one event file per attempt, the backup removed at the end
    assert sorted(p.name for p in model_dir.iterdir() if not p.name.startswith(("worker-", "tfnb"))) == \
        ["ckpt-1.weights.h5", "ckpt-2.weights.h5", "model.keras"]
    assert len(list(log_dir.glob("train/events.out.tfevents.*"))) == 2
    assert list(log_dir.glob("plugins/profile/*/chief-0.xplane.pb")), "no profiler trace from Keras 3's fit"
    assert [e for e in seen if e.kind == EventKind.PROGRESS and e.data.get("examples_per_sec")], "no rate reported"
    import keras

    loaded = keras.models.load_model(model_dir / "model.keras")
    np.testing.assert_allclose(keras3_train.flat_weights(loaded), workers[0]["weights"], atol=1e-6)


def test_four_workers_keep_equal_weights_on_fed_data(tmp_path, no_orphans):
    from conftest import spark_session

    spark = spark_session("local[4]")
    x, y = keras3_train.data()
    df = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x[:512], y[:512])],
                               "features array<float>, label long")

    tfnb.run(keras3_train.fed_fn, num_workers=4, data=df, spark=spark, model_dir=str(tmp_path), display=False,
             timeout=600)
    got = keras3_train.reports(tmp_path, 4, "fed")
    for w in got:
        np.testing.assert_allclose(w["weights"], got[0]["weights"], atol=1e-6)
        assert w["evaluate"] == pytest.approx(got[0]["evaluate"], abs=1e-6)


@pytest.mark.long  # ./dev matrix: two whole demo trainings, Keras 3 against tf-keras
def test_the_digits_demo_reaches_the_tf_keras_accuracy(spark, no_orphans):
    """The demo's model (tools/demo.py) on 2 workers, once with Keras 3 and once with tf-keras on the same shards:
    Keras 3's accuracy on the 360 held-out digits is the tf-keras path's, within 0.01, or better."""
    from tools.demo import train_digits

    got = {package: tfnb.run(train_digits, num_workers=2, kwargs={"package": package}, spark=spark,
                             display=False, timeout=600)["accuracy"] for package in ("keras", "tf_keras")}
    assert got["keras"] >= got["tf_keras"] - 0.01 and got["keras"] >= 0.9, got


def test_a_probe_that_cannot_run_applies_a_safe_correction_and_refuses_an_unsafe_one():
    """A probe never reports "not needed" because it failed: the correction is applied where that is safe whatever
    Keras does, else the run stops naming the Keras, the correction and the tested range."""
    from tfnb._task import keras3
    from tfnb.errors import ConfigError

    def broken():
        raise TypeError("_backend_update_step() takes 3 positional arguments but 4 were given")

    applied = []
    safe = keras3.Patch("x", broken, lambda: applied.append("safe"), safe=True)
    assert keras3._apply_if_needed(safe, "3.16.0") and applied == ["safe"]
    unsafe = keras3.Patch("loss-scale", broken, lambda: applied.append("unsafe"))
    with pytest.raises(ConfigError) as caught:
        keras3._apply_if_needed(unsafe, "3.16.0")
    first = str(caught.value).splitlines()[0]
    assert "Keras 3.16.0" in first and "'loss-scale'" in first and "(3.3.3 to 3.15.1)" in first
    assert "_backend_update_step() takes 3" in str(caught.value) and applied == ["safe"]


def test_versions_newer_than_the_tested_ones_are_told_apart_by_their_full_version():
    from tfnb._task.selfcheck import untested

    assert untested({"keras": "3.15.1", "tensorflow": "2.21.0", "spark": "4.3.0"}) == []
    assert untested({"keras": "3.15.2", "tensorflow": "2.21.0rc1", "spark": "4.3.1"}) == [
        "Keras 3.15.2 (tested up to 3.15.1)", "Spark 4.3.1 (tested up to 4.3.0)"]
    assert untested({"keras": "3.16.0.dev2026", "tensorflow": None, "spark": None}) == [
        "Keras 3.16.0.dev2026 (tested up to 3.15.1)"]


def test_every_probe_runs_on_this_keras():
    """No probe fails on the suite's Keras (a failing one would fail closed): each says whether its defect is there."""
    from tfnb._task import keras3

    found = {p.name for p in keras3.PATCHES if p.probe()}
    assert found == {"symbolic-build", "metric-reduction", "backup-and-restore", "model-checkpoint", "tensorboard"}
