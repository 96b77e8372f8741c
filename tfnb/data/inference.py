"""DataFrame -> predictions: run a saved Keras model or TF SavedModel over a Spark DataFrame.

``tfnb.predict(df, model_path, input_cols=[...])`` returns ``df`` with a prediction column added,
lazily, through the DataFrame API only, so it works on classic and Spark Connect sessions.

How it runs: the input columns reach Spark's Python workers as Arrow batches through a scalar
iterator Arrow UDF (``pyspark.sql.functions.arrow_udf``, pyspark >= 4.1; before that ``mapInArrow``,
which carries whole rows through Python). Each batch becomes one numpy matrix, the model runs on
``batch_size`` rows at a time, and the predictions go back as one Arrow array. Only the input columns
travel to Python; the rest of the row stays in the JVM, so row order and identity are Spark's own.
Per CPU-second (``bench/inference.py``) this matched ``mapInArrow`` on a narrow frame, was 1.6x
faster with a 1 KB column carried along and 1.6-2x faster than ``predict_batch_udf`` on a small MLP.

The model is loaded once per Python worker process, which Spark reuses across tasks and ``predict``
calls, keyed by (model path, version): the file's mtime, or the remote files' sizes and ETags, read
on the driver. A model at a URL is downloaded once per (URL, version) into this user's private cache
folder on each executor (``tfnb-model-cache-<uid>`` under ``TFNB_MODEL_CACHE_DIR`` or the temp
folder, read only when it is 0700 and this user's; see :func:`_fetch`). Rows per model call, unless
given: see :func:`_batch_size`.

``TFNB_PREDICT_TRACE_DIR`` (diagnostics only): when set on the driver, each Python worker appends a
line per model load and per Arrow batch to ``<dir>/<pid>.log``.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from .._config import setting
from .._private import private_dir
from ..storage import atomic_write, normalize, open_store
from ..errors import ConfigError, MissingDependencyError, UnsafePathError

log = logging.getLogger(__name__)

_NUMERIC = ("byte", "short", "integer", "long", "float", "double")
_OUTPUT_TYPES = ("float", "array")
_MODELS_CACHED = 2  # loaded models kept per Python worker; models can be large
_CALL_BYTES = 256 << 20  # tensors of one model call, for the automatic batch size
_MAX_ROWS = 1 << 16  # rows per call when Spark's Arrow batches are unbounded


# ---------------------------------------------------------------- what the workers receive


@dataclass(frozen=True)
class _Spec:
    """Everything a Python worker needs to predict, as plain values fixed on the driver."""

    source: str                 # absolute local path, or a URL when remote
    version: str                # changes when the model does; part of every cache key
    remote: bool
    files: tuple                # remote: ((rel, size, version), ...) as listed on the driver; else ()
    input_cols: tuple[str, ...]
    scalar_output: bool         # one float per row, else array<float>
    batch_size: int             # rows per model call; 0 = each worker chooses (no description on the driver)
    threads: int                # TensorFlow intra-op threads per Python worker (spark.task.cpus)
    cache_dir: str              # base of the private model cache; "" = the temp folder there
    trace_dir: str | None       # diagnostics only: one file per worker pid logging loads and batches
    options: Mapping[str, Any] = field(default_factory=dict, repr=False)   # storage options: secrets


# ---------------------------------------------------------------- driver side


def predict(df, model_path: str | os.PathLike, *, input_cols: Sequence[str], output_col: str = "prediction",
            batch_size: int | None = None, output_type: str | None = None,
            storage_options: Mapping[str, Any] | None = None):
    """Add a column of model predictions to ``df`` (lazily; nothing runs until the result is used).

    Args:
        df: a Spark DataFrame (classic or Spark Connect).
        model_path: the saved model: a Keras ``.keras`` or ``.h5`` file or a TF SavedModel directory,
            as a local path readable at the same place on the executors (``/dbfs/...``; ``dbfs:/x``
            is read as ``/dbfs/x``) or a URL (``s3://bucket/model.keras`` through boto3; other
            schemes through fsspec), downloaded once per executor. Keras files are loaded with
            tf-keras (Keras 2), or with Keras 3 when the ``.keras`` file was saved by Keras 3.
        input_cols: columns that make one model input row, in order: numeric columns (one value
            each), fixed-length arrays of numbers (``array<float>`` etc., the same length on every
            row) and/or ``binary`` columns of packed values, the same length on every row: the raw
            bytes of the row's values in the model's input dtype (``ndarray.astype("float32").tobytes()``)
            or one byte per value (``uint8`` pixels, as in the ``data`` of Spark's image source).
            Packed bytes reach the model without Spark converting each value (a 784-float array costs
            Spark ~15 CPU-us per row before Python sees it). The values are concatenated into one row
            of features and reshaped to the model's input shape (e.g. 64 values -> ``(8, 8, 1)``) and
            dtype. Nulls are an error. Models with more than one input are not supported.
        output_col: name of the new column; it must not exist in ``df``.
        batch_size: rows per model call (default ``TFNB_PREDICT_BATCH_SIZE``, else the largest
            whose input, layer outputs and prediction fit in 256 MiB, at most one Arrow batch of
            ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows; logged and in the column metadata).
        output_type: ``"float"`` or ``"array"``, read from the model by default: ``float`` (Spark
            FloatType) when it has one output with one value per row, else ``array`` (``array<float>``:
            all outputs flattened per row and concatenated in ``tf.nest.flatten`` order: list order,
            dict outputs by sorted key). Reading it, and the automatic batch size, loads the model once
            per version on the driver: here if TensorFlow is imported, else in a subprocess (~4 s).
            Pass both to skip that, e.g. on a Spark Connect client without TensorFlow.
        storage_options: for a model URL: ``key``, ``secret``, ``endpoint_url``, ... (README,
            "Storage URLs and options"); sent to the executors with the task, never logged.

    Returns:
        ``df`` with ``output_col`` appended; all other columns and rows unchanged. The column's
        metadata holds the rows per model call: ``metadata["tfnb.batch_size"]``.

    Raises:
        ConfigError: a missing or non-numeric input column, an existing ``output_col``, a bad
            ``batch_size``/``output_type``, a model path that does not exist or does not load.
        MissingDependencyError: the URL's backend (boto3, an fsspec package) or TensorFlow (for
            reading the output type) is not installed on the driver.
        StorageError: the model URL cannot be read (credentials, bucket, endpoint, permission).

    Example:
        >>> import tfnb
        >>> preds = tfnb.predict(df, "/dbfs/models/mnist.keras",
        ...                      input_cols=["features"], output_col="logits", batch_size=512)
        >>> preds.select("id", "logits").show()
    """
    cols = _check_input_cols(input_cols)
    if not isinstance(output_col, str) or not output_col:
        raise ConfigError(f"output_col={output_col!r} must be a non-empty column name")
    size = setting("predict_batch_size", batch_size, None, int)
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ConfigError(f"batch_size={size!r} must be an integer >= 1 (rows per model call); "
                          "e.g. batch_size=1024")
    if output_type is not None and output_type not in _OUTPUT_TYPES:
        raise ConfigError(f"output_type={output_type!r} is not one of {_OUTPUT_TYPES}; "
                          "pass 'float', 'array', or leave it out to read it from the model")
    if not (hasattr(df, "schema") and hasattr(df, "mapInArrow")):
        raise ConfigError(f"df must be a Spark DataFrame, got {type(df).__name__}; convert it with "
                          "spark.createDataFrame(...) or read it with spark.read")
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
        local = _fetch(source, version, files, options, cache_dir) if files else source
        try:
            desc = _describe(local, version)
        except MissingDependencyError:
            if output_type is None:
                raise
            desc = None  # no TensorFlow on this driver: each worker chooses the size from its loaded model
        if output_type is None:
            output_type = "float" if desc["scalar_output"] else "array"
        if size is None:
            rows = _conf_int(spark, "spark.sql.execution.arrow.maxRecordsPerBatch", 10000)
            size = _batch_size(desc, rows if rows > 0 else _MAX_ROWS) if desc else 0  # <= 0: whole partitions
            if size:
                log.info("tfnb.predict: %d rows per model call for %s", size, source)
            else:
                log.info("tfnb.predict: rows per model call for %s chosen on each worker", source)
    spec = _Spec(source=source, version=version, remote=bool(files), files=files, input_cols=cols,
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


def _batch_size(desc: Mapping[str, Any], arrow_rows: int) -> int:
    """Rows per model call: the largest whose float32 tensors (input, every layer's output, prediction;
    for a SavedModel, input and outputs) fit in _CALL_BYTES, at most one Arrow batch.

    Fewer, larger calls matter for small models (64-256-256-10 MLP on one core: 2.1 us/row at 1024
    rows per call, 1.3 at 10000); conv nets run at the same speed from ~1024 rows up. Below one
    Arrow batch the size is a power of two, a shape oneDNN kernels handle well.
    """
    fit = _CALL_BYTES // (4 * max(1, desc["values_per_row"]))
    if fit >= arrow_rows:
        return arrow_rows
    return 1 << max(0, fit.bit_length() - 1)


def _check_input_cols(input_cols) -> tuple[str, ...]:
    if isinstance(input_cols, str) or not isinstance(input_cols, (list, tuple)) or not input_cols:
        raise ConfigError(f"input_cols={input_cols!r} must be a non-empty list of column names, "
                          "e.g. input_cols=['features'] or input_cols=['x1', 'x2']")
    bad = [c for c in input_cols if not isinstance(c, str) or not c]
    if bad:
        raise ConfigError(f"input_cols contains {bad!r}; give column names as strings")
    dups = sorted({c for c in input_cols if list(input_cols).count(c) > 1})
    if dups:
        raise ConfigError(f"input_cols lists {dups} more than once; name each column once")
    return tuple(input_cols)


def _check_schema(schema, cols: tuple[str, ...], output_col: str) -> None:
    fields = {f.name: f.dataType for f in schema.fields}
    for name in cols:
        if name not in fields:
            raise ConfigError(f"input column {name!r} is not in the DataFrame (columns: "
                              f"{sorted(fields)}); fix input_cols")
        if not _is_numeric(fields[name]):
            hint = ("convert it with pyspark.ml.functions.vector_to_array(col)"
                    if fields[name].typeName() == "vector" or "Vector" in type(fields[name]).__name__
                    else f"cast it (F.col({name!r}).cast('float')) or pick other columns")
            raise ConfigError(f"input column {name!r} has type {fields[name].simpleString()}; inputs must "
                              f"be numeric, arrays of numbers or binary (packed values); {hint}")
    if output_col in fields:
        raise ConfigError(f"output_col={output_col!r} already exists in the DataFrame; pass another "
                          f"output_col or drop the column first (df.drop({output_col!r}))")


def _is_numeric(dtype) -> bool:
    """A number, an array of numbers or packed bytes: a Spark type that can feed a model."""
    name = dtype.typeName()
    return name in _NUMERIC or name == "binary" or (name == "array" and dtype.elementType.typeName() in _NUMERIC)


def _locate(model_path, options: Mapping[str, Any]) -> tuple[str, str, tuple]:
    """(where to read the model, its version, its files when remote), checked to exist."""
    if not isinstance(model_path, (str, os.PathLike)):
        raise ConfigError(f"model_path={model_path!r} must be a path or URL string")
    path = normalize(model_path)
    if "://" not in path:
        if not os.path.exists(path):
            raise ConfigError(f"model_path {path!r} does not exist on the driver; give the path of a "
                              ".keras/.h5 file or a SavedModel directory (on a cluster: a path every "
                              "executor can read, e.g. /dbfs/..., or a URL such as s3://...)")
        return path, str(_local_version(path)), ()
    try:
        store = open_store(path, options, purpose="reading model_path")
        one = store.stat()
        files = ((("", one.size, one.version),) if one else
                 tuple(sorted((rel, e.size, e.version) for rel, e in store.list().items())))
    except FileNotFoundError:
        files = ()
    if not files:
        raise ConfigError(f"model_path {path!r} does not exist; check the URL (for a SavedModel, the "
                          "directory that holds saved_model.pb)")
    return path, hashlib.sha256(json.dumps(files).encode()).hexdigest()[:24], files


def _local_version(path: str) -> int:
    """mtime_ns of the model file; for a SavedModel directory, the newest of it and saved_model.pb."""
    pb = os.path.join(path, "saved_model.pb")
    return max(os.stat(p).st_mtime_ns for p in (path, pb) if os.path.exists(p))


@functools.lru_cache(maxsize=None)
def _fresh_cache() -> str:
    """This process's own cache, for when the usual one is not private: mkdtemp makes it 0700."""
    return tempfile.mkdtemp(prefix="tfnb-model-cache-")


