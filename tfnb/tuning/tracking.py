"""MLflow for a sweep: one parent run, a child run per trial, the best trial marked and its model logged.

The parent is the MLflow run active where ``tfnb.sweep`` is called, else the run an earlier sweep of the
same study made (its id is kept in the study, ``study.user_attrs["tfnb.mlflow_run_id"]``, so a study with
storage resumed in a later cell goes on in the same parent), else a new run. Each trial's child run
(``mlflow.parentRunId``) is made before its ``tfnb.run`` starts, with the hyperparameters as params;
that run's own tracking (:mod:`tfnb.monitor.tracking`) logs its settings and per-epoch metrics into it;
the sweep adds the trial's state, error, objective and duration and ends it (pruned and cancelled trials
end KILLED). At the end the parent gets the best trial's number, value and params as tags
(``tfnb.sweep.best.*``) and a ``best_<metric>`` point per finished trial; the best child gets the tag
``tfnb.sweep.best=true`` and the model its trial saved in its model_dir (registered when ``mlflow=`` is a dict with
``registered_model_name``, as for a run).

As for a run, MLflow never stops the sweep: the first failing call is reported once as a warning and
tracking ends for this sweep (:class:`tfnb.monitor.tracking._Link`).
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Mapping

from ..monitor.tracking import _MAX_PARAM, _Link, _experiment_id, _log_model, logging_to, settings
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
        self.study = study
        self.best_run: str | None = None  # the child run tagged best before this sweep (an earlier one's)
        active = mlflow.active_run()  # the caller's run (MLflow's active run is per thread)
        self.own = active is None
        run = active or self._reopen(study.user_attrs.get(PARENT_ATTR)) or self.link.call(
            mlflow.start_run, experiment_id=self.link.call(_experiment_id, self.client, experiment),
            run_name=f"sweep {study.study_name}", tags={"tfnb.sweep.study": study.study_name})
        self.run_id = run.info.run_id if run is not None else None
        self.experiment_id = run.info.experiment_id if run is not None else None
        self.link.run_id, self.link.own = self.run_id, self.own and run is not None
        if self.run_id is None:
            return
        if self.own:  # a later sweep reopens (and ends) only a parent a sweep started, never the caller's run
            study.set_user_attr(PARENT_ATTR, self.run_id)
        have = self.link.call(lambda: self.client.get_run(self.run_id).data)
        given = {k: v for k, v in _params(params).items() if k not in (have.params if have else {})}
        self.link.log(mlflow, params=given, tags={"tfnb.sweep.study": study.study_name, "tfnb.sweep.state": "running"})
        self.best_run = have.tags.get("tfnb.sweep.best_run_id") if have else None

    def _reopen(self, run_id: str | None):
        """The parent an earlier sweep of the study made, made active on this thread again; None if gone."""
        if not run_id:
            return None
        try:
            found = self.client.get_run(run_id)
        except Exception:  # noqa: BLE001 - another tracking server's run, or gone: the sweep makes a new parent
            return None
        if found.info.lifecycle_stage != "active":  # deleted in the meantime
            return None
        return self.link.call(self.mlflow.start_run, run_id=run_id)

    def logging_to(self, child_run_id: str):
        """The trial's ``tfnb.run`` logs into its child run and leaves the model to :meth:`finish`."""
        return logging_to(child_run_id, log_model=False)

    def child(self, number: int, params: Mapping[str, Any]) -> str | None:
        """Make trial ``number``'s child run (from the trial's own thread); its id, None when tracking is off."""
        if self.run_id is None or self.link.broken:
            return None
        run = self.link.call(self.client.create_run, self.experiment_id, run_name=f"trial-{number}",
                             tags={"mlflow.parentRunId": self.run_id, "tfnb.sweep.trial": str(number)})
        if run is None:
            return None
        self.link.call(self.client.log_batch, run.info.run_id, params=_param_list(params))
        return run.info.run_id

    def trial_ended(self, row: TrialResult, best: TrialResult | None, metric: str) -> None:
        """Log a finished trial into its child run and end it; the best so far into the parent."""
        from mlflow.entities import Metric, RunTag

        stamp, run_id = int(time.time() * 1000), row.mlflow_run_id
        if run_id is not None:
            metrics = [Metric("trial_seconds", round(row.seconds, 3), stamp, 0)]
            if row.value is not None and math.isfinite(row.value):
                metrics.append(Metric("objective", row.value, stamp, 0))
            tags = [RunTag("tfnb.sweep.state", row.state)] + ([RunTag("tfnb.sweep.error", row.error[:5000])]
                                                               if row.error else [])
            self.link.call(self.client.log_batch, run_id, metrics=metrics, tags=tags)
            self.link.call(self.client.set_terminated, run_id, _STATUS.get(row.state, "FAILED"))
        if self.run_id is not None and best is not None and best.value is not None:  # step: the trial's number
            self.link.call(self.client.log_batch, self.run_id,
                           metrics=[Metric(f"best_{metric}", best.value, stamp, row.number)])

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
                self._log_best_model(best)
        self.link.log(self.mlflow, tags=tags)
        status = {"finished": "FINISHED", "interrupted": "KILLED"}.get(state, "FAILED")
        if self.link.own and self.link.broken:  # the caller's thread must not keep our run active
            with contextlib.suppress(Exception):
                self.mlflow.end_run(status)
        self.link.end(self.mlflow, status)

    def _log_best_model(self, best: TrialResult) -> None:
        have = self.link.call(lambda: self.client.get_run(best.mlflow_run_id).data.tags) or {}
        if best.model_dir and "tfnb.sweep.model" not in have:  # a resumed sweep's best may have it already
            given = settings(self.mlflow_option)  # mlflow={"registered_model_name": ...} registers the best model
            logged = self.link.call(_log_model, self.mlflow, best.model_dir, best.mlflow_run_id,
                                    given["registered_model_name"], given["input_example"])
            if logged:
                self.link.call(self.client.set_tag, best.mlflow_run_id, "tfnb.sweep.model", logged)


def _param_list(values: Mapping[str, Any]) -> list:
    from mlflow.entities import Param

    return [Param(k, v) for k, v in _params(values).items()]
