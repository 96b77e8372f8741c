"""One trial: a ``tfnb.run`` on a thread of its own, whose chief's epoch-end metrics go to Optuna as they arrive.

The run's display here is :class:`TrialDisplay`: each epoch-end report of the chief reaches
``trial.report`` the moment the driver receives it, and when the study's pruner says so the run is
cancelled through ``LaunchHooks(cancel=...)``, as the notebook's stop button cancels a run: the Spark job
is interrupted, every process it started stops, its slots are free for the next trial. A lost executor is
relaunched inside the trial by ``tfnb.run`` itself (``max_attempts``).
"""
from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .._protocol import EventKind, number
from ..errors import (ClusterError, ConfigError, MissingDependencyError, RunCancelledError, RunTimeoutError,
                      summary)
from ..launcher import LaunchHooks, RunOptions, run
from .outcomes import SweepEvent, SweepEventKind, TrialResult, better

log = logging.getLogger(__name__)

_FATAL = (ConfigError, MissingDependencyError)  # tfnb.run refused the options or the environment: no trial can run


@dataclass(frozen=True)
class Plan:
    """What every trial of one sweep shares."""

    train_fn: Callable
    options: RunOptions   # tfnb.run's options, resolved once; each trial adds its own args, dirs and display
    metric: str
    direction: str
    model_dir: str | None = None
    log_dir: str | None = None
    tracker: Any = None   # the sweep's MLflow tracking (tfnb.tuning.tracking.SweepTracker), or None


@dataclass(frozen=True)
class Ended:
    """A trial's end: its row, the exception (if any) and what the sweep makes of it: ``complete``, ``pruned``,
    ``cancelled``, ``bug`` (train_fn raised: counts towards the same-error rule), ``fatal`` (the trial cannot start
    at all, and no other would: stops the sweep), ``cluster`` (the cluster failed the trial after it launched: an
    elastic trial below min_workers, a ps job whose slots other jobs took) or ``failed`` (timed out, no usable
    objective)."""

    row: TrialResult
    error: BaseException | None
    verdict: str


def subdir(base: str | None, number: int) -> str | None:
    """A trial's own folder under ``base`` (a path or a URL)."""
    return None if not base else f"{str(base).rstrip('/')}/trial-{number}"


class TrialDisplay:
    """The display of one trial's ``tfnb.run``: metrics to Optuna (and the pruner's verdict), rows and log lines
    to the sweep (``post``). Called on the trial's thread; never raises (the run must not die of its display)."""

    def __init__(self, trial, row: TrialResult, plan: Plan, post: Callable[[SweepEvent], None],
                 cancel: threading.Event):
        self.trial, self.row, self.plan, self.post, self.cancel = trial, row, plan, post, cancel
        self.pruned = False
        self.reported: dict[int, float] = {}
        self.launched = False  # the run's first launch started (it sent an event): past tfnb.run's checks
        self._optuna_ok = True

    def __call__(self, event) -> None:
        self.batch((event,))

    def batch(self, batch) -> None:
        try:
            self._batch(batch)
        except Exception as e:  # noqa: BLE001 - a display error must not end the training
            log.warning("tfnb.sweep: trial %d's display failed (%s: %s)", self.row.number, type(e).__name__, e)

    def _batch(self, batch) -> None:
        self.launched = True
        lines, changed = [], False
        for event in batch:
            kind, data = event.kind, event.data or {}
            if kind == EventKind.LOG:
                if not data.get("partial"):  # carriage-return bars: their last state arrives as a line
                    lines.append(f"[{event.label}] {data.get('line', '')}")
            elif kind == EventKind.PROGRESS and event.job_name == "chief":
                changed = self._progress(data) or changed
            elif kind == EventKind.STATE and data.get("log_file"):
                self.row, changed = self.row.replace(log_file=data["log_file"]), True
            elif kind == EventKind.STATE and data.get("state") == "training" and self.row.state == "starting":
                self.row, changed = self.row.replace(state="running"), True
            elif kind == EventKind.ATTEMPT:
                lines.append(f"[tfnb] relaunching (attempt {data.get('attempt')}/{data.get('max_attempts')}) "
                             f"after: {data.get('reason')}")
            elif kind == EventKind.FAILED:
                lines.append(f"[{event.label}] FAILED {data.get('exc_type')}: {data.get('message')}")
        if lines:
            self.post(SweepEvent(SweepEventKind.LINES, trial=self.row, lines=tuple(lines)))
        if changed:
            self.post(SweepEvent(SweepEventKind.TRIAL, trial=self.row.replace(seconds=time.time() - self.row.started)))

    def _progress(self, data: Mapping) -> bool:
        if data.get("epochs") and data["epochs"] != self.row.epochs:
            self.row = self.row.replace(epochs=data["epochs"])
        value = number(data.get(self.plan.metric))
        epoch = data.get("epoch")
        if not data.get("epoch_end") or value is None or not isinstance(epoch, int) or epoch in self.reported:
            return False  # a relaunch reports the epochs it redoes again: Optuna keeps the first
        self.reported[epoch] = value
        best = value if better(value, self.row.best, self.plan.direction) else self.row.best
        self.row = self.row.replace(epoch=epoch, best=best, value=value, curve=self.row.curve + ((epoch, value),),
                                    state="running" if self.row.state == "starting" else self.row.state)
        if self._optuna_ok and not self.pruned:
            try:
                self.trial.report(value, epoch)
                prune = self.trial.should_prune()
            except Exception as e:  # noqa: BLE001 - the study's storage failing must not end the training
                self._optuna_ok, prune = False, False
                log.warning("tfnb.sweep: trial %d cannot report to the study (%s: %s); it runs on unpruned",
                            self.row.number, type(e).__name__, e)
            if prune:
                self.pruned = True
                self.row = self.row.replace(state="pruning")
                self.cancel.set()  # tfnb.run stops the job and its processes, then raises RunCancelledError
        return True

    def close(self) -> None:
        pass


