"""The train_fn half of ``tfnb.run(train_fn, data=df)``: ``ctx.dataset`` and ``ctx.steps_per_epoch``. It follows
the file the task writes (tfnb._task.feed) and never hands tf.data more rows than every worker has, so
MultiWorkerMirroredStrategy never waits for a batch that does not come."""
from __future__ import annotations

import itertools
import logging
from typing import Any, Iterator, Sequence

from ..errors import ConfigError
from .feed import FeedColumn, FeedInfo, _no_rows_message
from .spill import _MAGIC_BYTES

log = logging.getLogger(__name__)

_BLOCK_BYTES = 4 << 20  # rows handed from Python to tf.data at a time, cut into batches by tf.data


def _feed_of(ctx) -> FeedInfo:
    info = getattr(ctx, "feed", None)
    if info is None:
        raise ConfigError(
            "ctx.dataset() and ctx.steps_per_epoch() read the DataFrame given as tfnb.run(..., data=df), "
            "and this run has no data=; pass data=df to tfnb.run, or build the tf.data pipeline yourself")
    return info


def _check_batch_size(batch_size) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r} but it must be an int >= 1 (rows per batch on each worker)")


def _steps_for(rows_per_worker: Sequence[int], batch_size: int, drop_remainder: bool) -> int:
    per_worker = list(rows_per_worker)
    low = min(per_worker, default=0)
    if low == 0:
        raise ConfigError(_no_rows_message(per_worker))
    steps = low // batch_size if drop_remainder else -(-low // batch_size)
    if steps == 0:
        raise ConfigError(
            f"batch_size={batch_size} but the smallest worker's part of the data has {low} rows "
            f"(rows per worker: {per_worker}); lower batch_size to at most {low}, feed more rows, or pass "
            "drop_remainder=False\nEvery worker would get 0 batches: the workers take the same number of steps, "
            "the smallest part's full batches.")
    return steps


def steps_per_epoch(ctx, batch_size: int, *, drop_remainder: bool = True) -> int:
    """Batches per epoch that ``ctx.dataset(batch_size)`` yields on every worker: the smallest worker's rows //
    ``batch_size``, known at once when the driver counted them, else once every task has its whole partition.
    ConfigError: no ``data=`` in the run, or a worker has fewer than ``batch_size`` rows."""
    _check_batch_size(batch_size)
    return _steps_for(_feed_of(ctx).rows_per_worker, batch_size, drop_remainder)


def _label_dtype(col: FeedColumn) -> str:
    # integer labels stay class ids for sparse losses
    return "int64" if col.dtype.startswith("int") else "float32"


