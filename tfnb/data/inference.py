"""DataFrame -> predictions, the driver's side of ``tfnb.predict``: check the call, read what it needs of the model
once, add the column lazily. Only the input columns reach the Python workers (:mod:`.scoring`), through a scalar
iterator Arrow UDF (pyspark >= 4.1; before, ``mapInArrow``, which carries whole rows): per CPU-second 1.6x faster
with a 1 KB column carried along (``bench/inference.py``)."""
from __future__ import annotations

import functools
import logging
import os
import warnings
from typing import Any, Mapping, Sequence

from .._config import setting
from ..errors import ConfigError, MissingDependencyError
from .feeding import check_dataframe, numeric, unsupported_hint
from .model import _batch_size, _describe, _fetch, _locate
from .scoring import _predict_arrays, _predict_record_batches, _Spec

log = logging.getLogger(__name__)

_OUTPUT_TYPES = ("float", "array")
_MAX_ROWS = 1 << 16  # rows per call when Spark's Arrow batches are unbounded


def predict(df, model_path: str | os.PathLike, *, input_cols: Sequence[str], output_col: str = "prediction",
            batch_size: int | None = None, output_type: str | None = None,
            storage_options: Mapping[str, Any] | None = None):
    """Add a column of model predictions to ``df``, lazily (guide: docs/data.md, "Predict over a DataFrame").

    Args:
        df: a Spark DataFrame (classic or Spark Connect).
        model_path: a Keras ``.keras``/``.h5`` file or a TF SavedModel directory, at a path every executor reads
            (``/dbfs/...``) or a storage URL.
        input_cols: the columns of the model's one input row, in order: numbers, fixed-length arrays of numbers
            and/or ``binary`` columns of packed values (see the guide). Nulls are an error.
        output_col: name of the new column; it must not exist in ``df``.
        batch_size: rows per model call (default ``TFNB_PREDICT_BATCH_SIZE``, else chosen from the model).
        output_type: ``"float"`` or ``"array"`` (``array<float>``: all outputs flattened), read from the model by
            default. Reading it, and the automatic batch size, load the model once on the driver; pass both to skip
            that, e.g. on a Connect client without TensorFlow.
        storage_options: for a model URL (docs/data.md, "Storage URLs and options"); never logged.

    Returns:
        ``df`` with ``output_col`` appended, whose metadata holds the rows per model call
        (``metadata["tfnb.batch_size"]``).

    Raises:
        ConfigError: a missing or unsupported input column, an existing ``output_col``, a bad ``batch_size`` or
            ``output_type``, a model path that does not exist or does not load.
        MissingDependencyError: the URL's backend or TensorFlow (to read the output type) is not installed.
        StorageError: the model URL cannot be read (credentials, bucket, endpoint, permission).

    Example:
        >>> preds = tfnb.predict(df, "/dbfs/models/mnist.keras", input_cols=["features"], output_col="logits")
        >>> preds.select("id", "logits").show()
    """
    cols = _check_input_cols(input_cols)
    if not isinstance(output_col, str) or not output_col:
        raise ConfigError(f"output_col={output_col!r} must be a non-empty column name")
    size = setting("predict_batch_size", batch_size, None, int)
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ConfigError(f"batch_size={size!r} must be an integer >= 1 (rows per model call); e.g. batch_size=1024")
    if output_type is not None and output_type not in _OUTPUT_TYPES:
        raise ConfigError(f"output_type={output_type!r} is not one of {_OUTPUT_TYPES}; "
                          "pass 'float', 'array', or leave it out to read it from the model")
    check_dataframe(df, "df")
    _check_schema(df.schema, cols, output_col)
    options = dict(storage_options or {})
    source, version, files = _locate(model_path, options)
    if files and source.startswith("s3://") and not options.get("endpoint_url"):
        from ..storage.s3 import endpoint_url

        # resolved here, once: the executors' environment may lack TFNB_S3_ENDPOINT_URL
        options["endpoint_url"] = endpoint_url()
    cache_dir = setting("model_cache_dir", None, "")
    spark = df.sparkSession
    if output_type is None or size is None:
        try:
            desc = _describe(_fetch(source, version, files, options, cache_dir), version)
        except MissingDependencyError:
            if output_type is None:
                raise
            desc = None  # no TensorFlow on this driver: each worker chooses the size from its loaded model
        if output_type is None:
            output_type = "float" if desc["scalar_output"] else "array"
        if size is None:
            rows = _conf_int(spark, "spark.sql.execution.arrow.maxRecordsPerBatch", 10000)
            size = _batch_size(desc, rows if rows > 0 else _MAX_ROWS) if desc else 0  # <= 0: whole partitions
            log.info("tfnb.predict: rows per model call for %s: %s", source, size or "chosen on each worker")
    spec = _Spec(source=source, version=version, files=files, input_cols=cols,
                 scalar_output=output_type == "float", batch_size=size,
                 threads=_conf_int(spark, "spark.task.cpus", 1),
                 cache_dir=cache_dir, trace_dir=setting("predict_trace_dir", None, "") or None,
                 options=options)
    return _with_predictions(df, spec, output_col)