def _cache_root(base: str) -> str:
    try:
        return private_dir("model-cache", base or None)
    except UnsafePathError as e:
        log.warning("%s; downloading models to %s instead", e, _fresh_cache())
        return _fresh_cache()


def _fetch(url: str, version: str, files: tuple, options: Mapping[str, Any], cache_base: str) -> str:
    """The local copy of the model at ``url``: downloaded once per (url, version), verified before use.

    A cached copy is used only when a record written after its download names this version and
    every file has the size the driver listed; anything else in the cache is replaced, not trusted.
    """
    folder = os.path.join(_cache_root(cache_base), hashlib.sha256(f"{url}\n{version}".encode()).hexdigest()[:24])
    name = os.path.basename(url.split("::")[0].rstrip("/")) or "model"
    dest, record = os.path.join(folder, name), os.path.join(folder, "source.json")
    want = json.dumps({"url": url, "version": version, "files": files})
    if _verified(dest, record, want, files):
        return dest
    os.makedirs(folder, mode=0o700, exist_ok=True)
    # download beside the destination and rename: other workers on this node may race for the same model
    with tempfile.TemporaryDirectory(prefix=".part-", dir=folder, ignore_cleanup_errors=True) as tmp:
        store = open_store(url, options, purpose="downloading model_path")
        target = os.path.join(tmp, name)
        for rel, size, ver in files:
            store.get(rel, os.path.join(target, *rel.split("/")) if rel else target, size=size, version=ver)
        if os.path.isdir(dest):
            shutil.rmtree(dest, ignore_errors=True)
        try:
            os.replace(target, dest)
        except OSError:
            if not _verified(dest, record, want, files):   # another worker's copy got there first
                raise
        atomic_write(record, want.encode())
    return dest