class _Part:
    """This worker's rows, read as the task writes them, as (features, label or None) numpy pieces. Sequential
    epochs hold about one Arrow batch; shuffled ones the whole feature matrix, once the whole part has arrived."""

    def __init__(self, info: FeedInfo, batch_size: int, feature_cols, label_col, drop_remainder: bool):
        columns = {c.name: c for c in info.spec.columns}
        names = list(columns)
        _check_batch_size(batch_size)
        if label_col is not None and label_col not in names:
            raise ConfigError(f"label_col={label_col!r} is not a fed column; the columns are {names}")
        if feature_cols is None:
            feature_cols = [n for n in names if n != label_col]
        feature_cols = [feature_cols] if isinstance(feature_cols, str) else list(feature_cols)
        unknown = [c for c in feature_cols if c not in names]
        if unknown:
            raise ConfigError(f"feature_cols has {unknown}, not among the fed columns {names}; "
                              "choose from those, or add the columns to the DataFrame given as data=")
        if not feature_cols:
            raise ConfigError(f"no feature columns: the data has only {names} and label_col={label_col!r}; "
                              "feed at least one feature column")
        if label_col is not None and label_col in feature_cols:
            raise ConfigError(f"label_col={label_col!r} is also in feature_cols; take it out of feature_cols")
        # Array lengths come with this worker's first batch; counts known by now are checked now.
        st = info.state(lambda s: s["lengths"] is not None)
        if st["counts"] is not None:
            _steps_for(st["counts"], batch_size, drop_remainder)
        self.info, self.batch_size, self.drop_remainder = info, batch_size, drop_remainder
        self.lengths = dict(st["lengths"] or {})
        self.features = tuple(columns[c] for c in feature_cols)
        self.label = columns[label_col] if label_col is not None else None
        self.width = sum(self.lengths[c.name] if c.is_array else 1 for c in self.features)
        self.label_width = self.lengths[self.label.name] if self.label is not None and self.label.is_array else None
        self._whole = None
        self._passes = 0

    def bound(self, st: dict) -> int:
        """Rows this worker may serve in an epoch, as far as ``st`` tells: exact once the counts are final, before
        that whole batches of the rows every worker has (never more than the final number)."""
        counts = st["counts"]
        if counts is None:
            return st["safe"] // self.batch_size * self.batch_size
        steps = _steps_for(counts, self.batch_size, self.drop_remainder)
        return min(min(counts), steps * self.batch_size)

    def _arrow_batches(self) -> Iterator:
        import pyarrow as pa

        pos = _MAGIC_BYTES
        end = self.info.state(lambda s: s["end"] > pos)["end"]
        if end <= pos:
            return  # final, without a batch
        with pa.OSFile(self.info.path) as f:  # reads, not a memory map: memory stays at a batch
            f.seek(pos)
            schema = pa.ipc.read_schema(pa.ipc.read_message(f))  # the first batch is whole: so is the schema
            while end > pos:
                while f.tell() < end:
                    yield pa.ipc.read_record_batch(pa.ipc.read_message(f), schema)
                pos = end
                end = self.info.state(lambda s: s["end"] > pos)["end"]

    def _values(self, col: FeedColumn, batch, dtype: str):
        import numpy as np

        arr = batch.column(col.name)
        values = np.asarray((arr.flatten() if col.is_array else arr).to_numpy(zero_copy_only=False), dtype=dtype)
        return values.reshape(batch.num_rows, self.lengths[col.name]) if col.is_array else values

    def _convert(self, batch):
        import numpy as np

        if len(self.features) == 1 and self.features[0].is_array:
            x = self._values(self.features[0], batch, "float32")
        else:
            # 64-byte aligned, so TensorFlow takes the matrix without copying it again
            buf = np.empty(batch.num_rows * self.width * 4 + 64, dtype="uint8")
            at = -buf.ctypes.data % 64
            x = buf[at:at + batch.num_rows * self.width * 4].view("float32").reshape(batch.num_rows, self.width)
            j = 0
            for c in self.features:
                w = self.lengths[c.name] if c.is_array else 1
                x[:, j:j + w] = self._values(c, batch, "float32").reshape(batch.num_rows, w)
                j += w
        y = None if self.label is None else self._values(self.label, batch, _label_dtype(self.label))
        return x, y

    def _sequential(self) -> Iterator:
        """The epoch in file order, each Arrow batch as it is, up to what every worker has."""
        given = 0  # rows handed out this epoch
        limit = self.bound(self.info.state(lambda s: True))
        for batch in self._arrow_batches():
            x, y = self._convert(batch)
            at = 0
            while at < len(x):
                if given >= limit:  # wait until every worker has more (or the counts are final)
                    limit = self.bound(self.info.state(lambda s: self.bound(s) > given))
                    if given >= limit:
                        return
                n = min(len(x) - at, limit - given)
                yield x[at:at + n], None if y is None else y[at:at + n]
                given += n
                at += n

    def _shuffled(self, rows: int, seed: int | None, epoch: int) -> Iterator:
        import numpy as np

        take = self.bound(self.info.state())
        if self._whole is None:  # this worker has rows: bound() refused a worker without
            xs, ys = zip(*[self._convert(b) for b in self._arrow_batches()])
            self._whole = (np.concatenate(xs), None if self.label is None else np.concatenate(ys))
        x, y = self._whole
        rng = np.random.default_rng(None if seed is None else [seed, epoch])
        order = rng.permutation(len(x))[:take]
        for a in range(0, len(order), rows):
            idx = order[a:a + rows]
            yield x[idx], None if y is None else y[idx]

    def epoch(self, rows: int, shuffle: bool, seed: int | None) -> Iterator:
        """One epoch of (features, label or None) pieces; shuffled epoch k draws order ``(seed, k)``."""
        self._passes += 1
        return self._shuffled(rows, seed, self._passes - 1) if shuffle else self._sequential()


def _replicas_per_worker(ctx, strategy, batch_size: int) -> int:
    total = int(strategy.num_replicas_in_sync)
    workers = max(1, ctx.num_workers)
    per_worker = total // workers if total % workers == 0 else 0
    if per_worker < 1:
        raise ConfigError(
            f"strategy has {total} replicas in sync, which is not a whole number per worker for "
            f"num_workers={workers}; pass the run's tf.distribute.MultiWorkerMirroredStrategy()")
    if batch_size % per_worker:
        raise ConfigError(
            f"batch_size={batch_size} does not split evenly over this worker's {per_worker} replicas; "
            f"use a multiple of {per_worker}")
    return per_worker


