"""The evaluator's TensorFlow side, in its thread: the model and data built once, each checkpoint restored and
evaluated, the metrics written as TensorBoard scalars, the best model exported."""
from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import re
import tempfile
import zipfile
from typing import Any, Callable, Mapping, Sequence

from ..errors import summary
from ..storage import Store, open_store
from .checkpoints import H5, KERAS
from .sync import EventSync

log = logging.getLogger(__name__)

_MISMATCH_RE = re.compile(r"incompatible|not bound|shape|unmatched|does not match", re.I)
_STEP_KEYS = ("step/.ATTRIBUTES/VARIABLE_VALUE", "global_step/.ATTRIBUTES/VARIABLE_VALUE",
              "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE", "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE")


class _Fatal(Exception):
    """Ends the loop: user code (model_fn, dataset_fn, evaluate) or configuration is broken."""


class _Mismatch(Exception):
    """The checkpoint's variables do not fit the model (raised from the restore's own error)."""

    @property
    def why(self) -> str:
        """The restore's error in a line or two (Keras 3 prints every value of the variable it names)."""
        text = re.sub(r"\s*Target variable: <.*?>(?=\s*(\n\n|$))", "", str(self.__cause__), flags=re.S)
        text = " ".join(text.split())
        return text if len(text) <= 400 else text[:399] + "…"


@contextlib.contextmanager
def _fatal_on_error(what: str, fix: str = ""):
    """A failure of the user code inside becomes a _Fatal: ``what: Type: message`` and the fix."""
    try:
        yield
    except Exception as e:
        short, whole = summary(e, 120), f"{type(e).__name__}: {e}".strip()
        raise _Fatal(f"{what}: {short}{fix}" + (f"\n{whole}" if whole != short else "")) from e


