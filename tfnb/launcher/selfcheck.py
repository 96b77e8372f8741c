"""``tfnb.selfcheck``: does Keras 3 train exactly on this runtime? One small ``tfnb.run`` answers before a long job
(the train_fn side is tfnb._task.selfcheck; a run on untested versions does the same at its first ``fit``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SelfCheck:
    """What ``tfnb.selfcheck`` found.

    Attributes:
        passed: every way of training (``fit``, a custom loop, ``train_on_batch``) ended, on every worker, where one
            process over the same global batch ends.
        ratio: the update that differed most from one process's, over it (1.0: exact; 2.0: twice the step).
        versions: Keras, TensorFlow and Spark as the workers have them (None for one not found).
        message: one line: what passed, or what differed.
        ratios: each way's update over the one-process update.
        patches: the Keras corrections tfnb applied on the workers.
    """

    passed: bool
    ratio: float
    versions: dict
    message: str
    ratios: dict = field(default_factory=dict)
    patches: tuple = ()


def selfcheck(num_workers: int = 2, **run_kwargs: Any) -> SelfCheck:
    """Train one SGD step of a tiny linear model with Keras 3 on ``num_workers`` workers under
    MultiWorkerMirroredStrategy, and compare every worker's weights and loss with one process's.

    Args:
        num_workers: workers of the check's run (2 or more to test the all-reduce).
        run_kwargs: passed to ``tfnb.run`` (``spark``, ``env``, ``timeout``, ``display``...).

    Returns:
        SelfCheck: ``passed`` False with ``message`` naming what differs when Keras trains wrong here.

    Raises:
        TfnbError: what ``tfnb.run`` raises when the run itself fails (no Keras 3 on the executors, too small a
            cluster), or ConfigError for a bad ``num_workers``.

    Example:
        >>> check = tfnb.selfcheck(num_workers=2)
        >>> check.passed, check.ratio
        (True, 1.0)
    """
    from .._task.keras3 import selfcheck_fn
    from .._task.selfcheck import untested
    from .runner import run

    run_kwargs.setdefault("display", False)
    out = run(selfcheck_fn, num_workers=num_workers, **run_kwargs)  # it refuses a bad num_workers
    versions = out["versions"]
    named = ", ".join(f"{k} {v}" for k, v in versions.items() if v)
    newer = untested(versions)
    if out["passed"]:
        message = (f"Keras trains as one process on {num_workers} workers ({named})"
                   + (f"; untested: {', '.join(newer)}" if newer else ""))
    else:
        message = f"Keras trains wrong on {num_workers} workers ({named}): {'; '.join(out['details'])}"
    return SelfCheck(passed=bool(out["passed"]), ratio=float(out["ratio"]), versions=dict(versions),
                     message=message, ratios=dict(out["ratios"]), patches=tuple(out["patches"]))