def worker_dataset(ctx, batch_size: int, *, feature_cols: Sequence[str] | None = None,
                   label_col: str | None = None, epochs: int | None | str = "auto",
                   shuffle: bool = False, seed: int | None = None, drop_remainder: bool = True,
                   strategy: Any = None):
    """This worker's part of ``tfnb.run(..., data=df)`` as a tf.data dataset (``ctx.dataset``; guide: docs/data.md)
    with ``steps_per_epoch(ctx, batch_size)`` batches per epoch on every worker, so MultiWorkerMirroredStrategy never
    hangs. Elements are ``(features, label)``, or ``features`` alone without ``label_col``: a float32 ``[batch,
    width]`` matrix of the feature columns side by side; the label int64 for an integer column, else float32.

    Args:
        ctx: the WorkerContext of a run given ``data=``.
        batch_size: rows per step on this worker.
        feature_cols: columns that make up ``features``; default: every fed column but ``label_col``.
        label_col: the label column; None yields features only (e.g. for ``model.predict``).
        epochs: passes over the data per iteration of the dataset, None forever; ``"auto"``: 1 (``fit(epochs=N)``
            iterates it again), None with ``strategy`` (Keras does not restart a distributed dataset).
        shuffle: each epoch's rows in a new random order (holds this worker's feature matrix in memory).
        seed: makes ``shuffle`` repeatable.
        drop_remainder: False adds one smaller last batch per epoch, not counted by ``ctx.steps_per_epoch``; not
            with ``strategy``.
        strategy: the run's ``tf.distribute.MultiWorkerMirroredStrategy`` (needed with several workers, else
            ``fit`` splits each batch across all workers again): a distributed dataset of global batch
            ``batch_size * num_workers`` whose replicas take this worker's rows.

    Returns:
        A ``tf.data.Dataset`` of whole batches (known cardinality, auto-sharding and autotuning off), or with
        ``strategy`` a ``tf.distribute.DistributedDataset``.

    Raises:
        ConfigError: no ``data=``, unknown columns, ``batch_size`` above the smallest worker's rows, bad
            ``epochs``, ``drop_remainder=False`` with ``strategy``.

    Example:
        >>> ds = ctx.dataset(64, label_col="label", shuffle=True, seed=1, strategy=strategy)
        >>> model.fit(ds, epochs=3, steps_per_epoch=ctx.steps_per_epoch(64))
    """
    info = _feed_of(ctx)
    if epochs == "auto":
        epochs = None if strategy is not None else 1
    elif epochs is not None and (not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1):
        raise ConfigError(f"epochs={epochs!r} but it must be an int >= 1, None to repeat forever, or 'auto'")
    if strategy is not None and not drop_remainder:
        raise ConfigError("drop_remainder=False does not combine with strategy=: a distributed dataset "
                          "needs whole batches on every replica; leave drop_remainder=True")
    part = _Part(info, batch_size, feature_cols, label_col, drop_remainder)
    from .._deps import require

    tf = require("tensorflow", "ctx.dataset()")
    if strategy is None:
        if ctx.num_workers > 1:
            log.warning(
                "ctx.dataset() without strategy= on a %d-worker run: model.fit (through "
                "strategy.experimental_distribute_dataset) would split each of this worker's batches across "
                "all workers again and end every epoch after 1/%d of the data; pass strategy=strategy",
                ctx.num_workers, ctx.num_workers)
        return _dataset(tf, part, batch_size, epochs, shuffle, seed, drop_remainder)
    replicas = _replicas_per_worker(ctx, strategy, batch_size)
    return strategy.distribute_datasets_from_function(
        lambda input_context: _dataset(tf, part, batch_size // replicas, epochs, shuffle, seed, True))


def _dataset(tf, part: _Part, rows: int, epochs: int | None, shuffle: bool, seed: int | None,
             drop_remainder: bool):
    """tf.data over ``part``: the generator hands over pieces of many batches, which ``rebatch`` cuts in C++ (one
    Python call per piece, not per batch: about 2.5x faster for small batches)."""
    block = rows * max(1, _BLOCK_BYTES // (rows * 4 * (part.width + (part.label_width or 1))))
    x_spec = tf.TensorSpec((None, part.width), tf.float32)
    if part.label is None:
        signature = x_spec
    else:
        y_shape = (None,) if part.label_width is None else (None, part.label_width)
        signature = (x_spec, tf.TensorSpec(y_shape, tf.as_dtype(_label_dtype(part.label))))

    def generate():
        for _ in range(epochs) if epochs is not None else itertools.count():
            for x, y in part.epoch(block, shuffle, seed):
                yield x if y is None else (x, y)

    # one epoch's batch sizes, cycled by rebatch: a short last batch needs the final counts
    st = part.info.state(lambda s: drop_remainder or s["counts"] is not None)
    final = st["counts"] is not None
    full, rest = divmod(part.bound(st), rows) if final else (0, 0)
    sizes = rows if rest == 0 else [rows] * full + [rest]
    ds = tf.data.Dataset.from_generator(generate, output_signature=signature)
    ds = ds.rebatch(sizes, drop_remainder=drop_remainder and rest == 0)
    if epochs is None:
        ds = ds.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
    elif final:
        ds = ds.apply(tf.data.experimental.assert_cardinality((full + (rest > 0)) * epochs))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    # autotuning's bookkeeping made an epoch take one time or twice that, at random (docs/data.md)
    options.autotune.enabled = False
    return ds.with_options(options).prefetch(2)
