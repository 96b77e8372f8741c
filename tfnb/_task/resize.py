"""An elastic run resized at an epoch boundary: every train_fn process stops at the same boundary, after that epoch's
checkpoint, so the driver can relaunch the run at another size (tfnb.run's ``min_workers``, tfnb.launcher.elastic):
wider once executors returned, narrower when Spark gives notice that one is leaving (decommissioning).

The driver asks by ``Msg.RESIZE``; each task's supervisor marks it with the file :data:`RESIZE` in its working
folder (``ctx.local_dir``). Workers hear it at different moments, so they agree collectively: at the start of each
epoch after the first, :func:`epoch_boundary` sums every worker's "asked" over the strategy, and if any was asked,
all raise :class:`Resize` together (a scalar all-reduce per epoch, which every worker of an elastic run calls in the
same order). Raising, not returning, keeps a ``BackupAndRestore`` backup: Keras deletes it only when ``fit`` ends
normally.

Each train_fn process that takes part in the vote says so once (:func:`join_vote`: the progress callback at ``fit``'s
start, or the first ``ctx.epoch_boundary`` call): the driver stops a run where only some workers do (the vote would
hang), and says so when a resize could not happen because none does.
"""
from __future__ import annotations

import os
from typing import Any

RESIZE = "tfnb-resize"


class Resize(BaseException):
    """Raised on every worker at an epoch boundary when the run is resized; tfnb relaunches it (not a failure, not
    counted against max_attempts).

    A ``BaseException``, like ``SystemExit``: a stop on purpose, not an error, so train_fn's ``except Exception``
    (logging and re-raising as its own error, or carrying on) lets it through. One caught all the same and re-raised
    as another exception (``raise MyError(...) from e``, or raised while handling it) still counts as the resize:
    tfnb._task.child finds it in the ``__cause__``/``__context__`` chain."""


_joined = False


def join_vote(ctx: Any, at: str = "fit") -> None:
    """Tell the driver, once per process, that this worker takes part in the epoch-boundary vote (elastic runs
    only): as ``fit`` starts (the progress callback), or ``at`` its first ``"boundary"`` (a custom loop)."""
    global _joined
    if _joined or getattr(ctx, "min_workers", None) is None or not getattr(ctx, "local_dir", None):
        return
    _joined = True
    from .._protocol import STATE
    from .events import emit

    emit(STATE, epoch_vote=at)


def found_in(error: BaseException) -> BaseException | None:
    """The :class:`Resize` ``error`` is or was raised from (its ``__cause__``/``__context__`` chain), else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, Resize):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def epoch_boundary(ctx: Any, strategy: Any = None, epoch: int | None = None) -> None:
    """The start of an epoch after the first, on every worker, once the last epoch's checkpoint is written.

    Raises:
        Resize: the driver asked this run to stop for a resize (on every worker at once).
    """
    if getattr(ctx, "min_workers", None) is None or not ctx.local_dir:
        return  # not elastic: nothing to agree on, no collective
    join_vote(ctx, "boundary")
    asked = int(os.path.exists(os.path.join(ctx.local_dir, RESIZE)))
    if ctx.num_workers > 1:
        import tensorflow as tf

        strategy = strategy or tf.distribute.get_strategy()
        asked = int(strategy.reduce("SUM", tf.constant(asked), axis=None))
    if asked:
        where = f" at epoch {epoch + 1}" if epoch is not None else ""
        raise Resize(f"the run stops{where} to be relaunched at another size (executors returned or leaving)")
