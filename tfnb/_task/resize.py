"""An elastic run resized at an epoch boundary: every train_fn process stops at the same boundary, after that epoch's
checkpoint, so the driver can relaunch the run at another size (tfnb.run's ``min_workers``, tfnb.launcher.elastic):
wider once executors returned, narrower when Spark gives notice that one is leaving (decommissioning).

The driver asks by ``Msg.RESIZE``; each task's supervisor marks it with the file :data:`RESIZE` in its working
folder (``ctx.local_dir``). Workers hear it at different moments, so they agree collectively: at the start of each
epoch after the first, :func:`epoch_boundary` sums every worker's "asked" over the strategy, and if any was asked,
all raise :class:`Resize` together (a scalar all-reduce per epoch, which every worker of an elastic run calls in the
same order). Raising, not returning, keeps a ``BackupAndRestore`` backup: Keras deletes it only when ``fit`` ends
normally.
"""
from __future__ import annotations

import os
from typing import Any

RESIZE = "tfnb-resize"


class Resize(Exception):
    """Raised on every worker at an epoch boundary when the run is resized; tfnb relaunches it (not a failure, not
    counted against max_attempts)."""


def epoch_boundary(ctx: Any, strategy: Any = None, epoch: int | None = None) -> None:
    """The start of an epoch after the first, on every worker, once the last epoch's checkpoint is written.

    Raises:
        Resize: the driver asked this run to stop for a resize (on every worker at once).
    """
    if getattr(ctx, "min_workers", None) is None or not ctx.local_dir:
        return  # not elastic: nothing to agree on, no collective
    asked = int(os.path.exists(os.path.join(ctx.local_dir, RESIZE)))
    if ctx.num_workers > 1:
        import tensorflow as tf

        strategy = strategy or tf.distribute.get_strategy()
        asked = int(strategy.reduce("SUM", tf.constant(asked), axis=None))
    if asked:
        where = f" at epoch {epoch + 1}" if epoch is not None else ""
        raise Resize(f"the run stops{where} to be relaunched at another size (executors returned or leaving)")
