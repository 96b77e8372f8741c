"""tfnb.sweep on a real cluster (local-cluster[2,1,1024]: two executor JVMs, two task slots), one session for the
module. The trials are custom loops without TensorFlow that report each epoch with ``ctx.report``
(tests/sweep_trials.py): this module tests the sweep (packing, pruning, failures, cancel, MLflow, the display),
not training. The same error in a row stopping the sweep, its message different in every trial (the sweep's own study
spreading the trials that run at once: constant liar); Ctrl-C cancelling every running trial (the leak check of
every test then finds no process left); a trial that loses an executor failing alone while the sweep goes on, under
the caller's MLflow run, which a later sweep leaves alone; eight trials two at a time with a median pruner, one
failing on its hyperparameters while the sweep goes on, tracked in a real MLflow server (one parent, a child per
trial, the best tagged with its model) and resumed from an Optuna study in sqlite by a later sweep of two workers
per trial. The console and the notebook panel are fed the events of the tracked sweep."""
from __future__ import annotations

import os
import re

import pytest

import tfnb
from conftest import spark_session
from sweep_trials import TRIALS, fit_trial, index_bug, lose_executor, slow_epochs, two_workers
from test_mlflow import mlflow_server  # noqa: F401 - the real tracking server, as a fixture of this module

optuna = pytest.importorskip("optuna", reason="optuna not installed: pip install 'tfnb[sweep]'")
mlflow = pytest.importorskip("mlflow", reason="mlflow-skinny not installed: pip install 'tfnb[mlflow]'")

NO_TF = dict(preimport=(), timeout=300)  # trials that never import TensorFlow (forked from a standby without it)


@pytest.fixture(scope="module")
def cluster(mlflow_server):
    """The module's cluster. The MLflow server starts first and is not waited for here: it boots while the cluster
    starts and the first tests run; the sweep tracked in it comes last."""
    return spark_session("local-cluster[2,1,1024]")


class Recorder(list):
    """A sweep display that keeps every event; ``on`` may act on each one (here: be the user pressing stop)."""

    def __init__(self, on=None):
        super().__init__()
        self.on = on

    def __call__(self, event):
        self.append(event)
        if self.on is not None:
            self.on(self, event)


# ---------------------------------------------------------------- the same error in a row


def test_the_same_error_in_a_row_stops_the_sweep(cluster, monkeypatch):
    class Optuna4TPE(optuna.samplers.TPESampler):  # Optuna < 5's default: TPESampler() without constant_liar
        def __init__(self, *, constant_liar=False, **kwargs):
            super().__init__(constant_liar=constant_liar, **kwargs)

    monkeypatch.setattr(optuna.samplers, "TPESampler", Optuna4TPE)
    # the same bug in every trial, its message naming another index each time: the same error all the same
    with pytest.raises(tfnb.SweepStoppedError) as info:
        tfnb.sweep(index_bug, {"i": (0, 10**6)}, n_trials=8, num_workers=1, spark=cluster, display=False, **NO_TF)
    e = info.value
    first = str(e).splitlines()[0]
    assert re.match(r"tfnb\.sweep stopped: trials \d, \d, \d failed in a row with the same error, a bug in train_fn "
                    "rather than a bad hyperparameter; fix it", first) and len(first) <= 200, first
    assert re.search(r"IndexError: index \d+ is out of bounds for axis 0 with size 3", str(e)), str(e)
    assert isinstance(e.__cause__, tfnb.WorkerError) and "index_bug" in e.__cause__.worker_traceback
    failed = [t for t in e.result.trials if t.state == "failed"]
    assert len(failed) >= 3 and len(e.result.trials) <= 4  # nothing started after the third failure
    assert len({t.error for t in failed}) == len(failed)  # each said something else
    assert all(t.state in ("failed", "cancelled") for t in e.result.trials)
    # two trials ran at once: the study's sampler counts the running one (constant liar), not a duplicate of it
    assert e.result.study.sampler._constant_liar is True


# ---------------------------------------------------------------- Ctrl-C


def test_interrupting_the_sweep_cancels_every_running_trial(cluster):
    def press_stop(events, event):
        rows = {e.trial.number: e.trial for e in events if e.trial is not None}
        if len([r for r in rows.values() if r.epoch and not r.done]) == 2:  # both slots busy training
            raise KeyboardInterrupt

    with pytest.raises(tfnb.SweepCancelledError) as info:
        tfnb.sweep(slow_epochs, {"x": (1.0, 2.0)}, n_trials=6, num_workers=1, spark=cluster,
                   display=Recorder(press_stop), **NO_TF)
    assert isinstance(info.value, KeyboardInterrupt)
    result = info.value.result
    assert [t.state for t in result.trials] == ["cancelled", "cancelled"]
    assert all(t.error == "cancelled: the sweep was interrupted" for t in result.trials)
    assert "running trials cancelled and their processes stopped: 0, 1; 4 not started" in str(info.value)
    assert all(1 <= t.epoch < 60 for t in result.trials)  # stopped mid-way through their 60 epochs
    # no train_fn process is left: the leak check of this test (tests/leakcheck.py) says so at teardown


