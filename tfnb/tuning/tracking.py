"""MLflow for a sweep: one parent run, a child run per trial, the best trial marked and its model logged.

The parent is the caller's active run, else the one an earlier sweep of the study made (its id kept in the study's
user attrs, so a study resumed from storage goes on in it), else a new run. A trial's ``tfnb.run`` logs into its child
run (:func:`tfnb.monitor.tracking.logging_to`); the sweep adds its state, error, objective and duration. As for a
run, MLflow never stops the sweep: the first failing call is reported once and tracking ends for this sweep.
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Mapping

from ..monitor.tracking import _MAX_PARAM, _Link, _experiment_id, _log_model, settings
from .outcomes import SweepResult, TrialResult

PARENT_ATTR = "tfnb.mlflow_run_id"  # in the study's user attrs: the sweep's parent run, for later sweeps of it
_STATUS = {"complete": "FINISHED", "pruned": "KILLED", "cancelled": "KILLED", "failed": "FAILED"}


def _params(values: Mapping[str, Any]) -> dict:
    return {str(k): str(v)[:_MAX_PARAM] for k, v in values.items() if v is not None}


class SweepTracker:
    """The sweep's parent run (made or reopened on the sweep's thread) and its trials' child runs."""

    def __init__(self, experiment: Any, study, params: Mapping[str, Any]):
        import mlflow

        self.mlflow, self.mlflow_option = mlflow, experiment
        self.client = mlflow.MlflowClient()
        self.link = _Link(f"tfnb sweep {study.study_name}")
        self.study, self.best_run = study, None  # best_run: the child an earlier sweep tagged best
        active = mlflow.active_run()  # the caller's run (MLflow's active run is per thread)
        run = active or self._reopen(study.user_attrs.get(PARENT_ATTR)) or self.link.call(
            mlflow.start_run, experiment_id=self.link.call(_experiment_id, self.client, experiment),
            run_name=f"sweep {study.study_name}", tags={"tfnb.sweep.study": study.study_name})
        self.run_id, self.experiment_id = (run.info.run_id, run.info.experiment_id) if run else (None, None)
        self.link.run_id, self.link.own = self.run_id, active is None and run is not None
        if self.run_id is None:
            return
        if active is None:  # a later sweep reopens (and ends) only a parent a sweep started, never the caller's run
            study.set_user_attr(PARENT_ATTR, self.run_id)
        have = self.link.call(lambda: self.client.get_run(self.run_id).data)
        given = {k: v for k, v in _params(params).items() if k not in (have.params if have else {})}
        self.link.log(mlflow, params=given, tags={"tfnb.sweep.study": study.study_name, "tfnb.sweep.state": "running"})
        self.best_run = have.tags.get("tfnb.sweep.best_run_id") if have else None

    def _reopen(self, run_id: str | None):
        """The parent an earlier sweep of the study made, made active on this thread again; None if gone."""
        with contextlib.suppress(Exception):  # another tracking server's run, or gone: the sweep makes a new parent
            if run_id and self.client.get_run(run_id).info.lifecycle_stage == "active":  # not deleted since
                return self.link.call(self.mlflow.start_run, run_id=run_id)
        return None

    def child(self, number: int, params: Mapping[str, Any]) -> str | None:
        """Make trial ``number``'s child run (on the trial's thread); its id, None when tracking is off."""
        from mlflow.entities import Param

        if self.run_id is None or self.link.broken:
            return None
        run = self.link.call(self.client.create_run, self.experiment_id, run_name=f"trial-{number}",
                             tags={"mlflow.parentRunId": self.run_id, "tfnb.sweep.trial": str(number)})
        if run is None:
            return None
        self.link.call(self.client.log_batch, run.info.run_id, params=[Param(k, v) for k, v in _params(params).items()])
        return run.info.run_id

    def trial_ended(self, row: TrialResult, metric: str) -> None:
        """Log a finished trial into its child run and end it; the study's best value so far into the parent."""
        from mlflow.entities import Metric, RunTag

        best = None
        with contextlib.suppress(Exception):  # no complete trial yet (ValueError), or a storage that cannot say
            best = self.study.best_value
        stamp, run_id = int(time.time() * 1000), row.mlflow_run_id
        if run_id is not None:
            metrics = [Metric("trial_seconds", round(row.seconds, 3), stamp, 0)]
            if row.value is not None and math.isfinite(row.value):
                metrics.append(Metric("objective", row.value, stamp, 0))
            tags = [RunTag("tfnb.sweep.state", row.state)] + ([RunTag("tfnb.sweep.error", row.error[:5000])]
                                                               if row.error else [])
            self.link.call(self.client.log_batch, run_id, metrics=metrics, tags=tags)
            self.link.call(self.client.set_terminated, run_id, _STATUS.get(row.state, "FAILED"))
        if self.run_id is not None and best is not None:  # step: the trial's number
            self.link.call(self.client.log_batch, self.run_id,
                           metrics=[Metric(f"best_{metric}", best, stamp, row.number)])

    def finish(self, result: SweepResult, state: str) -> None:
        """Mark the best trial, log its model, end the parent (``state``: finished, stopped or interrupted)."""
        if self.run_id is None:
            return
        best, tags = result.best, {"tfnb.sweep.state": state}
        if best is not None and best.value is not None:
            tags.update({"tfnb.sweep.best_trial": best.number, "tfnb.sweep.best_value": best.value,
                         **{f"tfnb.sweep.best.{k}": v for k, v in best.params.items()}})
            if best.mlflow_run_id:
                tags["tfnb.sweep.best_run_id"] = best.mlflow_run_id
                if self.best_run not in (None, best.mlflow_run_id):
                    self.link.call(self.client.delete_tag, self.best_run, "tfnb.sweep.best")
                self.link.call(self.client.set_tag, best.mlflow_run_id, "tfnb.sweep.best", "true")
                have = self.link.call(lambda: self.client.get_run(best.mlflow_run_id).data.tags) or {}
                if best.model_dir and "tfnb.sweep.model" not in have:  # a resumed sweep's best may have it already
                    given = settings(self.mlflow_option)  # mlflow={"registered_model_name": ...} registers it
                    logged = self.link.call(_log_model, self.mlflow, best.model_dir, best.mlflow_run_id,
                                            given["registered_model_name"], given["input_example"])
                    if logged:
                        self.link.call(self.client.set_tag, best.mlflow_run_id, "tfnb.sweep.model", logged)
        self.link.log(self.mlflow, tags=tags)
        status = {"finished": "FINISHED", "interrupted": "KILLED"}.get(state, "FAILED")
        if self.link.own and self.link.broken:  # the caller's thread must not keep our run active
            with contextlib.suppress(Exception):
                self.mlflow.end_run(status)
        self.link.end(self.mlflow, status)
