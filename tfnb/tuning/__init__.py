"""Hyperparameter sweeps: ``tfnb.sweep`` runs many distributed trainings at once, searched and pruned by Optuna.
:mod:`.loop` is the sweep, :mod:`.space` its search space and study, :mod:`.tracking` its MLflow runs,
:mod:`.outcomes` its results; ``sweep`` (and the launcher under it) loads with its first use."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .outcomes import SweepCancelledError, SweepEvent, SweepEventKind, SweepResult, SweepStoppedError, TrialResult

if TYPE_CHECKING:
    from .loop import sweep

__all__ = ["sweep", "SweepResult", "TrialResult", "SweepEvent", "SweepEventKind", "SweepStoppedError",
           "SweepCancelledError"]


def __getattr__(name: str):
    if name == "sweep":
        from .loop import sweep

        return sweep
    raise AttributeError(f"module 'tfnb.tuning' has no attribute {name!r}")