def _verified(dest: str, record: str, want: str, files: tuple) -> bool:
    try:
        with open(record) as f:
            return f.read() == want and all(
                os.path.getsize(os.path.join(dest, *rel.split("/")) if rel else dest) == size
                for rel, size, _ in files)
    except OSError:
        return False


@functools.lru_cache(maxsize=16)   # per model version: reading costs ~1 s, plus ~4 s to import TensorFlow
def _describe(path: str, version: str) -> dict:
    """Input shape/dtype and output shapes of the model at the local ``path``, read on the driver: in
    this process when TensorFlow is already imported here (the model is loaded and dropped; no
    environment or thread settings are touched), else in a short-lived subprocess so the notebook
    does not pay TensorFlow's import and memory."""
    if "tensorflow" in sys.modules:
        try:
            return _load(path, threads=None).describe()
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - loaders raise many types for unreadable models
            raise _unloadable(path, f"{type(e).__name__}: {e}") from e
    return _describe_in_subprocess(path)


def _describe_in_subprocess(path: str) -> dict:
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ, "TF_USE_LEGACY_KERAS": "1"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where tfnb is
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    code = "import json, sys; from tfnb.data.inference import _load; print(json.dumps(_load(sys.argv[1], None).describe()))"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True, text=True)
    log.debug("reading the model took %.1f s", time.monotonic() - started)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    err = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    own = "tfnb.errors.ConfigError: "
    if err.startswith(own):
        raise ConfigError(err[len(own):])
    if "No module named 'tensorflow'" in err or "No module named 'tf_keras'" in err:
        raise MissingDependencyError(
            f"reading the output shape of {path!r} needs tensorflow and tf-keras on the driver ({err}); "
            "pip install tensorflow-cpu tf-keras, or pass output_type='float' or 'array' to tfnb.predict")
    raise _unloadable(path, err)