# ---------------------------------------------------------------- the cluster failing one trial, under the caller's run


def test_a_trial_the_cluster_fails_after_launch_fails_alone(cluster, mlflow_server, monkeypatch, request):
    url, wait = mlflow_server
    wait()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    mlflow.set_tracking_uri(url)
    request.addfinalizer(lambda: mlflow.set_tracking_uri(None))  # a later test in this process has its own server
    study = optuna.create_study(direction="minimize")
    for kill in (1, 0):
        study.enqueue_trial({"kill": kill})
    # trial 0 loses an executor; an elastic trial that needs both (min_workers=2) cannot relaunch: ClusterError
    elastic = dict(NO_TF, min_workers=2, replace_wait=0.5, max_attempts=2)
    with mlflow.start_run(run_name="the caller's run") as outer:
        result = tfnb.sweep(lose_executor, {"kill": [0, 1]}, study=study, n_trials=2, num_workers=2, spark=cluster,
                            mlflow=True, display=False, **elastic)
    assert [t.state for t in result.trials] == ["failed", "complete"], result.trials
    assert "fewer than min_workers=2" in result.trials[0].error and result.stopped is None
    assert result.mlflow_run_id == outer.info.run_id  # the caller's run is the parent ...
    # ... and a later sweep of the study, with no run active, neither reopens nor ends it
    client = mlflow.MlflowClient(url)
    ended = client.get_run(outer.info.run_id).info
    study.enqueue_trial({"kill": 0})
    later = tfnb.sweep(lose_executor, {"kill": [0, 1]}, study=study, n_trials=1, num_workers=2, spark=cluster,
                       mlflow=True, display=False, **elastic)
    assert later.mlflow_run_id not in (None, outer.info.run_id)
    assert client.get_run(later.mlflow_run_id).info.status == "FINISHED"
    after = client.get_run(outer.info.run_id).info
    assert (after.status, after.end_time) == (ended.status, ended.end_time) == ("FINISHED", ended.end_time)


# ---------------------------------------------------------------- eight trials, pruned, failing, in MLflow