def objective(returned: Any, metric: str, reported: float | None) -> tuple[float | None, str | None]:
    """(the trial's objective, why it cannot be used): a number train_fn returned, ``returned[metric]`` (the last
    item of a list, as Keras' ``history.history`` holds), else the chief's last epoch-end report of it; NaN with
    its reason when it diverged, None with its reason when there is none."""
    value = returned[metric] if isinstance(returned, Mapping) and metric in returned else returned
    if isinstance(value, (list, tuple)) and value:
        value = value[-1]
    found = None if isinstance(value, Mapping) else number(value)
    found = reported if found is None else found
    if found is None:
        what = (f"a dict without {metric!r} (keys: {', '.join(map(str, list(returned)[:8]))})"
                if isinstance(returned, Mapping) else type(returned).__name__)
        return None, (f"train_fn returned {what} and the chief reported no {metric!r} at an epoch end; return a "
                      f"number or a dict holding {metric!r} (model.evaluate(..., return_dict=True)), or pass metric= "
                      "one of the metrics ctx.progress_callback() reports")
    if math.isnan(found):
        return found, f"the objective {metric!r} is NaN (diverged)"
    return found, None


def run_trial(plan: Plan, trial, row: TrialResult, cancel: threading.Event,
              post: Callable[[SweepEvent], None]) -> Ended:
    """Run one trial to its end (on the calling thread); never raises."""
    display = TrialDisplay(trial, row, plan, post, cancel)
    error: BaseException | None = None
    try:
        if plan.tracker is not None:  # its MLflow child run, made here so the sweep's loop never waits on it
            display.row = row = row.replace(mlflow_run_id=plan.tracker.child(row.number, row.params))
        post(SweepEvent(SweepEventKind.TRIAL, trial=row))
        track = row.mlflow_run_id is not None
        with plan.tracker.logging_to(row.mlflow_run_id) if track else contextlib.nullcontext():
            returned = run(plan.train_fn, plan.options, hooks=LaunchHooks(cancel=cancel), display=display,
                           args=(dict(row.params), *plan.options.args), model_dir=row.model_dir,
                           log_dir=subdir(plan.log_dir, row.number),
                           mlflow=plan.tracker.mlflow_option if track else None)
    except RunCancelledError as e:
        verdict, error = ("pruned" if display.pruned else "cancelled"), e
    except _FATAL as e:
        verdict, error = "fatal", e
    except ClusterError as e:
        # Refused before it launched (slots, GPUs, a profile), or executors where no task can start (the launcher
        # marks those every_launch): every trial would meet it. Once launched, the cluster failing it is its own.
        verdict, error = ("fatal" if not display.launched or getattr(e, "every_launch", False) else "cluster"), e
    except RunTimeoutError as e:
        verdict, error = "failed", e
    except Exception as e:  # noqa: BLE001 - WorkerError (train_fn raised), or whatever else went wrong
        verdict, error = "bug", e
    else:
        value, why = objective(returned, plan.metric, display.row.value)
        row = display.row.replace(returned=returned)
        if why is None:
            return Ended(row.replace(state="complete", value=value, seconds=time.time() - row.started), None,
                         "complete")
        # diverged (NaN): a hyperparameter's doing; no objective at all: train_fn's, in every trial alike
        verdict, error = ("failed" if value is not None else "bug"), ValueError(why)
    row = display.row
    state = {"pruned": "pruned", "cancelled": "cancelled"}.get(verdict, "failed")
    if verdict == "pruned":
        text = f"pruned at epoch {row.epoch}: {plan.metric}={row.value:.4g}" if row.value is not None else "pruned"
    else:
        text = summary(error)
    return Ended(row.replace(state=state, seconds=time.time() - row.started, error=text,
                             value=row.value if state == "pruned" else None), error, verdict)
