"""Spark DataFrame -> tf.data, the driver's half of ``tfnb.run(train_fn, data=df)``: :func:`feed_spec` checks the
schema, :func:`split_for_workers` gives one balanced partition per worker (``tfnb._task.feed`` streams it to the
task), :func:`agree_counts` agrees on the rows every worker serves."""
from __future__ import annotations

import logging
from typing import Any

from .._protocol import Msg
from .._task.feed import FeedColumn, FeedSpec
from .._config import setting
from ..errors import ConfigError

log = logging.getLogger(__name__)

# One partition per worker is fed as it is when equalising the batches drops at most this share of the rows.
_MAX_IMBALANCE = 0.01
# The fed partitions go to /dev/shm when they fit in this share of a host's free memory (TFNB_SPILL_MEMORY).
_SPILL_MEMORY = 0.5
# Spark type class name -> numpy dtype of the values as they arrive in Arrow.
_NUMERIC = {"ByteType": "int8", "ShortType": "int16", "IntegerType": "int32", "LongType": "int64",
            "FloatType": "float32", "DoubleType": "float64", "BooleanType": "bool"}
_HINTS = {"VectorUDT": "convert with pyspark.ml.functions.vector_to_array(col)", "DecimalType": "cast to double",
          "ArrayType": "cast to array<float>", "NestedArray": "flatten with F.flatten(col)",
          "StringType": "index or encode it (e.g. pyspark.ml.feature.StringIndexer), or drop it"}


def numeric(dtype) -> tuple[str, bool] | None:
    """(numpy dtype, is an array) of a Spark number or array of numbers, else None."""
    array = type(dtype).__name__ == "ArrayType"
    kind = _NUMERIC.get(type(dtype.elementType if array else dtype).__name__)
    return (kind, array) if kind else None


def check_dataframe(df, name: str) -> None:
    if not (hasattr(df, "schema") and hasattr(df, "mapInArrow")):
        raise ConfigError(f"{name} must be a Spark DataFrame, got {type(df).__name__}; convert it with "
                          "spark.createDataFrame(...) or read it with spark.read")


def unsupported_hint(dtype) -> str:
    """How to make a column of Spark type ``dtype`` a number or an array of numbers."""
    kind = type(dtype).__name__
    if kind == "ArrayType" and type(dtype.elementType).__name__ == "ArrayType":
        kind = "NestedArray"
    return _HINTS.get(kind, "cast to a number or drop it")


def feed_spec(df) -> FeedSpec:
    """``data=df``'s columns described for the tasks: numeric ones and arrays of numbers (the same length on every
    row, read from the data). ConfigError for anything else, named with the cast or drop that fixes it."""
    check_dataframe(df, "data")
    schema = df.schema
    names = [f.name for f in schema.fields]
    if not names:
        raise ConfigError("data has no columns; select the feature and label columns to feed")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"data has more than one column named {', '.join(map(repr, dupes))}; rename them "
                          "(df.toDF(*new_names) or .alias) so each column can be chosen by name")
    columns, bad = [], []
    for f in schema.fields:
        found = numeric(f.dataType)
        if found:
            columns.append(FeedColumn(f.name, *found))
        else:
            bad.append((f"{f.name!r} ({f.dataType.simpleString()}", unsupported_hint(f.dataType)))
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise ConfigError(
            f"data= has columns tfnb cannot feed: {', '.join(name + ')' for name, _ in bad[:3])}{more}; cast them "
            "(F.col(c).cast('double')) or drop them before tfnb.run(data=df)\n"
            "tfnb feeds numeric columns and fixed-length arrays of numbers. "
            + "; ".join(f"{name}: {hint})" for name, hint in bad)
            + ". Drop columns with df.drop(...) or df.select(feature_and_label_columns).")
    share = setting("spill_memory", None, _SPILL_MEMORY, float)
    if not 0 <= share <= 1:
        raise ConfigError(f"TFNB_SPILL_MEMORY={share} but it must be a share of free memory between 0 and 1 "
                          "(0 writes the fed data to Spark's local disk); fix or unset TFNB_SPILL_MEMORY")
    return FeedSpec(tuple(columns), nbytes=cached_nbytes(df), memory_share=share)


