"""The model ``tfnb.predict`` runs: where it is, its version (the file's mtime, or the remote files' sizes and ETags: in
every cache key, so a changed model loads again), this machine's copy of it, and loading it."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Mapping

from .._deps import keras_for
from .._private import private_dir
from ..storage import atomic_write, normalize, open_store
from ..errors import ConfigError, MissingDependencyError, UnsafePathError

log = logging.getLogger(__name__)

_CALL_BYTES = 256 << 20  # tensors of one model call, for the automatic batch size


def _locate(model_path, options: Mapping[str, Any]) -> tuple[str, str, tuple]:
    """(where to read the model, its version, its files when remote), checked to exist."""
    if not isinstance(model_path, (str, os.PathLike)):
        raise ConfigError(f"model_path={model_path!r} must be a path or URL string")
    path = normalize(model_path)
    if "://" not in path:
        if not os.path.exists(path):
            raise ConfigError(f"model_path {path!r} does not exist on the driver; give the path of a "
                              ".keras/.h5 file or a SavedModel directory\nOn a cluster, give a path every "
                              "executor can read (e.g. /dbfs/...) or a URL such as s3://....")
        # a SavedModel directory's version: the newest of it and its saved_model.pb
        pb = os.path.join(path, "saved_model.pb")
        return path, str(max(os.stat(p).st_mtime_ns for p in (path, pb) if os.path.exists(p))), ()
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


@functools.lru_cache(maxsize=None)
def _fresh_cache() -> str:
    """This process's own cache (mkdtemp makes it 0700), for when the usual one is not private."""
    return tempfile.mkdtemp(prefix="tfnb-model-cache-")


def _fetch(url: str, version: str, files: tuple, options: Mapping[str, Any], cache_base: str) -> str:
    """The local copy of the model at ``url`` (``url`` itself when local: no ``files``), downloaded once per version:
    a cached copy is used only when the record written after its download names it and every file has its size."""
    if not files:
        return url
    try:  # tfnb-model-cache-<uid> under TFNB_MODEL_CACHE_DIR or the temp folder, when 0700 and this user's
        root = private_dir("model-cache", cache_base or None, "TFNB_MODEL_CACHE_DIR")
    except UnsafePathError as e:
        log.warning("%s; downloading models to %s instead", e, _fresh_cache())
        root = _fresh_cache()
    folder = os.path.join(root, hashlib.sha256(f"{url}\n{version}".encode()).hexdigest()[:24])
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
        keys = ("input_shape", "input_dtype", "output_shapes", "scalar_output", "values_per_row")
        return {key: getattr(self, key) for key in keys}


def _load(path: str, threads: int | None) -> _Model:
    """Load a Keras file or SavedModel directory; ``threads`` sizes TF's pools (None: leave them)."""
    import tensorflow as tf

    if threads:
        with contextlib.suppress(RuntimeError):  # TensorFlow already ran something here: it keeps its pools
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
    return (_load_saved_model if os.path.isdir(path) else _load_keras)(tf, path)


def _load_keras(tf, path: str) -> _Model:
    model = keras_for(path).models.load_model(path, compile=False)
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


def _load_saved_model(tf, path: str) -> _Model:
    loaded = tf.saved_model.load(path)
    sigs = dict(loaded.signatures)
    sig = sigs.get("serving_default", next(iter(sigs.values())) if len(sigs) == 1 else None)
    if sig is None:
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


@functools.lru_cache(maxsize=16)   # per model version: reading costs ~1 s, plus ~4 s to import TensorFlow
def _describe(path: str, version: str) -> dict:
    """:meth:`_Model.describe` of the model at the local ``path``: in this process when TensorFlow is imported, else
    in a subprocess, sparing the notebook TensorFlow."""
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
    code = "import json, sys; from tfnb.data.model import _load; print(json.dumps(_load(sys.argv[1], None).describe()))"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True, text=True)
    log.debug("reading the model took %.1f s", time.monotonic() - started)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    err = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    if err.startswith("tfnb.errors.ConfigError: "):
        raise ConfigError(err.split(": ", 1)[1])
    if "No module named 'tensorflow'" in err or "No module named 'tf_keras'" in err:
        raise MissingDependencyError(
            f"reading the output shape of {path!r} needs tensorflow (and tf-keras for a tf-keras model) on the "
            f"driver; pip install tensorflow-cpu tf-keras, or pass output_type='float' or 'array'\n{err}")
    raise _unloadable(path, err)


def _unloadable(source: str, why: str) -> ConfigError:
    return ConfigError(f"cannot load the model at {source!r}: {why}; model_path must be a Keras .keras/.h5 "
                       "file or a TF SavedModel directory with a serving signature")


def _batch_size(desc: Mapping[str, Any], arrow_rows: int) -> int:
    """Rows per model call: the most whose float32 tensors (``values_per_row``) fit in _CALL_BYTES, at most one Arrow
    batch, else a power of two (oneDNN kernels like it). Larger calls matter for small models (64-256-256-10 MLP on
    one core: 2.1 us/row at 1024 rows per call, 1.3 at 10000); conv nets are as fast from ~1024 rows up."""
    fit = _CALL_BYTES // (4 * max(1, desc["values_per_row"]))
    if fit >= arrow_rows:
        return arrow_rows
    return 1 << max(0, fit.bit_length() - 1)
