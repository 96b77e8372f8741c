"""Keras 3 under tf.distribute, in the train_fn process: small corrections of upstream defects, each applied
only where its defect reproduces.

Keras 3's TensorFlow trainer does not run under MultiWorkerMirroredStrategy as released (keras-team/keras#20585,
tensorflow/tensorflow#72388). Each :class:`Patch` below names the upstream defect it corrects, carries a *probe*
that runs the upstream code on stand-ins (no cluster, milliseconds) and reports whether the defect is there, and
an ``apply`` that corrects it at its root. :func:`install` runs when train_fn imports Keras 3 (tfnb._task.child):
``fit``, ``evaluate`` and ``predict`` then call :func:`ready` under a distribution strategy, which refuses what
cannot work (a Keras outside the tested range, ParameterServerStrategy) and applies, once, the patches whose
defect reproduces. A patch whose probe finds upstream fixed is not applied: it retires itself. docs/keras3.md
lists them.
"""
from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

from .._deps import _version

# The Keras versions the suite trains on: Databricks Runtime 15.4 LTS ML's (with TensorFlow 2.16.1) up to the
# newest minor release tested. Others keep the refusal (errors.KERAS3_UNTESTED).
FLOOR, NEWEST = (3, 3, 3), (3, 15)


@dataclass(frozen=True)
class Patch:
    """One correction of Keras 3: the upstream issue, the defect in a line, how to see it, how to correct it."""

    name: str
    issue: str
    defect: str
    probe: Callable[[], bool]  # True: the defect reproduces in this Keras
    apply: Callable[[], None]


def _fake_mwms(**attrs):
    """A MultiWorkerMirroredStrategy stand-in in multi-worker mode on a non-chief worker: ``isinstance`` holds,
    nothing of TensorFlow's runtime is touched, every method the probes need is given."""
    import tensorflow as tf

    fake = object.__new__(tf.distribute.MultiWorkerMirroredStrategy)
    fake._extended = SimpleNamespace(_in_multi_worker_mode=lambda: True, should_checkpoint=False,
                                     should_save_summary=False, _task_type="worker", _task_id=1)
    fake.__dict__.update(attrs)
    return fake


def _per_replica(value):
    from tensorflow.python.distribute.values import PerReplica

    return PerReplica((value,))


def _distributed(value) -> bool:
    import tensorflow as tf

    return isinstance(value, tf.distribute.DistributedValues)


def _local(value):
    """This worker's first replica of a distributed value; any other value as it is."""
    return value.values[0] if _distributed(value) else value


# ---------------------------------------------------------------- the symbolic build of fit/evaluate

def _trainer():
    from keras.src.backend.tensorflow import trainer

    return trainer


def _probe_symbolic_build() -> bool:
    """Keras 3 releases that build the model before fit do so from one batch of the distributed iterator: they
    reduce that batch across every worker (``strategy.reduce`` on a nested structure, which MultiWorkerMirroredStrategy
    rejects with "Attempt to convert a value (PerReplica...)"), or hands the distributed batch on as it is."""
    import tensorflow as tf

    maybe = getattr(_trainer().TensorFlowTrainer, "_maybe_symbolic_build", None)
    if maybe is None:
        return False  # builds while tracing the step: no batch crosses the workers
    calls, got = [], []

    def reduce(op, value, axis=None):
        calls.append(op)
        return value

    strategy = _fake_mwms(reduce=reduce, scope=contextlib.nullcontext)
    fake = SimpleNamespace(_distribute_strategy=strategy, distribute_strategy=strategy,
                           _symbolic_build=lambda iterator=None, data_batch=None: got.append(data_batch))
    batch = (_per_replica(tf.zeros((2, 3))), _per_replica(tf.zeros((2,))))
    try:
        maybe(fake, iterator=[(0, 0, iter([batch]))])
    except Exception:  # noqa: BLE001 - whatever it does with a distributed batch, it is not building from it
        return True
    from keras.src import tree

    return bool(calls) or any(_distributed(v) for v in tree.flatten(got))


