"""The train_fn half of ``tfnb.run(train_fn, data=df)``: ``ctx.dataset`` and ``ctx.steps_per_epoch``. It follows
the file the task writes (tfnb._task.feed) and never hands tf.data more rows than every worker has, so
MultiWorkerMirroredStrategy never waits for a batch that does not come."""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from ..errors import ConfigError
from .feed import _BLOCK_BYTES, FeedColumn, FeedInfo, _no_rows_message
from .spill import _MAGIC_BYTES

log = logging.getLogger(__name__)


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

    Raises:
        ConfigError: the run has no ``data=``, or a worker has fewer than ``batch_size`` rows.

    Example:
        >>> ds = ctx.dataset(64, label_col="y", strategy=strategy)
        >>> model.fit(ds, epochs=5, steps_per_epoch=ctx.steps_per_epoch(64))
    """
    _check_batch_size(batch_size)
    return _steps_for(_feed_of(ctx).rows_per_worker, batch_size, drop_remainder)


def _label_dtype(col: FeedColumn) -> str:
    # integer labels stay class ids for sparse losses
    return "int64" if col.dtype.startswith("int") else "float32"


@dataclass(frozen=True)
class _Plan:
    features: tuple[FeedColumn, ...]
    label: FeedColumn | None
    lengths: tuple[tuple[str, int], ...]
    width: int
    label_width: int | None   # elements per row for an array label, None for a scalar label
    batch_size: int
    drop_remainder: bool

    def bound(self, st: dict) -> int:
        """Rows this worker may serve in an epoch, as far as ``st`` tells: exact once the counts are final, before
        that whole batches of the rows every worker has (never more than the final number)."""
        counts = st["counts"]
        if counts is None:
            return st["safe"] // self.batch_size * self.batch_size
        steps = _steps_for(counts, self.batch_size, self.drop_remainder)
        return min(min(counts), steps * self.batch_size)


def _plan(info: FeedInfo, batch_size: int, feature_cols, label_col, drop_remainder: bool) -> _Plan:
    spec = info.spec
    names = spec.names
    _check_batch_size(batch_size)
    if label_col is not None and label_col not in names:
        raise ConfigError(f"label_col={label_col!r} is not a fed column; the columns are {list(names)}")
    if feature_cols is None:
        feature_cols = [n for n in names if n != label_col]
    elif isinstance(feature_cols, str):
        feature_cols = [feature_cols]
    feature_cols = list(feature_cols)
    unknown = [c for c in feature_cols if c not in names]
    if unknown:
        raise ConfigError(f"feature_cols has {unknown}, not among the fed columns {list(names)}; "
                          "choose from those, or add the columns to the DataFrame given as data=")
    if not feature_cols:
        raise ConfigError(f"no feature columns: the data has only {list(names)} and label_col={label_col!r}; "
                          "feed at least one feature column")
    if label_col is not None and label_col in feature_cols:
        raise ConfigError(f"label_col={label_col!r} is also in feature_cols; take it out of feature_cols")
    # Array lengths come with this worker's first batch; counts known by now are checked now.
    st = info.state(lambda s: s["lengths"] is not None)
    lengths = dict(st["lengths"] or {})
    features = tuple(spec.column(c) for c in feature_cols)
    label = spec.column(label_col) if label_col is not None else None
    if st["counts"] is not None:
        _steps_for(st["counts"], batch_size, drop_remainder)
    width = sum(lengths[c.name] if c.is_array else 1 for c in features)
    label_width = lengths[label.name] if label is not None and label.is_array else None
    return _Plan(features, label, tuple(sorted(lengths.items())), width, label_width, batch_size, drop_remainder)


class _Part:
    """This worker's rows as numpy pieces, read as the task writes them. Sequential epochs hold about one Arrow
    batch; shuffled ones the whole feature matrix, once the whole part has arrived."""

    def __init__(self, info: FeedInfo, plan: _Plan):
        self.info = info
        self._plan = plan
        self._lengths = dict(plan.lengths)
        self._whole = None
        self._passes = 0

    def _arrow_batches(self) -> Iterator:
        import pyarrow as pa

        pos, schema, f = _MAGIC_BYTES, None, None
        try:
            while True:
                end = self.info.state(lambda s: s["end"] > pos)["end"]
                if end <= pos:
                    return  # final, and every batch read
                if f is None:
                    f = pa.OSFile(self.info.path)  # reads, not a memory map: memory stays at a batch
                f.seek(pos)
                while f.tell() < end:
                    msg = pa.ipc.read_message(f)
                    if schema is None:
                        schema = pa.ipc.read_schema(msg)
                    else:
                        yield pa.ipc.read_record_batch(msg, schema)
                pos = end
        finally:
            if f is not None:
                f.close()

    def _values(self, col: FeedColumn, batch, dtype: str):
        import numpy as np

        arr = batch.column(col.name)
        n = batch.num_rows
        if col.is_array:
            flat = arr.flatten().to_numpy(zero_copy_only=False)
            return np.asarray(flat, dtype=dtype).reshape(n, self._lengths[col.name])
        return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)

    def _convert(self, batch):
        import numpy as np

        plan = self._plan
        if len(plan.features) == 1 and plan.features[0].is_array:
            x = self._values(plan.features[0], batch, "float32")
        else:
            # 64-byte aligned, so TensorFlow takes the matrix without copying it again
            buf = np.empty(batch.num_rows * plan.width * 4 + 64, dtype="uint8")
            at = -buf.ctypes.data % 64
            x = buf[at:at + batch.num_rows * plan.width * 4].view("float32").reshape(batch.num_rows, plan.width)
            j = 0
            for c in plan.features:
                v = self._values(c, batch, "float32")
                w = v.shape[1] if v.ndim == 2 else 1
                x[:, j:j + w] = v.reshape(batch.num_rows, w)
                j += w
        y = None if plan.label is None else self._values(plan.label, batch, _label_dtype(plan.label))
        return x, y

    def _sequential(self) -> Iterator:
        """The epoch in file order, each Arrow batch as it is, up to what every worker has."""
        plan, info = self._plan, self.info
        given = 0  # rows handed out this epoch
        limit = plan.bound(info.state(lambda s: True))
        for batch in self._arrow_batches():
            x, y = self._convert(batch)
            at = 0
            while at < len(x):
                if given >= limit:  # wait until every worker has more (or the counts are final)
                    limit = plan.bound(info.state(lambda s: plan.bound(s) > given))
                    if given >= limit:
                        return
                n = min(len(x) - at, limit - given)
                yield x[at:at + n], None if y is None else y[at:at + n]
                given += n
                at += n

    def _shuffled(self, rows: int, seed: int | None, epoch: int) -> Iterator:
        import numpy as np

        take = self._plan.bound(self.info.state())
        if self._whole is None:
            parts = [self._convert(b) for b in self._arrow_batches()]
            x = np.concatenate([p[0] for p in parts])
            y = None if self._plan.label is None else np.concatenate([p[1] for p in parts])
            self._whole = (x, y)
        x, y = self._whole
        rng = np.random.default_rng(None if seed is None else [seed, epoch])
        order = rng.permutation(len(x))[:take]
        for a in range(0, len(order), rows):
            idx = order[a:a + rows]
            yield x[idx], None if y is None else y[idx]

    def epoch(self, rows: int, shuffle: bool, seed: int | None) -> Iterator:
        """One epoch of (features, label or None) pieces; with ``shuffle`` and a ``seed``, epoch k draws order
        ``(seed, k)``."""
        self._passes += 1
        if shuffle:
            return self._shuffled(rows, seed, self._passes - 1)
        return self._sequential()


def _epochs_arg(epochs, strategy):
    if epochs == "auto":
        return None if strategy is not None else 1
    if epochs is not None and (not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1):
        raise ConfigError(f"epochs={epochs!r} but it must be an int >= 1, None to repeat forever, or 'auto'")
    return epochs


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
    """This worker's part of ``tfnb.run(..., data=df)`` as a tf.data dataset (``ctx.dataset``; docs/data.md).

    Every worker yields ``steps_per_epoch(ctx, batch_size)`` batches per epoch (the smallest worker's rows), so
    MultiWorkerMirroredStrategy never hangs; rows beyond that are left out (other ones each epoch with ``shuffle``).
    Elements are ``(features, label)`` (``features`` alone without ``label_col``): ``features`` a float32
    ``[batch, width]`` matrix of the feature columns side by side; ``label`` int64 for an integer column, else
    float32, ``[batch]`` or ``[batch, length]`` for an array column. With several workers pass ``strategy=``, else
    ``fit`` splits each of this worker's batches across all workers again.

    Args:
        ctx: the WorkerContext of a run given ``data=``.
        batch_size: rows per step on this worker.
        feature_cols: columns that make up ``features``; default: every fed column but ``label_col``.
        label_col: the label column; None yields features only (e.g. for ``model.predict``).
        epochs: passes over the data in one iteration of the dataset; None repeats forever. The default ``"auto"``
            is 1 for a plain dataset (``fit(epochs=N)`` iterates it again) and None with ``strategy`` (Keras does
            not restart a distributed dataset).
        shuffle: draw each epoch's rows in a new random order (holds this worker's feature matrix in memory).
        seed: makes ``shuffle`` repeatable.
        drop_remainder: False adds one smaller last batch per epoch, which ``ctx.steps_per_epoch`` does not count
            (batches then have an unknown first dimension). Not with ``strategy``.
        strategy: the run's ``tf.distribute.MultiWorkerMirroredStrategy``: return a distributed dataset (global
            batch ``batch_size * num_workers``) that gives each worker's replicas this worker's rows.

    Returns:
        A ``tf.data.Dataset`` of whole batches (known cardinality, auto-sharding and tf.data autotuning off), or
        with ``strategy`` a ``tf.distribute.DistributedDataset``.

    Raises:
        ConfigError: no ``data=`` in this run, unknown columns, ``batch_size`` larger than the smallest worker's
            row count, bad ``epochs``, ``drop_remainder=False`` with ``strategy``.

    Example:
        >>> def train_fn(ctx):
        ...     import tensorflow as tf
        ...     strategy = tf.distribute.MultiWorkerMirroredStrategy()
        ...     with strategy.scope():
        ...         model = make_model()
        ...     ds = ctx.dataset(64, label_col="label", shuffle=True, seed=1, strategy=strategy)
        ...     return model.fit(ds, epochs=3, steps_per_epoch=ctx.steps_per_epoch(64)).history
        >>> tfnb.run(train_fn, num_workers=2, data=df)
    """
    info = _feed_of(ctx)
    epochs = _epochs_arg(epochs, strategy)
    if strategy is not None and not drop_remainder:
        raise ConfigError("drop_remainder=False does not combine with strategy=: a distributed dataset "
                          "needs whole batches on every replica; leave drop_remainder=True")
    plan = _plan(info, batch_size, feature_cols, label_col, drop_remainder)
    from .._deps import require

    tf = require("tensorflow", "ctx.dataset()")
    if strategy is None:
        if ctx.num_workers > 1:
            log.warning(
                "ctx.dataset() without strategy= on a %d-worker run: model.fit (through "
                "strategy.experimental_distribute_dataset) would split each of this worker's batches across "
                "all workers again and end every epoch after 1/%d of the data; pass strategy=strategy",
                ctx.num_workers, ctx.num_workers)
        return _dataset(tf, _Part(info, plan), plan, batch_size, epochs, shuffle, seed, drop_remainder)
    replicas = _replicas_per_worker(ctx, strategy, batch_size)
    part = _Part(info, plan)
    return strategy.distribute_datasets_from_function(
        lambda input_context: _dataset(tf, part, plan, batch_size // replicas, epochs, shuffle, seed, True))


def _dataset(tf, part: _Part, plan: _Plan, rows: int, epochs: int | None, shuffle: bool,
             seed: int | None, drop_remainder: bool):
    """tf.data over ``part``: the generator hands over pieces of many batches, which ``rebatch`` cuts in C++ (one
    Python call per piece, not per batch: about 2.5x faster for small batches)."""
    block = rows * max(1, _BLOCK_BYTES // (rows * 4 * (plan.width + (plan.label_width or 1))))
    x_spec = tf.TensorSpec((None, plan.width), tf.float32)
    if plan.label is None:
        signature = x_spec
    else:
        y_shape = (None,) if plan.label_width is None else (None, plan.label_width)
        signature = (x_spec, tf.TensorSpec(y_shape, tf.as_dtype(_label_dtype(plan.label))))

    def generate():
        for _ in range(epochs) if epochs is not None else itertools.count():
            for x, y in part.epoch(block, shuffle, seed):
                yield x if y is None else (x, y)

    # one epoch's batch sizes, cycled by rebatch: a short last batch needs the final counts
    st = part.info.state(lambda s: drop_remainder or s["counts"] is not None)
    final = st["counts"] is not None
    full, rest = divmod(plan.bound(st), rows) if final else (0, 0)
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