def _unloadable(source: str, why: str) -> ConfigError:
    return ConfigError(f"cannot load the model at {source!r}: {why}; model_path must be a Keras .keras/.h5 "
                       "file or a TF SavedModel directory with a serving signature")


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


# ---------------------------------------------------------------- worker side


def _predict_arrays(spec: _Spec, batches: Iterator) -> Iterator:
    """Arrow UDF body: for each Arrow batch of the input columns, yield the predictions as one array."""
    model = None
    for arrays in batches:
        if not isinstance(arrays, (tuple, list)):
            arrays = (arrays,)
        model = model or _model_for(spec)  # on the first batch: an empty partition loads nothing
        yield _predict_batch(model, spec, arrays)


def _predict_record_batches(spec: _Spec, output_col: str, batches: Iterator) -> Iterator:
    """mapInArrow body: each whole-row Arrow batch comes back with the prediction column appended."""
    import pyarrow as pa

    model = None
    for batch in batches:
        model = model or _model_for(spec)
        out = _predict_batch(model, spec, [batch.column(c) for c in spec.input_cols])
        yield pa.RecordBatch.from_arrays(batch.columns + [out], names=batch.schema.names + [output_col])


def _predict_batch(model: "_Model", spec: _Spec, arrays: Sequence) -> Any:
    """Predictions for one Arrow batch of the input columns, as a pyarrow array."""
    import numpy as np
    import pyarrow as pa

    x = _features(arrays, spec.input_cols, model)
    n = x.shape[0]
    if n == 0:
        y = np.zeros((0, 1 if spec.scalar_output else 0), dtype=np.float32)
    else:
        step = spec.batch_size or _batch_size(model.describe(), n)
        y = np.concatenate([model.call(x[i:i + step]) for i in range(0, n, step)])
    if spec.trace_dir:
        _trace(spec.trace_dir, f"batch {n}")
    if spec.scalar_output:
        if y.shape[1] != 1:
            raise ConfigError(f"output_type='float' but the model gives {y.shape[1]} values per row; "
                              "pass output_type='array' (or leave it out)")
        return pa.array(y[:, 0], type=pa.float32())
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * y.shape[1])
    return pa.ListArray.from_arrays(offsets, pa.array(y.reshape(-1), type=pa.float32()))