class EvalModel:
    """What ``model_fn()`` and ``dataset_fn()`` gave (as :class:`tfnb.Evaluator` takes them); the ``eval`` writer."""

    def __init__(self, model_fn: Callable[[], Any], dataset_fn: Callable[[], Any],
                 metrics: Sequence[Any] | None, tag_prefix: str):
        self.model_fn, self.dataset_fn, self.metrics, self.tag_prefix = model_fn, dataset_fn, metrics, tag_prefix
        self._model = self._data = self._writer = self._event_sync = self._twin = self._sample = self._tmp_logs = None
        self._has_loss, self._keras3 = True, False

    def prepare(self, log_dir: str, options: Mapping[str, Any]) -> None:
        """Build the model and data, evaluate one batch, open the writer of ``log_dir/eval``; _Fatal when model_fn
        or dataset_fn fail or do not fit together."""
        from .._deps import tensorflow_with_tf_keras

        # tf.keras in model_fn is tf-keras, as in tfnb.run's workers; the notebook's environment is left as it is
        tf = tensorflow_with_tf_keras("the evaluator")
        with _fatal_on_error("model_fn() failed"):
            model = self.model_fn()
        if not hasattr(model, "evaluate") or not hasattr(model, "load_weights"):
            raise _Fatal(f"model_fn() returned {type(model).__name__}, not a Keras model; "
                         f"return the model (built with tf.keras or keras) from model_fn")
        self._keras3 = type(model).__module__.split(".")[0] == "keras"
        # Keras 3 says `compiled`; tf-keras has `_is_compiled` (and a compiled_loss only once compiled)
        compiled = bool(getattr(model, "compiled", False)) if self._keras3 else (
            bool(getattr(model, "_is_compiled", False)) or getattr(model, "compiled_loss", None) is not None)
        if self.metrics is not None:
            model.compile(loss=getattr(model, "loss", None) if compiled else None, metrics=self.metrics)
        elif not compiled:
            raise _Fatal("model_fn() returned an uncompiled model, so there is nothing to evaluate; "
                         "compile it in model_fn (loss and metrics) or pass metrics=['accuracy']")
        self._has_loss = getattr(model, "loss", None) is not None
        with _fatal_on_error("dataset_fn() failed"):
            data = self.dataset_fn()
        if data is None:
            raise _Fatal("dataset_fn() returned None; return a tf.data.Dataset of (x, y) batches or an (x, y) tuple")
        if isinstance(data, tuple) and data:
            with contextlib.suppress(Exception):  # one row of x, to build a second model (see _loader)
                self._sample = tf.nest.map_structure(lambda a: a[:1], data[0])
        if not model.built and isinstance(data, tf.data.Dataset):
            # build the variables now so restore errors come from the checkpoint, not from evaluate()
            with _fatal_on_error("could not build the model on the first batch of dataset_fn()"):
                first = next(iter(data.take(1)))
                self._sample = first[0] if isinstance(first, (tuple, list)) else first
                model(self._sample, training=False)
        self._model, self._data = model, data
        # one batch now: evaluate() traced before the first checkpoint, a model/data mismatch shown at start
        with _fatal_on_error("model.evaluate on the first batch of dataset_fn() failed",
                             "; check that model_fn and dataset_fn fit together"):
            self._run_evaluate(steps=1)
        store = open_store(log_dir, options, purpose="writing evaluation logs to")
        if store.local:
            eval_dir = os.path.join(store.url(), "eval")
        else:
            # TensorFlow cannot write to every URL (s3:// left TF in 2.6): write locally, sync out
            self._tmp_logs = tempfile.TemporaryDirectory(prefix="tfnb-eval-logs-", ignore_cleanup_errors=True)
            eval_dir = self._tmp_logs.name
            self._event_sync = EventSync(eval_dir, log_dir.rstrip("/") + "/eval", storage_options=options)
        self._writer = tf.summary.create_file_writer(eval_dir)
        # with no default writer this records nothing, but pays now for the summary code's first load
        tf.summary.scalar(self.tag_prefix + "warmup", 0.0, step=0)

    def restore(self, path: str) -> int | None:
        """Load the local checkpoint ``path`` into the model; the training step saved in it (a ``step`` variable, else
        the optimizer's iterations) or None. _Mismatch: its variables do not fit."""
        if path.endswith((H5, KERAS)):
            target = self._model if self._keras3 else self._loader()
            # a private copy, checked whole (checkpoints.py): a ValueError is about the model, not the file
            try:
                target.load_weights(path)
            except ValueError as e:
                raise _Mismatch() from e
            if target is not self._model:
                self._model.set_weights(target.get_weights())
            return _saved_iterations(path)
        import tensorflow as tf

        reader = tf.train.load_checkpoint(path)
        keys = reader.get_variable_to_shape_map()
        try:
            if any(k.startswith("model/") for k in keys):
                status = tf.train.Checkpoint(model=self._model).restore(path)
            elif self._keras3:
                raise _Fatal(f"{os.path.basename(path)} is a TensorFlow checkpoint of tf-keras' save_weights, which "
                             "the Keras 3 model model_fn() built cannot load; build it with tf.keras, or save "
                             "ckpt-{epoch}.weights.h5 files\n"
                             "tf.keras is tf-keras, as the workers train tf.keras code (its ModelCheckpoint wrote "
                             "this); or have train_fn write ModelCheckpoint(model_dir + '/ckpt-{epoch}.weights.h5', "
                             "save_weights_only=True), which Keras 3 loads.")
            else:
                status = self._model.load_weights(path)
            status.expect_partial()  # optimizer slots are in the checkpoint, not in an evaluation model
            status.assert_existing_objects_matched()
        except (AssertionError, ValueError) as e:
            if _MISMATCH_RE.search(str(e)):
                raise _Mismatch() from e
            raise
        iterations = (k for k in keys if k.endswith("/_iterations/.ATTRIBUTES/VARIABLE_VALUE"))
        key = next((k for k in (*_STEP_KEYS, *iterations) if k in keys), None)
        return None if key is None else int(reader.get_tensor(key))

    def _loader(self):
        """tf-keras only: a second ``model_fn()`` model, never evaluated, that reads Keras weights files (tf-keras
        loads the metrics' variables too once they exist, so refuses files with other metrics)."""
        if self._twin is None:
            with _fatal_on_error("model_fn() failed (called again for a model that reads .weights.h5/.keras files)"):
                twin = self.model_fn()
                if not twin.built:
                    twin(self._sample, training=False)
            self._twin = twin
        return self._twin

    def evaluate(self) -> dict[str, float]:
        """The scalar metrics of ``model.evaluate`` on the whole data (no ``loss`` when none was compiled)."""
        raw = self._run_evaluate()
        return {k: float(v) for k, v in raw.items() if _is_scalar(v) and (k != "loss" or self._has_loss)}

    def _run_evaluate(self, steps: int | None = None) -> dict:
        data = self._data
        args = data if isinstance(data, tuple) and len(data) in (2, 3) else (data,)
        return self._model.evaluate(*args, steps=steps, return_dict=True, verbose=0)

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """The metrics as scalars at ``step``, flushed (and synced out when ``log_dir`` is remote)."""
        import tensorflow as tf

        with self._writer.as_default():
            for name, value in metrics.items():
                tf.summary.scalar(self.tag_prefix + name, value, step=step)
        self._writer.flush()
        if self._event_sync is not None:
            self._event_sync.flush()

    def export(self, store: Store, fmt: str, info: Mapping[str, Any], tracker=None) -> str:
        """Save the model into ``store`` as ``best`` (SavedModel) or ``best.keras``, then ``best.json`` holding
        ``info``; ``tracker`` (an ``EvalTracker``) logs it too. Returns its URL."""
        name = "best.keras" if fmt == "keras" else "best"
        with tempfile.TemporaryDirectory(prefix="tfnb-eval-export-", ignore_cleanup_errors=True) as tmp:
            local = os.path.join(tmp, name)
            if fmt == "keras":
                # tf-keras: "keras_v3" by name, as it keeps its .keras switch in a thread-local that is only
                # on in the importing thread, so from this thread a plain .keras path would write HDF5
                self._model.save(local, **({} if self._keras3 else {"save_format": "keras_v3"}))
            elif self._keras3:  # Keras 3 saves .keras files only; quiet where it can be (not in 3.3)
                quiet = {"verbose": False} if "verbose" in inspect.signature(self._model.export).parameters else {}
                self._model.export(local, format="tf_saved_model", **quiet)
            else:
                self._model.save(local, save_format="tf", include_optimizer=False)
            (store.put if fmt == "keras" else store.put_dir)(name, local)
            # written last: once best.json names a step, that step's model is in place
            store.write("best.json", json.dumps(info, indent=1).encode())
            if tracker is not None:
                tracker.log_best_model(local)
        return store.url(name)

    def close(self) -> None:
        """Close the writer and ship what it wrote (failures are logged)."""
        sync = self._event_sync
        for what, fn in (("closing the eval summary writer", self._writer and self._writer.close),
                         (f"final sync of eval summaries to {sync and sync.dest}", sync and sync.stop)):
            try:
                if fn:
                    fn()
            except Exception:  # noqa: BLE001
                log.exception("%s failed", what)
        if self._tmp_logs is not None:
            self._tmp_logs.cleanup()


def _saved_iterations(path: str) -> int | None:
    """The optimizer's iterations (its first variable, as both Kerases save it) in a Keras file, or None."""
    with contextlib.ExitStack() as stack:
        try:
            import h5py

            source = path
            if path.endswith(KERAS):
                source = stack.enter_context(stack.enter_context(zipfile.ZipFile(path)).open("model.weights.h5"))
            first = stack.enter_context(h5py.File(source, "r"))["optimizer/vars/0"][()]
        except Exception:  # noqa: BLE001 - no optimizer saved, or not where Keras puts it
            return None
        return int(first) if getattr(first, "dtype", None) is not None and first.dtype.kind in "iu" else None


def _is_scalar(value: Any) -> bool:
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False
