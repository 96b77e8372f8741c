"""The task half of ``tfnb.run(train_fn, data=df)`` (driver half: tfnb.data.feeding): :class:`FeedStream` writes
the partition to a local Arrow IPC file while train_fn reads it (tfnb._task.dataset), publishing how far it is whole
and telling the driver its row count; the driver answers with the smallest count, the rows train_fn may serve."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from ..errors import ConfigError
from ..storage import atomic_write
from .spill import ArrowSpill, spill_dir

SPILL_FILE = "tfnb-feed.arrow"


@dataclass(frozen=True)
class FeedColumn:
    """One fed column: a number per row, or a fixed-length array of numbers per row."""

    name: str
    dtype: str        # numpy dtype of the values: float32, float64, int64, int32, int16, int8, bool
    is_array: bool    # the array length is read from the data, in the task


@dataclass(frozen=True)
class FeedSpec:
    """The columns ``tfnb.run(data=df)`` feeds, fixed on the driver from ``df.schema``."""

    columns: tuple[FeedColumn, ...]
    nbytes: int | None = None  # the whole DataFrame's size in Spark's cache, when the driver knows it
    memory_share: float = 0.0  # share of a host's free memory the spill may take (TFNB_SPILL_MEMORY)


STATE_FILE = "tfnb-feed.json"  # how far the task has written, replaced atomically on every change
WAKE_FIFO = "tfnb-feed.wake"   # one byte per state change, so train_fn waits without polling
_TELL_EVERY = 0.05  # seconds between two row counts told to the driver while the task receives


def _arrow_schema(spec: FeedSpec):
    import pyarrow as pa

    types = {c.name: pa.from_numpy_dtype(c.dtype) for c in spec.columns}
    return pa.schema([(c.name, pa.list_(types[c.name]) if c.is_array else types[c.name]) for c in spec.columns])


def _prepare(spec: FeedSpec, batch, lengths: dict[str, int]):
    """The batch's fed columns, arrays first as fixed-size lists: no offsets, and the first array starts its
    message's body, 64-byte aligned, so TensorFlow takes it without a copy (half of ``ctx.dataset``'s cost).
    Nulls and ragged arrays are refused: a batch matrix needs one number per cell."""
    import pyarrow as pa

    cols, order = [], sorted(spec.columns, key=lambda c: not c.is_array)
    for c in order:
        col = batch.column(c.name)
        nulls = col.null_count + (col.flatten().null_count if c.is_array else 0)
        if nulls:
            raise ConfigError(
                f"column {c.name!r} has null values ({nulls} in one batch); tfnb feeds complete rows: "
                f"fill them (df.na.fill(0, [{c.name!r}])) or drop those rows "
                f"(df.dropna(subset=[{c.name!r}])) before tfnb.run(data=df)")
        cols.append(_fixed_size(c.name, col, lengths) if c.is_array else col)
    return pa.RecordBatch.from_arrays(cols, names=[c.name for c in order])


def _fixed_size(name: str, col, lengths: dict[str, int]):
    import pyarrow as pa
    import pyarrow.compute as pc

    fixed = pa.types.is_fixed_size_list(col.type)
    if fixed:
        lo = hi = col.type.list_size
    else:
        mm = pc.min_max(pc.list_value_length(col))
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
    seen = lengths.setdefault(name, lo)
    if lo != hi or lo != seen:
        raise ConfigError(
            f"column {name!r} holds arrays of different lengths ({', '.join(map(str, sorted({seen, lo, hi})))}); "
            "tfnb feeds fixed-length arrays: pad or cut them to one length n, e.g. "
            f"F.slice(F.concat({name!r}, F.array_repeat(F.lit(0.0), n)), 1, n)")
    return col if fixed else pa.FixedSizeListArray.from_arrays(col.flatten(), lo)


def _no_rows_message(rows_per_worker: Sequence[int]) -> str:
    rows = list(rows_per_worker)
    if not sum(rows):
        return (f"data= has 0 rows (rows per worker: {rows}), so there is nothing to train on; check the "
                "DataFrame's source and filters (df.count() > 0) before tfnb.run(data=df)")
    empty = [i for i, r in enumerate(rows) if r == 0]
    return (f"worker(s) {empty} got no rows of the data (rows per worker: {rows}): data= has {sum(rows)} "
            f"rows for {len(rows)} workers, so no worker can be given a batch; feed a DataFrame with at "
            "least batch_size rows per worker, or lower num_workers")


class FeedStream:
    """Writes the partition while train_fn reads it (``info`` becomes ``ctx.feed``). :meth:`pump` publishes after
    each batch how far the file is whole and tells the driver its rows; the driver answers (:meth:`heard`) with the
    smallest count, then the final counts: every worker serves the same batches without counting before launch."""

    def __init__(self, spec: FeedSpec, workdir: str, num_workers: int, tasks_here: int = 1,
                 counts: Sequence[int] | None = None):
        self.spec, self.num_workers, self._dir = spec, num_workers, workdir
        self._spill_dir = spill_dir(spec.nbytes, spec.memory_share, workdir, num_workers, tasks_here)
        fifo = os.path.join(workdir, WAKE_FIFO)
        os.mkfifo(fifo, 0o600)
        # Read-write: opening never blocks, and the pipe has a writer until pump() ends.
        self._wake: int | None = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        self._lock = threading.Lock()  # the state: pump's thread and the channel's reader both change it
        self._final = threading.Event()
        # counts: every worker's rows, once known (counted before launch, or told once every part is whole)
        self._state: dict = {"end": 0, "rows": 0, "safe": 0, "lengths": None, "final": None, "error": None,
                             "counts": None}
        if counts is not None:  # counted on the driver before launch: known to train_fn at once
            self.heard({"counts": list(counts)})
        self._publish()
        self.info = FeedInfo(path=os.path.join(self._spill_dir, SPILL_FILE), spec=spec, state_dir=workdir)

    def remove(self) -> None:
        """Delete a spill outside the task's folder (memory-backed)."""
        if self._spill_dir != self._dir:
            shutil.rmtree(self._spill_dir, ignore_errors=True)

    def _publish(self) -> None:  # callers hold self._lock (or own the stream alone)
        atomic_write(os.path.join(self._dir, STATE_FILE), json.dumps(self._state).encode())
        if self._wake is None:
            return  # pump() has ended: nobody waits for a wake-up any more
        with contextlib.suppress(BlockingIOError):  # a pipe full of wake-ups not taken yet: the reader looks anyway
            os.write(self._wake, b"\0")

    def heard(self, msg: dict) -> None:
        """The driver's ``safe`` rows every worker has, or the final ``counts`` (channel reader thread)."""
        with self._lock:
            if self._final.is_set():
                return
            if isinstance(msg.get("counts"), list):
                rows = [int(r) for r in msg["counts"]][:self.num_workers]
                self._state.update(counts=rows, safe=min(rows, default=0))
                self._final.set()
            elif int(msg.get("safe", 0)) > self._state["safe"]:
                self._state["safe"] = int(msg["safe"])
            else:
                return
            self._publish()

    def abort(self) -> None:
        """The run is being stopped: :meth:`pump` stops waiting for the final counts."""
        self._final.set()

    def pump(self, batches: Iterable, tell: Callable[[int, bool], Any]) -> list[int] | None:
        """Write the partition and agree on the counts: the rows per worker (None: stopped). ``tell(rows, done)``
        reports this task's rows to the driver. ConfigError: nulls or ragged arrays, or a worker without rows."""
        start, first, told = time.perf_counter(), None, float("-inf")
        spill = ArrowSpill(self.info.path, _arrow_schema(self.spec))
        lengths: dict[str, int] = {}

        def write(batch, lengths: dict) -> None:  # in the writer thread
            nonlocal told
            spill.write(batch)
            with self._lock:
                self._state.update(end=spill.end, rows=spill.rows, lengths=lengths)
                self._publish()
            if time.monotonic() - told >= _TELL_EVERY:
                tell(spill.rows, False)
                told = time.monotonic()

        try:
            # a writer thread writes while this one takes the next batch from Spark; at most 4 wait for it
            with contextlib.closing(spill), ThreadPoolExecutor(1, thread_name_prefix="tfnb-feed-writer") as writer:
                pending: deque = deque()
                for batch in batches:
                    if batch.num_rows:
                        first = first or time.time()
                        pending.append(writer.submit(write, _prepare(self.spec, batch, lengths), dict(lengths)))
                        if len(pending) > 4:
                            pending.popleft().result()
                for done in pending:
                    done.result()
            last = time.time()
            tell(spill.rows, True)
            self._final.wait()
            rows = self._state["counts"]
            if rows is None:
                return None
            with self._lock:  # safe and lengths are published already
                self._state["final"] = {"seconds": time.perf_counter() - start, "first": first, "last": last}
            if not min(rows):
                raise ConfigError(_no_rows_message(rows))
        except BaseException as e:
            self._state["error"] = f"{type(e).__name__}: {e}"
            raise
        finally:
            with self._lock:
                if self._state["counts"] is None and not self._state["error"]:
                    self._state["error"] = "RuntimeError: the run was stopped"
                self._publish()
                os.close(self._wake)
                self._wake = None
        return rows