def _features(arrays: Sequence, names: Sequence[str], model: "_Model"):
    """One (rows, *input_shape) numpy matrix from the input columns of one Arrow batch."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    parts, packed = [], []
    for name, arr in zip(names, arrays):
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if arr.null_count:
            raise ConfigError(f"input column {name!r} has {arr.null_count} null value(s) in a batch; "
                              f"drop or fill them first (df.na.drop(subset=[{name!r}]) or df.na.fill(...))")
        if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type):
            packed.append(len(parts))
            parts.append(_packed_bytes(np, pa, arr, name))
        elif pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
            values = arr.flatten()
            if values.null_count:
                raise ConfigError(f"input column {name!r} has arrays with null elements; fill them first")
            lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
            _check_same_length(lengths, name, "arrays")
            width = int(lengths[0]) if len(lengths) else 0
            parts.append(values.to_numpy(zero_copy_only=False).reshape(len(arr), width))
        else:
            parts.append(arr.to_numpy(zero_copy_only=False).reshape(-1, 1))
    if packed:
        parts = _unpack(np, parts, packed, names, model)
    x = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
    x = x.astype(model.input_dtype, copy=False)
    return _to_input_shape(x, names, model.input_shape)


def _check_same_length(lengths, name: str, what: str) -> None:
    if len(lengths) and (lengths != lengths[0]).any():
        raise ConfigError(f"input column {name!r} holds {what} of different lengths ({int(lengths.min())}"
                          f"..{int(lengths.max())}); every row must have the same length "
                          "(pad or truncate them first)")


def _packed_bytes(np, pa, arr, name: str):
    """A binary column as a (rows, bytes per row) uint8 matrix over Arrow's buffer, without a copy."""
    _, offsets, data = arr.buffers()
    kind = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    offsets = np.frombuffer(offsets, kind)[arr.offset:arr.offset + len(arr) + 1]
    _check_same_length(np.diff(offsets), name, "binary values")
    width = int(offsets[1] - offsets[0]) if len(arr) else 0
    raw = np.frombuffer(data, np.uint8) if data is not None and len(arr) else np.zeros(0, np.uint8)
    return raw[offsets[0]:offsets[0] + len(arr) * width].reshape(len(arr), width)


