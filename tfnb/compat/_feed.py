"""RDD rows -> TensorFlowOnSpark's ``DataFeed`` in each node, through ``LaunchHooks.feeder`` of :func:`tfnb.run`:
:func:`feed` gives each feeding node one contiguous range of pickled chunks in RDD order (and cuts inference results
back into the input partitions), :class:`RddFeeder` spills it in the task, :class:`FeedManager` hands it out."""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
from dataclasses import dataclass, replace
from itertools import accumulate, count, islice
from typing import Callable, Iterable, Iterator, Sequence

from ..errors import ConfigError

log = logging.getLogger(__name__)

SCHEMA = "part int, seq int, rows int, data binary"
SPILL_FILE = "tfnb-compat-feed.arrow"
TRAIN, INFERENCE = "train", "inference"

# Chunks hold at most this many rows and grow toward this many pickled bytes (a chunk of images stays a few MB).
_CHUNK_ROWS = 1000
_CHUNK_BYTES = 1 << 20
_FIRST_CHUNK_ROWS = 16


def _chunk_partition(index: int, rows: Iterator) -> Iterator[tuple]:
    """(part, seq, rows, pickled list of rows) for one RDD partition, in row order."""
    rows = iter(rows)  # islice must consume it, not restart
    per_chunk = _FIRST_CHUNK_ROWS
    for seq in count():
        buf = list(islice(rows, per_chunk))
        if not buf:
            return
        blob = pickle.dumps(buf, protocol=pickle.HIGHEST_PROTOCOL)
        yield index, seq, len(buf), blob
        per_row = max(1, len(blob) // len(buf))
        per_chunk = max(1, min(_CHUNK_ROWS, _CHUNK_BYTES // per_row))


def ranges(total: int, ranks: Sequence[int], mode: str) -> tuple[tuple[int, int, int], ...]:
    """(rank, first row, end row) per feeding node, in node order; ``train`` leaves the remainder out so every node
    gets as many rows (10 rows on 3 nodes: 0-3, 3-6, 6-9; ``inference``: 0-3, 3-6, 6-10)."""
    n = len(ranks)
    if mode == TRAIN:
        total -= total % n
    return tuple((r, i * total // n, (i + 1) * total // n) for i, r in enumerate(ranks))


def _assigner(part_start: Sequence[int], bounds: Sequence[tuple[int, int, int]]):
    """mapPartitionsWithIndex function: cached chunks -> (rank, chunk piece) by global row range."""

    def assign(index: int, chunks: Iterator[tuple]) -> Iterator[tuple]:
        offset = part_start[index]
        for part, seq, rows, blob in chunks:
            lo, hi = offset, offset + rows
            offset = hi
            loaded = None
            for rank, b_lo, b_hi in bounds:
                s, e = max(lo, b_lo), min(hi, b_hi)
                if s == lo and e == hi:
                    yield rank, (part, seq, rows, blob)
                elif s < e:  # only chunks straddling two nodes' ranges are unpickled and cut
                    if loaded is None:
                        loaded = pickle.loads(blob)
                    piece = pickle.dumps(loaded[s - lo:e - lo], protocol=pickle.HIGHEST_PROTOCOL)
                    yield rank, (part, seq, e - s, piece)

    return assign


def feed(spark, rdd, run_nodes: Callable, *, num_tasks: int, feed_ranks: Sequence[int], mode: str, epochs: int):
    """``run_nodes(df, feeder)`` with ``rdd`` chunked, counted and cached meanwhile, as one DataFrame partition per
    barrier task (``feed_ranks`` are the tasks that read data); for ``inference`` the nodes' results as an RDD
    partitioned like the input, in row order."""
    from pyspark import RDD, StorageLevel

    if not isinstance(rdd, RDD):
        raise ConfigError(
            f"dataRDD must be a Spark RDD, got {type(rdd).__name__}; for a DataFrame pass df.rdd, or feed "
            "the DataFrame with tfnb.run(train_fn, data=df)")
    chunks = rdd.mapPartitionsWithIndex(_chunk_partition).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        part_rows = tuple(chunks.mapPartitions(lambda part: [sum(c[2] for c in part)]).collect())
        total = sum(part_rows)
        if mode == TRAIN and total < len(feed_ranks):
            raise ConfigError(
                f"cluster.train() got an RDD of {total} rows for {len(feed_ranks)} worker nodes, so a node "
                "would get no data; feed at least one row per node (more for whole batches), or lower "
                "num_executors")
        bounds = ranges(total, feed_ranks, mode)
        used = bounds[-1][2] if bounds else 0
        if used < total:
            log.info("feeding %d rows to each of %d nodes; %d rows left over are not fed",
                     (used // len(feed_ranks)), len(feed_ranks), total - used)
        starts = tuple(accumulate(part_rows, initial=0))
        per_rank = [None] * num_tasks
        if total:  # inference over no rows starts no node
            placed = (chunks.mapPartitionsWithIndex(_assigner(starts, bounds))
                      .partitionBy(num_tasks, lambda rank: rank).values())
            per_rank = run_nodes(spark.createDataFrame(placed, SCHEMA, verifySchema=False),
                                 RddFeeder(mode=mode, epochs=epochs))
    finally:
        with contextlib.suppress(Exception):  # the session may be gone; nothing left to free
            chunks.unpersist()
    if mode != INFERENCE:
        return None
    flat = [result for rank, _, _ in bounds for result in per_rank[rank] or ()]
    per_part = [flat[lo:hi] for lo, hi in zip(starts, starts[1:])]
    if not per_part:
        return spark.sparkContext.emptyRDD()
    # One element per slice, so slice i is exactly input partition i's results.
    return spark.sparkContext.parallelize(per_part, len(per_part)).flatMap(lambda results: results)


@dataclass(frozen=True)
class RddFeeder:
    """The launcher's ``LaunchHooks.feeder``; once :meth:`spill` wrote a task's chunks, also this node's rows
    (``ctx.feed`` of the tfnb run), read by :class:`FeedManager`."""

    mode: str
    epochs: int
    path: str = ""
    rows: int = 0

    def spill(self, batches: Iterable, workdir: str) -> "RddFeeder":
        import pyarrow as pa
        import pyarrow.compute as pc

        from ..launcher import ArrowSpill

        schema = pa.schema([("part", pa.int32()), ("seq", pa.int32()), ("rows", pa.int32()), ("data", pa.binary())])
        rows = 0
        with contextlib.closing(ArrowSpill(os.path.join(workdir, SPILL_FILE), schema)) as spill:
            for batch in batches:
                if batch.num_rows:
                    spill.write(pa.RecordBatch.from_arrays(
                        [batch.column(n).cast(schema.field(n).type) for n in schema.names], schema=schema))
                    rows += int(pc.sum(batch.column("rows")).as_py() or 0)
        return replace(self, path=spill.path, rows=rows)

    def finish(self, spilled: "RddFeeder", rows_per_task: Sequence[int]) -> "RddFeeder":
        return spilled  # the driver fixed every node's rows; the other nodes' counts change nothing


class FeedManager:
    """``ctx.mgr``: this node's rows, handed out in order ``epochs`` times to its DataFeeds, and their results."""

    def __init__(self, feed: RddFeeder | None = None):
        self.feed = feed         # None in InputMode.TENSORFLOW
        self.results: list = []
        self.handed = 0
        self.terminated = False
        self._chunks: Iterator | None = None  # opened by the first DataFeed
        self._rows: list = []    # the current chunk's rows not handed out yet
        self._part_ends = True   # the current chunk is the last of its input partition (or of the epoch)

    def open(self) -> None:
        if self.feed is None:
            raise ConfigError(
                "TFNode.DataFeed reads the RDD given to cluster.train()/inference(), but this cluster runs "
                "InputMode.TENSORFLOW; start it with input_mode=TFCluster.InputMode.SPARK, or read "
                "the data in map_fun\n"
                "Under InputMode.TENSORFLOW map_fun reads its own data (tf.data); under InputMode.SPARK "
                "(TFCluster.run(..., input_mode=TFCluster.InputMode.SPARK)) cluster.train(rdd) feeds it.")
        if self._chunks is None:
            import pyarrow as pa
            import pyarrow.compute as pc

            table = pa.ipc.open_file(pa.memory_map(self.feed.path, "r")).read_all()
            order = pc.sort_indices(table, [("part", "ascending"), ("seq", "ascending")]).to_pylist()
            self._chunks = _read_chunks(table.column("data"), order, table.column("part").to_pylist(), self.feed.epochs)

    @property
    def exhausted(self) -> bool:
        return self.terminated or self.handed >= self.feed.rows * self.feed.epochs

    def take(self, n: int, *, stop_at_partition: bool) -> list:
        """Up to ``n`` rows; fewer at the end, or at an input partition's end when ``stop_at_partition``."""
        out: list = []
        while len(out) < n and not self.exhausted:
            if not self._rows:
                chunk = None if out and stop_at_partition and self._part_ends else next(self._chunks, None)
                if chunk is None:
                    break
                self._rows, self._part_ends = chunk
            got = self._rows[:n - len(out)]
            del self._rows[:len(got)]
            out += got
            self.handed += len(got)
        return out

    def terminate(self) -> None:
        self.terminated = True
        self._rows = []

    def __repr__(self) -> str:
        if self.feed is None:
            return "FeedManager(no feed: InputMode.TENSORFLOW)"
        return f"FeedManager({self.feed.mode}, rows={self.feed.rows}, epochs={self.feed.epochs})"


def _read_chunks(data, order: list, part: list, epochs: int) -> Iterator[tuple[list, bool]]:
    """(rows, whether it is its input partition's last chunk) for each chunk in ``order``, ``epochs`` times."""
    for _ in range(epochs):
        for pos, i in enumerate(order):
            last = pos + 1 == len(order) or part[order[pos + 1]] != part[i]
            yield pickle.loads(data[i].as_py()), last