def _conf_int(spark, key: str, default: int) -> int:
    try:
        return int(spark.conf.get(key, str(default)) or default)
    except Exception:  # noqa: BLE001 - Connect raises its own types for unreadable confs
        return default


def _check_input_cols(input_cols) -> tuple[str, ...]:
    if not isinstance(input_cols, (list, tuple)) or not input_cols:
        raise ConfigError(f"input_cols={input_cols!r} must be a non-empty list of column names, "
                          "e.g. input_cols=['features'] or input_cols=['x1', 'x2']")
    bad = [c for c in input_cols if not isinstance(c, str) or not c]
    if bad:
        raise ConfigError(f"input_cols contains {bad!r}; give column names as strings")
    dups = sorted({c for c in input_cols if input_cols.count(c) > 1})
    if dups:
        raise ConfigError(f"input_cols lists {dups} more than once; name each column once")
    return tuple(input_cols)


def _check_schema(schema, cols: tuple[str, ...], output_col: str) -> None:
    fields = {f.name: f.dataType for f in schema.fields}
    for name in cols:
        if name not in fields:
            raise ConfigError(f"input column {name!r} is not in the DataFrame (columns: "
                              f"{sorted(fields)}); fix input_cols")
        dtype = fields[name]  # a number, an array of numbers or packed bytes: what can feed a model
        if not (numeric(dtype) or type(dtype).__name__ == "BinaryType"):
            raise ConfigError(f"input column {name!r} has type {dtype.simpleString()}; inputs must be numeric, "
                              f"arrays of numbers or binary (packed values); {unsupported_hint(dtype)}")
    if output_col in fields:
        raise ConfigError(f"output_col={output_col!r} already exists in the DataFrame; pass another "
                          f"output_col or drop the column first (df.drop({output_col!r}))")


def _with_predictions(df, spec: _Spec, output_col: str):
    from pyspark.sql.types import ArrayType, FloatType

    rtype = FloatType() if spec.scalar_output else ArrayType(FloatType(), containsNull=False)
    try:
        from pyspark.sql.functions import ArrowUDFType, arrow_udf, col
    except ImportError:  # pyspark < 4.1 has no Arrow UDFs; mapInArrow (3.3+) carries whole rows instead
        return _with_predictions_by_map(df, spec, output_col, rtype)
    with warnings.catch_warnings():
        # pyspark prefers type hints, which would need pyarrow imported by this module; the kind is explicit.
        warnings.filterwarnings("ignore", message="It is preferred to specify type hints", category=UserWarning)
        fn = arrow_udf(functools.partial(_predict_arrays, spec), rtype, ArrowUDFType.SCALAR_ITER)
    return df.select("*", fn(*[col(c) for c in spec.input_cols]).alias(output_col, metadata=_metadata(spec)))


def _metadata(spec: _Spec) -> dict:
    return {"tfnb.batch_size": spec.batch_size} if spec.batch_size else {}


def _with_predictions_by_map(df, spec: _Spec, output_col: str, rtype):
    from pyspark.sql.types import StructField, StructType

    schema = StructType(df.schema.fields + [StructField(output_col, rtype, nullable=False, metadata=_metadata(spec))])
    return df.mapInArrow(functools.partial(_predict_record_batches, spec, output_col), schema)
