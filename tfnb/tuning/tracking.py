"""MLflow for a sweep: one parent run (the caller's active run, else the one an earlier sweep of the study made, else
a new one), a child run per trial that its ``tfnb.run`` logs into, the best trial marked and its model logged. The
first failing MLflow call is reported once and ends tracking for the sweep."""
from __future__ import annotations

import contextlib
import math
from typing import Any, Mapping

from ..monitor.tracking import _Link, _log_model, metrics_at, settings
from .outcomes import SweepResult, TrialResult

PARENT_ATTR = "tfnb.mlflow_run_id"  # in the study's user attrs: the sweep's parent run, for later sweeps of it
_STATUS = {"complete": "FINISHED", "pruned": "KILLED", "cancelled": "KILLED", "failed": "FAILED"}


class SweepTracker:
    """The sweep's parent run (made or reopened on the sweep's thread) and its trials' child runs."""

    def __init__(self, experiment: Any, study, params: Mapping[str, Any]):
        self.mlflow_option, self.study = experiment, study
        self.link = link = _Link(f"tfnb sweep {study.study_name}")
        self.client = link.client
        active = link.mlflow.active_run()  # the caller's run (MLflow's active run is per thread)
        earlier, reopen = None if active else study.user_attrs.get(PARENT_ATTR), None
        with contextlib.suppress(Exception):  # another tracking server's run, or gone: the sweep makes a new parent
            if earlier and self.client.get_run(earlier).info.lifecycle_stage == "active":  # not deleted since
                reopen = earlier
        link.start(experiment, active and active.info.run_id, {"tfnb.sweep.study": study.study_name},
                   reopen=reopen, run_name=f"sweep {study.study_name}")
        self.run_id, self.best_run = link.run_id, None  # best_run: the child an earlier sweep tagged best
        if self.run_id is None:
            return
        if link.own:  # a later sweep reopens (and ends) only a parent a sweep started, never the caller's run
            study.set_user_attr(PARENT_ATTR, self.run_id)
        have = link.call(self.client.get_run, self.run_id)
        self.experiment_id = have.info.experiment_id if have else None
        given = {k: v for k, v in params.items() if v is not None and k not in (have.data.params if have else {})}
        link.log(params=given, tags={"tfnb.sweep.study": study.study_name, "tfnb.sweep.state": "running"})
        self.best_run = have.data.tags.get("tfnb.sweep.best_run_id") if have else None

    def child(self, number: int, params: Mapping[str, Any]) -> str | None:
        """Trial ``number``'s new child run id (made on the trial's thread); None when tracking is off."""
        if self.run_id is None or self.link.broken:
            return None
        run = self.link.call(self.client.create_run, self.experiment_id, run_name=f"trial-{number}",
                             tags={"mlflow.parentRunId": self.run_id, "tfnb.sweep.trial": str(number)})
        if run is None:
            return None
        self.link.log(params={str(k): v for k, v in params.items() if v is not None}, run_id=run.info.run_id)
        return run.info.run_id

    def trial_ended(self, row: TrialResult, metric: str) -> None:
        """Log a finished trial into its child run and end it; the study's best value so far into the parent."""
        best = None
        with contextlib.suppress(Exception):  # no complete trial yet (ValueError), or a storage that cannot say
            best = self.study.best_value
        if row.mlflow_run_id is not None:
            ok = row.value is not None and math.isfinite(row.value)
            values = {"trial_seconds": round(row.seconds, 3), **({"objective": row.value} if ok else {})}
            self.link.log(metrics_at(values, 0), tags={"tfnb.sweep.state": row.state,
                                                       **({"tfnb.sweep.error": row.error} if row.error else {})},
                          run_id=row.mlflow_run_id)
            self.link.call(self.client.set_terminated, row.mlflow_run_id, _STATUS.get(row.state, "FAILED"))
        if best is not None:  # step: the trial's number
            self.link.log(metrics_at({f"best_{metric}": best}, row.number))

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
                    logged = self.link.call(_log_model, self.link.mlflow, best.model_dir, best.mlflow_run_id,
                                            given["registered_model_name"], given["input_example"])
                    if logged:
                        self.link.call(self.client.set_tag, best.mlflow_run_id, "tfnb.sweep.model", logged)
        self.link.log(tags=tags)
        status = {"finished": "FINISHED", "interrupted": "KILLED"}.get(state, "FAILED")
        if self.link.own and self.link.broken:  # the caller's thread must not keep our run active
            with contextlib.suppress(Exception):
                self.link.mlflow.end_run(status)
        self.link.end(status)
