"""What each Spark Python worker runs for ``tfnb.predict``: Arrow batches of the input columns in (one matrix of the
model's input shape and dtype, :func:`_features`), one Arrow array of predictions out. The model is loaded once per
Python worker, which Spark reuses across tasks and calls (:func:`_model_for`)."""
from __future__ import annotations

import logging
import math
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from ..errors import ConfigError
from .model import _batch_size, _fetch, _load, _Model

log = logging.getLogger(__name__)

_MODELS_CACHED = 2  # loaded models kept per Python worker; models can be large


@dataclass(frozen=True)
class _Spec:
    """Everything a Python worker needs to predict, as plain values fixed on the driver."""

    source: str                 # absolute local path, or a URL when remote
    version: str                # changes when the model does; part of every cache key
    files: tuple                # remote: ((rel, size, version), ...) as listed on the driver; else ()
    input_cols: tuple[str, ...]
    scalar_output: bool         # one float per row, else array<float>
    batch_size: int             # rows per model call; 0 = each worker chooses (no description on the driver)
    threads: int                # TensorFlow intra-op threads per Python worker (spark.task.cpus)
    cache_dir: str              # base of the private model cache; "" = the temp folder there
    trace_dir: str | None       # diagnostics only: one file per worker pid logging loads and batches
    options: Mapping[str, Any] = field(default_factory=dict, repr=False)   # storage options: secrets


# lives across tasks and predict() calls; the version in the key makes a changed model load again
_loaded: "OrderedDict[tuple, _Model]" = OrderedDict()


def _model_for(spec: _Spec) -> _Model:
    key = (spec.source, spec.version, spec.threads)
    if key not in _loaded:
        started = time.monotonic()
        # tf.keras must mean tf-keras in this worker (custom layers may use it): set before TF is imported.
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
        _loaded[key] = _load(_fetch(spec.source, spec.version, spec.files, spec.options, spec.cache_dir), spec.threads)
        log.info("loaded model %s in process %d in %.1f s", spec.source, os.getpid(), time.monotonic() - started)
        _trace(spec, f"load {spec.source}")
    _loaded.move_to_end(key)
    while len(_loaded) > _MODELS_CACHED:
        _loaded.popitem(last=False)
    return _loaded[key]


def _predict_arrays(spec: _Spec, batches: Iterator) -> Iterator:
    """Arrow UDF body: for each Arrow batch of the input columns, yield the predictions as one array."""
    for arrays in batches:
        yield _predict_batch(spec, arrays if isinstance(arrays, (tuple, list)) else (arrays,))


def _predict_record_batches(spec: _Spec, output_col: str, batches: Iterator) -> Iterator:
    """mapInArrow body: each whole-row Arrow batch comes back with the prediction column appended."""
    import pyarrow as pa

    for batch in batches:
        out = _predict_batch(spec, [batch.column(c) for c in spec.input_cols])
        yield pa.RecordBatch.from_arrays(batch.columns + [out], names=batch.schema.names + [output_col])


def _predict_batch(spec: _Spec, arrays: Sequence) -> Any:
    """Predictions for one Arrow batch of the input columns, as a pyarrow array (the model loaded at the first batch:
    an empty partition loads nothing)."""
    import numpy as np
    import pyarrow as pa

    model = _model_for(spec)
    x = _features(arrays, spec.input_cols, model)
    n = x.shape[0]
    if n == 0:
        y = np.zeros((0, 1 if spec.scalar_output else 0), dtype=np.float32)
    else:
        step = spec.batch_size or _batch_size(model.describe(), n)
        y = np.concatenate([model.call(x[i:i + step]) for i in range(0, n, step)])
    _trace(spec, f"batch {n}")
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
                          f"..{int(lengths.max())}); every row must have the same length (pad or truncate them first)")


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
    """Packed bytes as one uint8 per value when that makes the model's row (pixels), else as its dtype (little-endian);
    a byte count that fits neither is refused with both."""
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


def _trace(spec: _Spec, event: str) -> None:
    """Diagnostics only (TFNB_PREDICT_TRACE_DIR): append an event line to this process's file."""
    if spec.trace_dir:
        with open(os.path.join(spec.trace_dir, f"{os.getpid()}.log"), "a") as f:
            f.write(event + "\n")