def _is_cached(df) -> bool:
    try:
        level = df.storageLevel
    except Exception as e:  # noqa: BLE001 - a session that cannot say: treat as not cached
        log.debug("storageLevel unavailable: %s", e)
        return False
    return bool(level.useMemory or level.useDisk or level.useOffHeap)


def _cached_partition_rows(df) -> list[int]:
    """Rows in each partition of a cached ``df``: one job in the JVM over the cache, no column values."""
    from pyspark.sql import functions as F

    found = {int(r["p"]): int(r["n"]) for r in
             df.select(F.spark_partition_id().alias("p")).groupBy("p").agg(F.count(F.lit(1)).alias("n")).collect()}
    n = df.rdd.getNumPartitions() if hasattr(df, "_jdf") else max(found, default=-1) + 1  # Connect: from the counts
    return [found.get(i, 0) for i in range(n)]


def cached_nbytes(df) -> int | None:
    """The size of a cached, materialised ``df`` in Spark's cache (classic sessions), else None."""
    try:
        rel = df._jdf.queryExecution().optimizedPlan()
        if rel.getClass().getSimpleName() != "InMemoryRelation" or not rel.cacheBuilder().isCachedColumnBuffersLoaded():
            return None
        size = rel.computeStats().sizeInBytes()  # a Scala BigInt: an int through Py4J, or its object
        return int(size if isinstance(size, int) else size.toString()) or None
    except Exception as e:  # noqa: BLE001 - Spark Connect, or a plan this Spark shapes differently
        log.debug("cached size not readable: %s", e)
        return None


def _split_evenly(df, n: int) -> bool:
    """``df`` is a cached ``repartition(n)`` (or one partition for one worker), so balanced by construction."""
    try:
        rel = df._jdf.queryExecution().optimizedPlan()
        if rel.getClass().getSimpleName() != "InMemoryRelation":
            return False
        plan = rel.cachedPlan()
        if plan.getClass().getSimpleName() == "AdaptiveSparkPlanExec":
            plan = plan.inputPlan()
        part = plan.outputPartitioning()
        kind = part.getClass().getSimpleName()
        if n == 1:
            return kind.startswith("SinglePartition")
        return (plan.getClass().getSimpleName() == "ShuffleExchangeExec"
                and kind == "RoundRobinPartitioning" and part.numPartitions() == n)
    except Exception as e:  # noqa: BLE001 - Spark Connect, or a plan this Spark shapes differently: count
        log.debug("cached plan not readable: %s", e)
        return False


def split_for_workers(df, num_workers: int, num_ps: int = 0) -> tuple[Any, list[int] | None]:
    """``(part, counts)``: ``df`` as ``num_workers + num_ps`` balanced partitions (partition i feeds task i), and their
    rows when a counting job gave them. A cached DataFrame of that many (nearly) equal partitions is fed as it is
    (``df.repartition(n).cache()`` with no counting job); anything else is repartitioned round-robin (one shuffle)."""
    n = num_workers + num_ps
    if _is_cached(df):  # counting an uncached DataFrame would compute it twice; a cached one is cheap to count
        if _split_evenly(df, n):
            log.debug("feeding the cached even split into %d partitions as it is", n)
            return df, None
        counts = _cached_partition_rows(df)
        total = sum(counts)
        if len(counts) == n and total and total - n * min(counts) <= _MAX_IMBALANCE * total:
            log.debug("feeding the cached DataFrame's %d partitions as they are: %s rows", n, counts)
            return df, counts
        log.debug("repartitioning %d rows in partitions of %s rows into %d", total, counts, n)
    return df.repartition(n), None


def agree_counts(reports: dict[int, tuple[int, bool]], num_workers: int) -> dict | None:
    """The driver's answer to the tasks' ``tell``: final counts once every worker is done, else ``safe``
    (``{'kind': 'feed', 'safe': 300}`` for ``{0: (500, True), 1: (300, False)}``)."""
    mine = [reports.get(rank) for rank in range(num_workers)]
    if any(r is None for r in mine):
        return None
    if all(done for _, done in mine):
        return {"kind": Msg.FEED, "counts": [rows for rows, _ in mine]}
    return {"kind": Msg.FEED, "safe": min(rows for rows, _ in mine)}
