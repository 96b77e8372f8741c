"""What a sweep returns: its trials and result, its two errors. Core types, no display code. A trial's state is
one of :data:`STATES`, the last four final."""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from .._protocol import EventKind, RunEvent
from ..errors import RunCancelledError, TfnbError

STATES = ("starting", "running", "pruning", "complete", "pruned", "failed", "cancelled")
FINAL = frozenset(STATES[3:])
KEPT = ("state", "seconds", "error", "log_file", "model_dir", "mlflow_run_id")  # in the study: user_attrs "tfnb.<name>"


@dataclass(frozen=True)
class TrialResult:
    """One trial of a sweep: its hyperparameters, how it went and where its traces are.

    Attributes:
        number: Optuna's trial number (unique in the study, counting earlier sweeps of it).
        params: the hyperparameters train_fn received.
        state: ``starting`` (launched, no task training yet), ``running``, ``pruning`` (cancel under way),
            then ``complete``, ``pruned``, ``failed`` or ``cancelled``.
        value: the objective: what a complete trial returned (or last reported), a pruned trial's last report.
        epoch: the last epoch the chief reported; ``epochs`` how many fit was asked for.
        best: the best value of the metric the chief reported at an epoch end, so far.
        curve: ``(epoch, value)`` of the metric at each epoch end.
        seconds: wall time from launch to its end (so far, while it runs).
        error: why it failed or was cancelled, one line.
        log_file: every line its tasks printed (the run's log file).
        model_dir: the trial's own model_dir (``<model_dir>/trial-<number>``), when the sweep has one.
        mlflow_run_id: the trial's MLflow child run.
        returned: what train_fn returned on the chief (complete trials).

    Example:
        >>> {t.number: t.epoch for t in result.trials if t.state == "pruned"}   # pruned at which epoch
        {5: 1, 7: 2}
    """

    number: int
    params: Mapping[str, Any]
    state: str = "starting"
    value: float | None = None
    epoch: int | None = None
    epochs: int | None = None
    best: float | None = None
    curve: tuple = ()
    seconds: float = 0.0
    error: str | None = None
    log_file: str | None = None
    model_dir: str | None = None
    mlflow_run_id: str | None = None
    returned: Any = field(default=None, repr=False)
    started: float = field(default_factory=time.time, repr=False)

    @property
    def done(self) -> bool:
        return self.state in FINAL

    def replace(self, **changes) -> "TrialResult":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_optuna(cls, frozen) -> "TrialResult":
        """A finished trial of an earlier sweep of the study, from what Optuna stored of it."""
        kept = {"state": frozen.state.name.lower(), **{k: frozen.user_attrs[f"tfnb.{k}"] for k in KEPT
                                                       if f"tfnb.{k}" in frozen.user_attrs}}
        curve = tuple(sorted(frozen.intermediate_values.items()))
        return cls(frozen.number, dict(frozen.params), value=frozen.value if frozen.values else None,
                   epoch=curve[-1][0] if curve else None, curve=curve,
                   started=frozen.datetime_start.timestamp() if frozen.datetime_start else 0.0, **kept)


def better(a: float | None, b: float | None, direction: str) -> bool:
    """Whether ``a`` beats ``b`` (None and NaN never beat anything; anything beats None)."""
    if a is None or math.isnan(a):
        return False
    if b is None or math.isnan(b):
        return True
    return a < b if direction == "minimize" else a > b


@dataclass(frozen=True)
class SweepResult:
    """What ``tfnb.sweep`` returns (also ``.result`` of its errors): every trial of this call, and the best.

    Attributes:
        trials: this call's trials, by number.
        best: the best complete trial of the study (earlier sweeps of it included), or None.
        metric: the objective's name; ``direction``: ``minimize`` or ``maximize``.
        study: the Optuna study (``study.trials_dataframe()``, ``optuna.visualization``...).
        mlflow_run_id: the sweep's MLflow parent run, when tracked.
        stopped: why the sweep ended before its last trial (None when every trial ran).
        seconds: the sweep's wall time.

    Example:
        >>> result = tfnb.sweep(train_fn, space, n_trials=20, num_workers=1, metric="val_accuracy",
        ...                     direction="maximize")
        >>> result.best.params, result.best.value, result.best.model_dir
        ({'learning_rate': 0.0031, 'units': 128}, 0.962, None)
    """

    trials: tuple
    best: TrialResult | None
    metric: str
    direction: str
    study: Any = field(default=None, repr=False)
    mlflow_run_id: str | None = None
    stopped: str | None = None
    seconds: float = 0.0

    @property
    def best_params(self) -> dict | None:
        return dict(self.best.params) if self.best else None

    def count(self, state: str) -> int:
        return sum(t.state == state for t in self.trials)

    def summary(self) -> str:
        """One line: counts by state and the best trial."""
        counts = ", ".join(f"{n} {s}" for s in STATES if (n := self.count(s)))
        best = (f"; best: trial {self.best.number} {self.metric}={self.best.value:.4g} "
                f"({format_params(self.best.params)})") if self.best and self.best.value is not None else ""
        return f"{len(self.trials)} trials ({counts or 'none'}){best}"

    __str__ = summary


def format_params(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


SweepEvent = RunEvent  # a sweep's events are RunEvents (kinds begin, trial, lines, finish): the same type
SweepEventKind = EventKind  # the same enum


class _WithResult:
    def __init__(self, message: str, result: SweepResult):
        super().__init__(message)
        self.result = result


class SweepStoppedError(_WithResult, TfnbError):
    """Trials in a row failed with the same error (a bug, not a bad hyperparameter), or a trial could not
    start at all; the sweep stopped. ``.result`` holds what finished; the cause is chained."""


class SweepCancelledError(_WithResult, RunCancelledError):
    """The sweep was interrupted (notebook stop button / Ctrl-C): every running trial was cancelled and its
    processes stopped. ``.result`` holds what finished. A KeyboardInterrupt, so Run All stops here."""