def _apply_symbolic_build() -> None:
    """Build from this worker's own first batch: the symbolic build needs shapes and dtypes, not a collective."""
    cls = _trainer().TensorFlowTrainer
    original = cls._maybe_symbolic_build

    @functools.wraps(original)
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if iterator is not None and data_batch is None and self._distribute_strategy is not None:
            from keras.src import tree

            for _, _, it in iterator:
                data_batch = tree.map_structure(_local, next(it))
                break
            iterator = None
        return original(self, iterator=iterator, data_batch=data_batch)

    cls._maybe_symbolic_build = _maybe_symbolic_build


# ---------------------------------------------------------------- datasets distributed from a function

def _adapters():
    from keras.src.trainers import data_adapters

    return data_adapters


def _probe_distributed_datasets() -> bool:
    """Keras 3.3's ``fit`` does not recognise what ``strategy.distribute_datasets_from_function`` returns (each worker's
    own batches, as ``ctx.dataset(..., strategy=)`` gives them): "Unrecognized data type"."""
    from tensorflow.python.distribute.input_lib import DistributedDatasetsFromFunction

    return not _adapters().is_tf_dataset(object.__new__(DistributedDatasetsFromFunction))


def _apply_distributed_datasets() -> None:
    """Take it as the tf.data dataset it is, as later Keras does."""
    adapters = _adapters()
    original = adapters.is_tf_dataset

    @functools.wraps(original)
    def is_tf_dataset(x):
        return original(x) or any(c.__name__ == "DistributedDatasetsFromFunction" and
                                  c.__module__.startswith("tensorflow.python.") for c in type(x).__mro__)

    adapters.is_tf_dataset = is_tf_dataset


# ---------------------------------------------------------------- the step's metrics across workers

def _probe_reduce_scalars() -> bool:
    """Keras reduces each step's metrics under MultiWorkerMirroredStrategy with ``strategy.reduce("MEAN", v,
    axis=0)``: a scalar has no axis 0 ("Invalid reduction dimension 0 for input with 0 dimensions")."""
    import tensorflow as tf

    axes = []

    def reduce(op, value, axis=None):
        axes.append(axis)
        return value

    try:
        _trainer().reduce_per_replica({"loss": _per_replica(tf.constant(1.0))}, _fake_mwms(reduce=reduce), "auto")
    except Exception:  # noqa: BLE001 - a scalar it cannot reduce is the defect
        return True
    return 0 in axes


def _apply_reduce_scalars() -> None:
    """Average each metric over every replica of every worker (``axis=None``): the global value, on every worker."""
    trainer = _trainer()
    original = trainer.reduce_per_replica

    @functools.wraps(original)
    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and trainer._collective_all_reduce_multi_worker(strategy):
            from keras.src import tree

            return tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original(values, strategy, reduction)

    trainer.reduce_per_replica = reduce_per_replica


# ---------------------------------------------------------------- the gradients across workers

def _optimizer():
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    return TFOptimizer


def _probe_gradients() -> bool:
    """Keras 3.3 sums the replicas' gradients inside the optimizer's merge_call, in cross-replica context,
    where its all-reduce finds no replica context and returns every gradient as it was: each worker then applies
    its own gradient and the workers' weights drift apart (keras-team/keras#19308)."""
    order = []
    fake = SimpleNamespace(
        _distribution_strategy=None,
        _all_reduce_sum_gradients=lambda gv: order.append("all-reduce") or list(gv),
        _distributed_tf_update_step=lambda distribution, gv, lr: order.append("update"))
    _optimizer()._backend_update_step(fake, [1.0], [object()], 0.1)
    return order[:1] != ["all-reduce"]


def _loss_scaled() -> bool:
    """Whether this Keras divides each replica's loss by the replica count (then the gradients' sum is the global
    mean gradient); Keras 3.3 does not (then their mean is)."""
    from keras.src.losses import loss

    return hasattr(loss, "scale_loss_for_distribution")


