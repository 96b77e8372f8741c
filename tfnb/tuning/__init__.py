"""Hyperparameter sweeps across the cluster: ``tfnb.sweep`` runs many distributed trainings at once, searched and
pruned by Optuna, tracked as one MLflow parent run, shown as one live panel.

Driver side, above the launcher: a sweep is Optuna's ask-and-tell loop (:mod:`.loop`) launching each trial
as a ``tfnb.run`` on a thread of its own (:mod:`.trial`); :mod:`.space` checks the search space and the
study, :mod:`.tracking` keeps the MLflow parent and child runs, :mod:`.outcomes` holds what a sweep returns
and the events its display receives, and :mod:`.display` is the registry the notebook layer plugs its sweep
panel into. Optuna is optional (``pip install 'tfnb[sweep]'``) and imported at the first sweep; the loop
(and the launcher under it) loads with the first use of ``sweep``, so the notebook layer, which registers its
sweep displays here, stays quick to import.
"""
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