def _unpack(np, parts: list, packed: list, names: Sequence[str], model: "_Model") -> list:
    """Packed bytes read as one uint8 per value when that makes the model's row (image pixels), else as
    the model's dtype (little-endian); a byte count that fits neither is refused with both."""
    dtype = np.dtype(model.input_dtype)
    known = sum(p.shape[1] for i, p in enumerate(parts) if i not in packed)
    raw = sum(parts[i].shape[1] for i in packed)
    want = None if None in model.input_shape else math.prod(model.input_shape) - known
    if raw == want:
        return parts  # uint8, cast with the rest
    split = [names[i] for i in packed if parts[i].shape[1] % dtype.itemsize]
    if not split and want in (None, raw // dtype.itemsize):
        return [p.view(dtype.newbyteorder("<")) if i in packed else p for i, p in enumerate(parts)]
    if split and raw % dtype.itemsize == 0:
        raise ConfigError(f"binary input column(s) {split} hold bytes that are not whole {dtype.name} values "
                          f"(a multiple of {dtype.itemsize} per row); pack each column's values on their own")
    need = (f"{want * dtype.itemsize} bytes of {dtype.name} (pack rows with ndarray.astype({dtype.name!r})"
            f".tobytes()) or {want} bytes of uint8, one per value" if want is not None else
            f"a multiple of {dtype.itemsize} bytes ({dtype.name})")
    raise ConfigError(f"binary input column(s) {[names[i] for i in packed]} hold {raw} bytes per row; the "
                      f"model's input {tuple(model.input_shape)} {dtype.name} needs {need}")


def _to_input_shape(x, names, shape: list):
    """Reshape (rows, features) to (rows, *shape) when the model's per-row shape is fixed."""
    features = x.shape[1]
    if any(d is None for d in shape):
        if len(shape) == 1:
            return x
        raise ConfigError(f"the model's input shape {tuple(shape)} has unknown dimensions beyond the "
                          "feature axis; tfnb.predict feeds (rows, features) matrices, save the model with "
                          "a fixed input shape")
    want = math.prod(shape)
    if want != features:
        raise ConfigError(f"the model expects {want} values per row (input shape {tuple(shape)}) but "
                          f"input_cols {list(names)} give {features}; fix input_cols")
    return x if len(shape) == 1 else x.reshape((x.shape[0], *shape))


def _trace(trace_dir: str, event: str) -> None:
    """Diagnostics only (TFNB_PREDICT_TRACE_DIR): append an event line to this process's file."""
    with open(os.path.join(trace_dir, f"{os.getpid()}.log"), "a") as f:
        f.write(event + "\n")


@dataclass(frozen=True)
class _Model:
    """A loaded model reduced to what prediction needs."""

    call: Any                   # numpy (rows, *input_shape) -> numpy float32 (rows, values per row)
    input_shape: list           # per-row dims, None where unknown
    input_dtype: str
    output_shapes: list         # per-row dims of each output, in flattening order
    values_per_row: int = 0     # input + every layer's output (SavedModel: input + outputs), for the batch size
    keep: Any = None            # the loaded object; its signatures need it alive

    @property
    def scalar_output(self) -> bool:
        return len(self.output_shapes) == 1 and self.output_shapes[0] in ([], [1])

    def describe(self) -> dict:
        return {"input_shape": self.input_shape, "input_dtype": self.input_dtype,
                "output_shapes": self.output_shapes, "scalar_output": self.scalar_output,
                "values_per_row": self.values_per_row}


# Spark reuses Python workers, so this cache lives across tasks and predict() calls; the version in
# the key makes a changed model load again.
_loaded: "OrderedDict[tuple, _Model]" = OrderedDict()


def _model_for(spec: _Spec) -> _Model:
    key = (spec.source, spec.version, spec.threads)
    if key in _loaded:
        _loaded.move_to_end(key)
        return _loaded[key]
    started = time.monotonic()
    # tf.keras must mean tf-keras in this worker (custom layers may use it): set before TF is imported.
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    local = _fetch(spec.source, spec.version, spec.files, spec.options, spec.cache_dir) if spec.remote else spec.source
    model = _loaded[key] = _load(local, spec.threads)
    while len(_loaded) > _MODELS_CACHED:
        _loaded.popitem(last=False)
    log.info("loaded model %s in process %d in %.1f s", spec.source, os.getpid(), time.monotonic() - started)
    if spec.trace_dir:
        _trace(spec.trace_dir, f"load {spec.source}")
    return model


def _load(path: str, threads: int | None) -> _Model:
    """Load a Keras file or SavedModel directory; ``threads`` sizes TF's pools (None: leave them)."""
    import tensorflow as tf

    if threads:
        with contextlib.suppress(RuntimeError):  # TensorFlow already ran something here: it keeps its pools
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
    if os.path.isdir(path):
        return _load_saved_model(tf, path)
    return _load_keras(tf, path)


def _load_keras(tf, path: str) -> _Model:
    model = _keras_for(path).models.load_model(path, compile=False)
    if len(model.inputs) != 1:
        raise ConfigError(f"the model at {path!r} has {len(model.inputs)} inputs; tfnb.predict feeds one "
                          "input built from input_cols (wrap the model in one that splits a single input)")
    shape = list(model.inputs[0].shape[1:])
    dtype = tf.as_dtype(model.inputs[0].dtype)
    # One trace serves every batch size: the batch dimension is left open.
    fn = tf.function(lambda x: model(x, training=False), reduce_retracing=True,
                     input_signature=[tf.TensorSpec([None, *shape], dtype)])
    out_shapes = [list(o.shape[1:]) for o in tf.nest.flatten(model.outputs)]
    layer_shapes = []
    for layer in model.layers:
        with contextlib.suppress(AttributeError, ValueError):  # a layer called more than once has no single output
            layer_shapes += [list(o.shape[1:]) for o in tf.nest.flatten(layer.output)]
    return _Model(call=functools.partial(_run, tf, fn, None), input_shape=shape, input_dtype=dtype.name,
                  output_shapes=out_shapes, values_per_row=_values([shape, *layer_shapes, *out_shapes]),
                  keep=model)


def _values(shapes) -> int:
    """Values per row of tensors with these per-row shapes (an unknown dimension counts as 1)."""
    return sum(math.prod(d or 1 for d in shape) for shape in shapes)


def _keras_for(path: str):
    """tf-keras, unless the .keras file says Keras 3 saved it (then Keras 3 loads it)."""
    major = 2
    if zipfile.is_zipfile(path):
        with contextlib.suppress(KeyError, ValueError), zipfile.ZipFile(path) as z:
            major = int(str(json.loads(z.read("metadata.json")).get("keras_version", "2")).split(".")[0])
    return importlib.import_module("keras" if major >= 3 else "tf_keras")


def _load_saved_model(tf, path: str) -> _Model:
    loaded = tf.saved_model.load(path)
    sigs = dict(loaded.signatures)
    if "serving_default" in sigs:
        sig = sigs["serving_default"]
    elif len(sigs) == 1:
        sig = next(iter(sigs.values()))
    else:
        raise ConfigError(f"the SavedModel at {path!r} has no serving_default signature (signatures: "
                          f"{sorted(sigs)}); save it with signatures={{'serving_default': fn}}")
    args, kwargs = sig.structured_input_signature
    inputs = list(kwargs.items()) or [(None, a) for a in args]
    if len(inputs) != 1:
        raise ConfigError(f"the SavedModel at {path!r} takes {len(inputs)} inputs ({[n for n, _ in inputs]}); "
                          "tfnb.predict feeds one input built from input_cols")
    name, tspec = inputs[0]
    outs = [list(o.shape[1:]) for o in tf.nest.flatten(sig.structured_outputs)]
    shape = list(tspec.shape[1:])
    return _Model(call=functools.partial(_run, tf, sig, name), input_shape=shape, input_dtype=tspec.dtype.name,
                  output_shapes=outs, values_per_row=_values([shape, *outs]), keep=loaded)


def _run(tf, fn, input_name: str | None, x):
    """Call a model function on one numpy batch; flatten its output(s) to (rows, values per row)."""
    import numpy as np

    t = tf.convert_to_tensor(x)
    out = fn(**{input_name: t}) if input_name else fn(t)
    parts = [np.asarray(o).reshape(len(x), -1) for o in tf.nest.flatten(out)]
    y = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
    return y.astype(np.float32, copy=False)