@dataclass(frozen=True)
class FeedInfo:
    """This worker's part of the fed DataFrame, as ``ctx.feed``; reading the counts waits until they are known."""

    path: str  # an Arrow IPC file, whole (footer included) once the part is final
    spec: FeedSpec
    state_dir: str  # where the task publishes its state

    def state(self, ready: Callable[[dict], bool] = lambda st: False) -> dict:
        """The task's published state once ``ready(state)`` holds or the part is final; waits on the wake-up FIFO."""
        import select

        wake, ended = _wake_fd(self.state_dir), False
        while True:
            with open(os.path.join(self.state_dir, STATE_FILE)) as f:
                st = json.load(f)
            if st["error"]:
                raise ConfigError(st["error"]) if st["error"].startswith("ConfigError: ") else RuntimeError(
                    f"the Spark task feeding this worker failed: {st['error']}")
            if st["final"] is not None or ready(st):
                return st
            if ended:
                raise RuntimeError("the Spark task stopped feeding this worker before its part of the data was "
                                   "complete")
            # the timeout covers a wake-up taken by another reader thread
            if select.select([wake], [], [], 0.5)[0]:
                with contextlib.suppress(BlockingIOError):
                    ended = not os.read(wake, 1 << 16)  # end-of-file: the task's writer is gone

    @property
    def rows_per_worker(self) -> tuple[int, ...]:
        return tuple(self.state(lambda s: s["counts"] is not None)["counts"])


@functools.lru_cache(maxsize=None)
def _wake_fd(workdir: str) -> int:
    return os.open(os.path.join(workdir, WAKE_FIFO), os.O_RDONLY | os.O_NONBLOCK)
