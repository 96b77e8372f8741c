"""A task's part of ``data=`` written whole before train_fn starts, with every worker's row count: the checks and
the reading side of tfnb._task.feed without the streaming (``tfnb.run`` streams: FeedStream)."""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Iterable, Sequence

from tfnb._task import feed
from tfnb._task.spill import ArrowSpill


@dataclass(frozen=True)
class Spilled:
    path: str
    rows: int
    array_lengths: tuple[tuple[str, int], ...]  # (column, elements per row) for array columns
    end: int


def spill_partition(spec: feed.FeedSpec, batches: Iterable, workdir: str) -> Spilled:
    spill = ArrowSpill(os.path.join(workdir, feed.SPILL_FILE), feed._arrow_schema(spec))
    lengths: dict[str, int] = {}
    try:
        for batch in batches:
            if batch.num_rows:
                spill.write(feed._prepare(spec, batch, lengths))
    finally:
        spill.close()
    return Spilled(path=spill.path, rows=spill.rows, array_lengths=tuple(sorted(lengths.items())), end=spill.end)


def finish_feed(spec: feed.FeedSpec, spilled: Spilled, rows_per_worker: Sequence[int]) -> feed.FeedInfo:
    """``ctx.feed`` over a whole spill: its final state published as the task publishes it."""
    rows = [int(r) for r in rows_per_worker]
    workdir = os.path.dirname(spilled.path)
    with open(os.path.join(workdir, feed.STATE_FILE), "w") as f:
        json.dump({"end": spilled.end, "rows": spilled.rows, "safe": min(rows, default=0), "counts": rows,
                   "lengths": dict(spilled.array_lengths), "error": None, "final": {}}, f)
    with contextlib.suppress(FileExistsError):
        os.mkfifo(os.path.join(workdir, feed.WAKE_FIFO), 0o600)
    return feed.FeedInfo(path=spilled.path, spec=spec, state_dir=workdir)