def _apply_gradients() -> None:
    """All-reduce the gradients over every replica of every worker in replica context, before the merge, as later
    Keras does: their sum where the loss is scaled per replica, their mean where it is not (Keras 3.3), so each step
    applies the global gradient."""
    cls = _optimizer()
    original = cls._backend_update_step
    average = not _loss_scaled()

    @functools.wraps(original)
    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        import tensorflow as tf

        reduced = [g for g, _ in self._all_reduce_sum_gradients(list(zip(grads, trainable_variables)))]
        context = tf.distribute.get_replica_context()
        if average and context is not None and context.num_replicas_in_sync > 1:
            reduced = [None if g is None else g / context.num_replicas_in_sync for g in reduced]
        return original(self, reduced, trainable_variables, learning_rate)

    cls._backend_update_step = _backend_update_step


# ---------------------------------------------------------------- the epoch's metrics

def _probe_epoch_metrics() -> bool:
    """Keras 3.3 creates metric variables without an aggregation, so at an epoch's end it reads each worker's own
    running metrics, not the global ones (the step's reduced outputs are global)."""
    import keras
    import tensorflow as tf

    variable = keras.metrics.Mean().variables[0]
    return getattr(variable, "value", variable).synchronization != tf.VariableSynchronization.ON_READ


def _apply_epoch_metrics() -> None:
    """Under a multi-worker strategy, an epoch's (and evaluate's) metrics are computed from their variables summed
    (or averaged, as each declares) over every worker; each worker's own values are put back after."""
    from keras.src.trainers.trainer import Trainer

    original = Trainer._get_metrics_result_or_logs
    ops = {"sum": "SUM", "mean": "MEAN"}

    @functools.wraps(original)
    def _get_metrics_result_or_logs(self, logs):
        strategy = self.distribute_strategy
        if not _trainer()._collective_all_reduce_multi_worker(strategy):
            return original(self, logs)
        variables = [v for m in self.metrics for v in m.variables if ops.get(str(v.aggregation)) is not None]
        own = [v.value.read_value() for v in variables]
        for v, value in zip(variables, own):
            v.assign(strategy.reduce(ops[str(v.aggregation)], value, axis=None))
        try:
            return original(self, logs)
        finally:
            for v, value in zip(variables, own):
                v.assign(value)

    Trainer._get_metrics_result_or_logs = _get_metrics_result_or_logs


# ---------------------------------------------------------------- callbacks that write files

def _writes_elsewhere(model) -> bool:
    """A worker other than the chief of a multi-worker strategy: its copy of a file must not land where the chief's
    does (every worker still saves, as saving may read variables collectively)."""
    extended = getattr(getattr(model, "distribute_strategy", None), "extended", None)
    in_multi = getattr(extended, "_in_multi_worker_mode", None)
    return bool(in_multi and in_multi()) and not getattr(extended, "should_checkpoint", True)


@contextlib.contextmanager
def _elsewhere(callback, model, names: tuple[str, ...], root: str):
    """On a non-chief worker, within the block, the callback's paths ``names`` (all under ``root``) point into a
    private folder, removed after (tf-keras does the same for non-chief workers; Keras 3 does not)."""
    if not _writes_elsewhere(model):
        yield
        return
    saved = {n: getattr(callback, n) for n in names if hasattr(callback, n)}  # Keras 3.3 has fewer
    private = tempfile.mkdtemp(prefix="tfnb-keras-worker-")
    try:
        for n, value in saved.items():
            setattr(callback, n, os.path.normpath(os.path.join(private, os.path.relpath(os.fspath(value), root))))
        yield
    finally:
        for n, value in saved.items():
            setattr(callback, n, value)
        shutil.rmtree(private, ignore_errors=True)


def _redirect(cls, method: str, names: tuple[str, ...], root: Callable) -> None:
    """``cls.method`` writes ``names`` elsewhere on non-chief workers; ``root(callback)`` is the folder they are under."""
    original = getattr(cls, method)

    @functools.wraps(original)
    def redirected(self, *args, **kwargs):
        with _elsewhere(self, self.model, names, root(self)):
            return original(self, *args, **kwargs)

    setattr(cls, method, redirected)


