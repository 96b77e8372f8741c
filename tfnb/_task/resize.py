"""An elastic run resized at an epoch boundary (``min_workers``, tfnb.launcher.elastic): the driver's ``Msg.RESIZE``
becomes the file :data:`RESIZE`; workers hear it at different moments, so each epoch start sums every worker's
"asked" (a scalar all-reduce) and all raise :class:`Resize` together, after that epoch's checkpoint."""
from __future__ import annotations

import os
from typing import Any

RESIZE = "tfnb-resize"


class Resize(BaseException):
    """Raised on every worker at an epoch boundary when the run is resized; tfnb relaunches it (not a failure).
    A ``BaseException`` like ``SystemExit``, so ``except Exception`` lets it through; re-raised as another error it
    still counts (tfnb._task.child finds it in the ``__cause__``/``__context__`` chain)."""


_joined = False


def join_vote(ctx: Any, at: str = "fit") -> None:
    """Tell the driver, once per process of an elastic run, that this worker votes (``at`` fit or "boundary")."""
    global _joined
    if _joined or getattr(ctx, "min_workers", None) is None or not getattr(ctx, "local_dir", None):
        return
    _joined = True
    from .._protocol import STATE
    from .events import emit

    emit(STATE, epoch_vote=at)


def found_in(error: BaseException) -> BaseException | None:
    """The :class:`Resize` in ``error``'s ``__cause__``/``__context__`` chain, else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, Resize):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def epoch_boundary(ctx: Any, strategy: Any = None, epoch: int | None = None) -> None:
    """:meth:`WorkerContext.epoch_boundary`: Resize on every worker at once when the driver asked for one."""
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