def test_eight_trials_two_at_a_time_pruned_failing_tracked_and_resumed(cluster, mlflow_server, tmp_path,
                                                                       monkeypatch):
    url, wait = mlflow_server
    wait()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="digits", storage=storage, direction="minimize",
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=2))
    for lr, units in TRIALS:
        study.enqueue_trial({"learning_rate": lr, "units": units})
    space = {"learning_rate": (1e-3, 100.0, "log"), "units": [8, 16, 32]}
    events = Recorder()
    result = tfnb.sweep(fit_trial, space, study=study, n_trials=8, num_workers=1, metric="loss", spark=cluster,
                        model_dir=str(tmp_path / "sweep"), mlflow="tfnb-sweep", display=events, **NO_TF)

    assert [t.number for t in result.trials] == list(range(8))
    assert events[0].data["at_once"] == 2 and events[0].data["slots_per_trial"] == 1
    bad = result.trials[7]
    assert bad.state == "pruned" and bad.epoch == 1, bad  # cancelled while it lingered after its first epoch
    assert result.count("complete") == 6, result.summary()
    failed = result.trials[3]  # recorded, and the sweep went on
    assert failed.state == "failed" and failed.value is None and result.stopped is None
    assert "ValueError: units=32 does not fit in the worker's memory" in failed.error
    assert study.trials[3].state == optuna.trial.TrialState.FAIL
    assert study.trials[3].user_attrs["tfnb.error"] == failed.error
    best = result.best
    assert best.number == 6 and best.params == {"learning_rate": 0.003, "units": 16}
    assert best.value == pytest.approx(0.0015) and best.curve == ((1, 0.003), (2, 0.0015))
    assert best.model_dir == str(tmp_path / "sweep" / "trial-6")
    assert all(t.log_file and os.path.exists(t.log_file) for t in result.trials)
    assert "units=16 learning_rate=50.0" in open(bad.log_file).read()
    # never more than two trials at once: each trial's start and end, from the rows the display received
    spans = [(t.started, t.started + t.seconds) for t in result.trials]
    assert max(sum(s <= at < e for s, e in spans) for at, _ in spans) <= 2

    client = mlflow.MlflowClient(url)
    parent = client.get_run(result.mlflow_run_id)
    assert parent.info.status == "FINISHED"
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 8
    by_trial = {int(c.data.tags["tfnb.sweep.trial"]): c for c in children}
    assert by_trial[7].info.status == "KILLED" and by_trial[7].data.tags["tfnb.sweep.state"] == "pruned"
    assert by_trial[7].data.params["learning_rate"] == "50.0"
    assert by_trial[3].info.status == "FAILED" and "units=32 does not fit" in by_trial[3].data.tags["tfnb.sweep.error"]
    chosen = by_trial[6]
    assert chosen.info.run_id == best.mlflow_run_id and chosen.data.tags["tfnb.sweep.best"] == "true"
    assert chosen.data.params == {**chosen.data.params, "learning_rate": "0.003", "units": "16", "num_workers": "1"}
    history = client.get_metric_history(chosen.info.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.003), (1, 0.0015)]  # per epoch
    assert chosen.data.metrics["objective"] == pytest.approx(best.value)
    assert parent.data.tags["tfnb.sweep.best_trial"] == "6" and parent.data.tags["tfnb.sweep.best.units"] == "16"
    assert sum(t.data.tags.get("tfnb.sweep.best") == "true" for t in children) == 1
    # the best trial's model, logged once (the other trials' models stay in their model_dir)
    logged = client.download_artifacts(best.mlflow_run_id, "model/model.keras", str(tmp_path / "logged"))
    assert open(logged).read() == "units=16 learning_rate=0.003\n"
    assert chosen.data.tags["tfnb.sweep.model"] == "model.keras" and "tfnb.sweep.model" not in by_trial[5].data.tags

    # a later cell: the study from its storage goes on with two workers per trial, one trial at a time (a trial
    # takes both slots), in the same parent run; its second trial is the new best
    later = optuna.load_study(study_name="digits", storage=storage)
    for lr in (0.002, 0.001):
        later.enqueue_trial({"learning_rate": lr, "units": 8})
    shown = Recorder()
    again = tfnb.sweep(two_workers, space, study=later, n_trials=2, num_workers=2, metric="loss", spark=cluster,
                       mlflow="tfnb-sweep", display=shown, **NO_TF)
    assert shown[0].data["at_once"] == 1 and shown[0].data["slots_per_trial"] == 2
    assert again.mlflow_run_id == result.mlflow_run_id and [t.number for t in again.trials] == [8, 9]
    assert [t.state for t in again.trials] == ["complete", "complete"] and again.best.number == 9
    assert all(t.returned["workers"] == 2 for t in again.trials)
    first, second = again.trials
    assert second.started >= first.started + first.seconds - 0.5  # one after the other
    children = {int(c.data.tags["tfnb.sweep.trial"]): c for c in client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")}
    assert sorted(children) == list(range(10))
    assert children[9].data.tags["tfnb.sweep.best"] == "true" and children[9].data.params["num_workers"] == "2"
    assert "tfnb.sweep.best" not in children[6].data.tags  # the mark moved
    parent = client.get_run(parent.info.run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["tfnb.sweep.best_trial"] == "9"

    _console_and_panel_show_the_sweep(events, result)


def _console_and_panel_show_the_sweep(events, result):
    """The tracked sweep's events, replayed into the console and the notebook panel."""
    import io

    from tfnb.notebook import SweepConsole, SweepPanel

    out = io.StringIO()
    console = SweepConsole(out)
    panel = SweepPanel(refresh_interval=0, chart_interval=3600)  # every event renders; the chart (slow) seldom
    for event in events:
        console(event)
        panel(event)
    panel.close()
    text = out.getvalue()
    assert "[sweep] 8 trials, 2 at a time (1 task slot(s) each on local-cluster[2,1,1024]); minimize loss" in text
    assert "[trial 7] started: learning_rate=50, units=16" in text
    assert "[trial 7] pruned at epoch 1" in text and f"[trial 7] every line: {result.trials[7].log_file}" in text
    assert "[trial 3] failed in" in text and "units=32 does not fit in the worker's memory" in text
    assert "[trial 6] complete: loss=" in text
    assert "units=16 learning_rate=50.0" not in text  # the trials' output stays out of the console
    assert text.rstrip().splitlines()[-1].startswith("[sweep]   7")  # the summary table ends with trial 7
    assert "8/8 trials done" in panel.status.value and "best: trial 6" in panel.status.value
    assert panel.table.value.count("<tr>") == 9 and "pruned" in panel.table.value and "failed" in panel.table.value
    assert "units=16 learning_rate=50.0" in panel.log_text(7)  # one click away, in the trial's own section
    assert len(panel.logs.children) == 8 and panel.logs.selected_index is None  # collapsed
    assert panel.frames >= 1 and panel.chart.value[:4] == b"\x89PNG"