def _probe_writes(make, call) -> bool:
    """Whether a callback of a non-chief worker writes (or would write) under the folder the user gave it."""
    import keras

    folder = tempfile.mkdtemp(prefix="tfnb-keras-probe-")
    saved = []
    model = keras.Model.__new__(keras.Model)  # a stand-in: no layers, saving only records where it goes
    model.__dict__.update(_distribute_strategy=_fake_mwms(), save_weights=lambda path, **k: saved.append(path),
                          save=lambda path, **k: saved.append(path))
    try:
        callback = make(os.path.join(folder, "cb"))
        callback.set_model(model)
        with contextlib.suppress(Exception):
            saved.extend(call(callback) or ())
        return any(os.path.abspath(os.fspath(p)).startswith(folder) for p in saved) or bool(os.listdir(folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_BACKUP_PATHS = ("backup_dir", "_weights_path", "_training_metadata_path", "_prev_weights_path",
                 "_prev_training_metadata_path")


def _probe_backup() -> bool:
    """Keras 3's BackupAndRestore has every worker write, and delete, the one backup folder: racing writers, and
    ``FileExistsError`` when two create it at once."""
    import keras

    return _probe_writes(keras.callbacks.BackupAndRestore, lambda cb: cb._save_model())


def _apply_backup() -> None:
    """Non-chief workers save into a private folder and leave the chief's alone; every worker restores the chief's."""
    import keras

    for method in ("_save_model", "on_train_end"):
        _redirect(keras.callbacks.BackupAndRestore, method, _BACKUP_PATHS, lambda cb: cb.backup_dir)


def _probe_checkpoint() -> bool:
    """Keras 3's ModelCheckpoint has every worker save to the chief's file."""
    import keras

    return _probe_writes(lambda path: keras.callbacks.ModelCheckpoint(path + ".weights.h5", save_weights_only=True),
                         lambda cb: cb._save_model(epoch=0, batch=None, logs={}))


def _apply_checkpoint() -> None:
    import keras

    _redirect(keras.callbacks.ModelCheckpoint, "_save_model", ("filepath",),
              lambda cb: os.path.dirname(os.path.abspath(os.fspath(cb.filepath))))


def _probe_tensorboard() -> bool:
    """Keras 3's TensorBoard has every worker write its event files into the chief's log folder."""
    import keras

    return _probe_writes(lambda path: keras.callbacks.TensorBoard(path, write_graph=False),
                         lambda cb: (cb._train_dir, cb._val_dir))


def _apply_tensorboard() -> None:
    """Non-chief workers write their events into a private folder, removed when training ends."""
    import keras

    cls = keras.callbacks.TensorBoard
    set_model, train_end = cls.set_model, cls.on_train_end

    @functools.wraps(set_model)
    def redirected_set_model(self, model):
        if not _writes_elsewhere(model):
            return set_model(self, model)
        log_dir, self.log_dir = self.log_dir, tempfile.mkdtemp(prefix="tfnb-keras-worker-")
        self._tfnb_private = self.log_dir
        try:
            return set_model(self, model)
        finally:
            self.log_dir = log_dir

    @functools.wraps(train_end)
    def on_train_end(self, logs=None):
        try:
            return train_end(self, logs)
        finally:
            shutil.rmtree(self.__dict__.pop("_tfnb_private", None) or "", ignore_errors=True)

    cls.set_model, cls.on_train_end = redirected_set_model, on_train_end


PATCHES = (
    Patch("gradient-all-reduce", "keras-team/keras#19308",
          "the replicas' gradients are summed where no replica context is left, so each worker applies its own",
          _probe_gradients, _apply_gradients),
    Patch("symbolic-build", "keras-team/keras#20585",
          "fit/evaluate reduce a distributed input batch across workers to build the model",
          _probe_symbolic_build, _apply_symbolic_build),
    Patch("distributed-datasets", "keras-team/keras#20134",
          "fit does not take a dataset distributed from a function (each worker's own batches)",
          _probe_distributed_datasets, _apply_distributed_datasets),
    Patch("metric-reduction", "keras-team/keras#20585",
          "each step's scalar metrics are reduced along an axis 0 they do not have",
          _probe_reduce_scalars, _apply_reduce_scalars),
    Patch("epoch-metrics", "keras-team/keras#20585",
          "an epoch's logs are read from each worker's own metric variables, not aggregated over workers",
          _probe_epoch_metrics, _apply_epoch_metrics),
    Patch("backup-and-restore", "keras-team/keras#20585 (callbacks)",
          "BackupAndRestore: every worker writes and deletes the chief's backup folder",
          _probe_backup, _apply_backup),
    Patch("model-checkpoint", "keras-team/keras#20585 (callbacks)",
          "ModelCheckpoint: every worker saves to the chief's file",
          _probe_checkpoint, _apply_checkpoint),
    Patch("tensorboard", "keras-team/keras#20585 (callbacks)",
          "TensorBoard: every worker writes its event files into the chief's log folder",
          _probe_tensorboard, _apply_tensorboard),
)


def install(keras) -> None:
    """Make this process's Keras 3 ready for tf.distribute: ``fit``, ``evaluate`` and ``predict`` check, on their
    first call under a distribution strategy, that this Keras can train there, and apply the patches whose defect
    reproduces. (Not at import: a probe creates tensors, and TensorFlow configures collective ops only before its
    first tensor, when MultiWorkerMirroredStrategy starts.)"""
    model = getattr(keras, "Model", None)
    if not str(getattr(keras, "__version__", "")).startswith("3.") or model is None or hasattr(keras, "_tfnb"):
        return
    keras._tfnb = SimpleNamespace(applied=None)  # the names of the patches applied, once probed
    for name in ("fit", "evaluate", "predict"):
        setattr(model, name, _guarded(keras, getattr(model, name)))


def _guarded(keras, method):
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        tf = sys.modules.get("tensorflow")  # Keras 3 on the TensorFlow backend has imported it
        own = type(getattr(self, "_distribute_strategy", None)).__module__.startswith("tensorflow")
        if tf is not None and (own or tf.distribute.has_strategy()):
            ready(keras, self.distribute_strategy)
        return method(self, *args, **kwargs)

    return guarded


def ready(keras, strategy) -> tuple[str, ...]:
    """Refuse what cannot work under ``strategy``; otherwise apply, once, the patches whose defect reproduces.

    Returns:
        The names of the patches applied in this process.

    Raises:
        ConfigError: Keras 3 under ParameterServerStrategy, or a Keras version outside :data:`TESTED` under a
            strategy that spans devices or workers.
    """
    import tensorflow as tf

    from ..errors import KERAS3_PS, KERAS3_UNTESTED, ConfigError

    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise ConfigError(KERAS3_PS)
    if not isinstance(strategy, (tf.distribute.MultiWorkerMirroredStrategy, tf.distribute.MirroredStrategy)):
        return keras._tfnb.applied or ()
    version = str(keras.__version__)
    if not (FLOOR <= _version(version, 3) and _version(version) <= NEWEST and keras.config.backend() == "tensorflow"):
        raise ConfigError(KERAS3_UNTESTED.format(version=version, low=".".join(map(str, FLOOR)),
                                                 high=f"{NEWEST[0]}.{NEWEST[1]}.x", below=f"{NEWEST[0]}.{NEWEST[1] + 1}"))
    if keras._tfnb.applied is None:
        keras._tfnb.applied = _outside_any_scope(lambda: tuple(p.name for p in PATCHES if _apply_if_needed(p)))
    if "gradient-all-reduce" in keras._tfnb.applied and len(strategy.extended.worker_devices) > 1:
        from ..errors import KERAS3_DEVICES

        raise ConfigError(KERAS3_DEVICES.format(version=version, devices=len(strategy.extended.worker_devices)))
    return keras._tfnb.applied


def _outside_any_scope(fn):
    """``fn()`` on a thread of its own: out of the strategy scope ``fit`` may be called in (scopes are per thread),
    where the probes' stand-ins must run."""
    import threading

    out: list = []
    thread = threading.Thread(target=lambda: out.append(_result(fn)), name="tfnb-keras3-probe")
    thread.start()
    thread.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def _result(fn):
    try:
        return fn()
    except BaseException as e:  # noqa: BLE001 - raised again on the caller's thread
        return e


def _apply_if_needed(patch: Patch) -> bool:
    if not patch.probe():
        return False
    patch.apply()
    return True
