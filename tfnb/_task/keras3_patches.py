"""The corrections of Keras 3 under tf.distribute (docs/keras3.md): each :class:`Patch` has a *probe* that runs
Keras' code on stand-ins (no cluster, milliseconds) and says whether the defect is there, and an ``apply``."""
from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable


@dataclass(frozen=True)
class Patch:
    """One correction of Keras 3."""

    name: str
    probe: Callable[[], bool]  # True: the defect reproduces in this Keras
    apply: Callable[[], None]
    safe: bool = False  # applying it is right whether or not the defect is there: a probe that fails applies it
    early: bool = False  # probed and applied when Keras is imported (its probe creates no tensor), before compile


def _fake_mwms(**attrs):
    """A MultiWorkerMirroredStrategy stand-in on a non-chief worker: ``isinstance`` holds, no runtime touched."""
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


class _Batches(list):
    """The epoch iterator ``_maybe_symbolic_build`` takes: ``(step, iterator)`` (3.7 to 3.10), ``(step, step,
    iterator)`` (3.3, 3.4, from 3.11), or ``enumerate_epoch()`` (3.5, 3.6)."""

    def enumerate_epoch(self):
        return iter([(0, self[0][-1])])


def _probe_symbolic_build() -> bool:
    """Keras 3 builds the model before fit from one batch of the distributed iterator: it reduces that batch across
    workers (which MWMS rejects: "Attempt to convert a value (PerReplica...)"), or hands the distributed batch on."""
    import tensorflow as tf
    from keras.src import tree

    maybe = getattr(_trainer().TensorFlowTrainer, "_maybe_symbolic_build", None)
    if maybe is None:
        return False  # builds while tracing the step: no batch crosses the workers
    errors = []
    for width in (3, 2):
        calls, got = [], []

        def reduce(op, value, axis=None):
            calls.append(op)
            return value

        strategy = _fake_mwms(reduce=reduce, scope=contextlib.nullcontext)
        fake = SimpleNamespace(_distribute_strategy=strategy, distribute_strategy=strategy,
                               _symbolic_build=lambda iterator=None, data_batch=None: got.append(data_batch))
        batch = (_per_replica(tf.zeros((2, 3))), _per_replica(tf.zeros((2,))))
        try:
            maybe(fake, iterator=_Batches([(0,) * (width - 1) + (iter([batch]),)]))
        except Exception as e:  # noqa: BLE001 - another shape of iterator; none that works fails closed below
            errors.append(e)
            continue
        return bool(calls) or any(_distributed(v) for v in tree.flatten(got))
    raise RuntimeError(f"_maybe_symbolic_build took no stand-in iterator ({errors[-1]!r})")


def _apply_symbolic_build() -> None:
    """Build from this worker's own first batch (shapes and dtypes, no collective)."""
    cls = _trainer().TensorFlowTrainer
    original = cls._maybe_symbolic_build

    @functools.wraps(original)
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if strategy is None or iterator is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        from keras.src import tree

        def reduce(op, value, axis=None):
            return tree.map_structure(_local, value)

        own_build = self._symbolic_build

        def build(*args, **kwargs):
            strategy.__dict__.pop("reduce", None)  # the build itself sees the strategy as it is
            kwargs = {k: tree.map_structure(_local, v) if k == "data_batch" else v for k, v in kwargs.items()}
            return own_build(*args, **kwargs)

        object.__setattr__(strategy, "reduce", reduce)  # on these instances only, for this call
        object.__setattr__(self, "_symbolic_build", build)
        try:
            return original(self, iterator=iterator, data_batch=data_batch)
        finally:
            strategy.__dict__.pop("reduce", None)
            self.__dict__.pop("_symbolic_build", None)

    cls._maybe_symbolic_build = _maybe_symbolic_build


# ---------------------------------------------------------------- datasets distributed from a function

def _probe_distributed_datasets() -> bool:
    """Keras 3.3's ``fit`` rejects ``distribute_datasets_from_function``'s dataset: "Unrecognized data type"."""
    from keras.src.trainers import data_adapters
    from tensorflow.python.distribute.input_lib import DistributedDatasetsFromFunction

    return not data_adapters.is_tf_dataset(object.__new__(DistributedDatasetsFromFunction))


def _apply_distributed_datasets() -> None:
    """Take it as the tf.data dataset it is, as later Keras does."""
    from keras.src.trainers import data_adapters as adapters

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
    """No collective in the step: its metrics are this worker's own mean (the global ones are read from the metric
    variables at an epoch's end and in evaluate's result)."""
    trainer = _trainer()
    original = trainer.reduce_per_replica

    @functools.wraps(original)
    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and trainer._collective_all_reduce_multi_worker(strategy):
            from keras.src import tree

            return tree.map_structure(_local_mean, values)
        return original(values, strategy, reduction)

    trainer.reduce_per_replica = reduce_per_replica


def _local_mean(value):
    """The mean of this worker's replicas of a distributed value (no collective); any other value as it is."""
    if not _distributed(value):
        return value
    import tensorflow as tf

    local = value.values
    return local[0] if len(local) == 1 else tf.add_n(list(local)) / len(local)


# ---------------------------------------------------------------- the gradients across workers

def _probe_gradients() -> bool:
    """Keras 3.3 and 3.4 all-reduce the gradients inside merge_call, where no replica context is left: each worker
    applies its own gradient and the weights drift apart (keras-team/keras#19308)."""
    order = []
    fake = SimpleNamespace(
        _distribution_strategy=None,
        _all_reduce_sum_gradients=lambda gv: order.append("all-reduce") or list(gv),
        _distributed_tf_update_step=lambda distribution, gv, lr: order.append("update"))
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    TFOptimizer._backend_update_step(fake, [1.0], [object()], 0.1)
    return order[:1] != ["all-reduce"]


def _apply_gradients() -> None:
    """Sum the gradients over every replica in replica context, before the merge, as later Keras does."""
    from keras.src.backend.tensorflow.optimizer import TFOptimizer as cls

    original = cls._backend_update_step

    @functools.wraps(original)
    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        reduced = [g for g, _ in self._all_reduce_sum_gradients(list(zip(grads, trainable_variables)))]
        return original(self, reduced, trainable_variables, learning_rate)

    cls._backend_update_step = _backend_update_step


# ---------------------------------------------------------------- fit's loss across replicas

_IN_KERAS_STEP = [0]  # > 0 while Keras' own train function runs: process-wide (replicas trace on threads of their own)


def _probe_loss_scale() -> bool:
    """Keras before 3.8 leaves each replica's loss undivided while the replicas' gradients are summed: fit applies N
    times the global mean gradient. Seen as: a loss under a stand-in strategy of 2 replicas is not halved."""
    from unittest import mock

    import keras
    import tensorflow as tf

    two = SimpleNamespace(num_replicas_in_sync=2)
    with mock.patch.object(tf.distribute, "get_strategy", lambda: two):  # what Keras asks the replica count of
        value = float(keras.losses.MeanSquaredError()(tf.ones((2, 1)), tf.zeros((2, 1))))
    if value not in (0.5, 1.0):
        raise RuntimeError(f"a mean squared error of 1 came out as {value} under 2 stand-in replicas")
    return value == 1.0


def _apply_loss_scale() -> None:
    """In Keras' own train step, divide each replica's gradients by the replica count, as 3.8 divides the loss (a
    custom loop's loss is the user's: left alone)."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    trainer_cls = _trainer().TensorFlowTrainer
    make, apply = trainer_cls.make_train_function, BaseOptimizer.apply

    @functools.wraps(make)
    def make_train_function(self, force=False):
        out = make(self, force=force)
        fn = self.train_function
        if fn is not None and not getattr(fn, "_tfnb_step", False):
            def train_function(*args, **kwargs):  # Keras only calls it (a tf.function's attributes stay on fn)
                _IN_KERAS_STEP[0] += 1
                try:
                    return fn(*args, **kwargs)
                finally:
                    _IN_KERAS_STEP[0] -= 1

            train_function._tfnb_step = True
            self.train_function = train_function
            out = train_function if out is not None else out
        return out

    @functools.wraps(apply)
    def scaled_apply(self, grads, trainable_variables=None):
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        n = context.num_replicas_in_sync if context is not None and _IN_KERAS_STEP[0] else 1
        if n > 1:
            grads = [_divided(g, n) for g in grads]
        return apply(self, grads, trainable_variables)

    trainer_cls.make_train_function, BaseOptimizer.apply = make_train_function, scaled_apply


def _divided(grad, n: int):
    import tensorflow as tf

    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / n, grad.indices, grad.dense_shape)
    return grad / n


# ---------------------------------------------------------------- the metrics' variables

_IN_METRIC = [0]  # > 0 while a metric creates a variable


def _probe_metric_variables() -> bool:
    """Before 3.10 metric variables are mirrored: from 3.7 they sum updates over replicas while Keras assigns
    ``self + value`` (each update re-adds every running total), before 3.7 the devices do not add up. Seen in the
    source: no synchronization (3.10 makes them on-read). No tensor: it runs at import."""
    import inspect

    from keras.src.backend.tensorflow import core

    return "synchronization" not in inspect.getsource(core.Variable._initialize)  # Keras' own, when corrected


def _apply_metric_variables() -> None:
    """A metric's summed (or averaged) variables are created on-read, as in 3.10."""
    import tensorflow as tf
    from keras.src.backend.tensorflow import core
    from keras.src.metrics.metric import Metric

    init, add = core.Variable._initialize, Metric.add_variable
    init_with = getattr(core.Variable, "_initialize_with_initializer", None)  # 3.5 on: creates its own tf.Variable

    def on_read(variable) -> bool:
        metric = _IN_METRIC[0] or getattr(variable, "_tfnb_metric", False)
        return bool(metric) and str(getattr(variable, "aggregation", "")) in ("sum", "mean")

    def _initialize_with_initializer(self, initializer):
        if not on_read(self):
            return init_with(self, initializer)
        return _initialize(self, lambda: initializer(self._shape, dtype=self._dtype))

    @functools.wraps(init)
    def _initialize(self, value):
        if not on_read(self):
            return init(self, value)
        aggregation = {"sum": tf.VariableAggregation.SUM, "mean": tf.VariableAggregation.MEAN}[str(self.aggregation)]
        self._value = tf.Variable(value, dtype=self._dtype, trainable=self.trainable, name=self.name,
                                  aggregation=aggregation, synchronization=tf.VariableSynchronization.ON_READ)

    @functools.wraps(add)
    def add_variable(self, *args, **kwargs):
        _IN_METRIC[0] += 1
        try:
            variable = add(self, *args, **kwargs)
        finally:
            _IN_METRIC[0] -= 1
        variable._tfnb_metric = True  # created later where its creation was deferred (a symbolic build)
        return variable

    core.Variable._initialize, Metric.add_variable = _initialize, add_variable
    if init_with is not None:
        core.Variable._initialize_with_initializer = functools.wraps(init_with)(_initialize_with_initializer)


# ---------------------------------------------------------------- callbacks that write files

def _writes_elsewhere(model) -> bool:
    """A non-chief worker: its files must not land on the chief's (it still saves: saving may be collective)."""
    strategy = model.distribute_strategy
    return _trainer()._collective_all_reduce_multi_worker(strategy) and not strategy.extended.should_checkpoint


def _redirect(cls, method: str, names: tuple[str, ...], root: Callable) -> None:
    """On a non-chief worker, ``cls.method`` writes the callback's paths ``names`` (under ``root(callback)``) into a
    private folder, removed after (as tf-keras does; Keras 3 does not)."""
    original = getattr(cls, method)

    @functools.wraps(original)
    def redirected(self, *args, **kwargs):
        if not _writes_elsewhere(self.model):
            return original(self, *args, **kwargs)
        base, saved = root(self), {n: getattr(self, n) for n in names if hasattr(self, n)}  # Keras 3.3 has fewer
        private = tempfile.mkdtemp(prefix="tfnb-keras-worker-")
        try:
            for n, value in saved.items():
                setattr(self, n, os.path.normpath(os.path.join(private, os.path.relpath(os.fspath(value), base))))
            return original(self, *args, **kwargs)
        finally:
            for n, value in saved.items():
                setattr(self, n, value)
            shutil.rmtree(private, ignore_errors=True)

    setattr(cls, method, redirected)


def _probe_writes(make, call) -> bool:
    """Whether a callback of a non-chief worker writes (or would write) under the folder the user gave it."""
    import keras

    saved = []
    model = keras.Model.__new__(keras.Model)  # a stand-in: no layers, saving only records where it goes
    record = lambda *a, **k: saved.append(a[0] if a else k.get("filepath"))  # noqa: E731 - either spelling
    model.__dict__.update(_distribute_strategy=_fake_mwms(), save_weights=record, save=record)
    with tempfile.TemporaryDirectory(prefix="tfnb-keras-probe-", ignore_cleanup_errors=True) as folder:
        callback = make(os.path.join(folder, "cb"))
        callback.set_model(model)
        try:
            saved.extend(call(callback) or ())  # an error fails the probe closed (these corrections are safe)
        finally:
            _remove_private(callback)  # once corrected, the probe's own
        return any(os.path.abspath(os.fspath(p)).startswith(folder) for p in saved) or bool(os.listdir(folder))


_BACKUP_PATHS = ("backup_dir", "_weights_path", "_training_metadata_path", "_prev_weights_path",
                 "_prev_training_metadata_path")


def _probe_backup() -> bool:
    """Keras 3's BackupAndRestore has every worker write and delete the one backup folder (``FileExistsError``)."""
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


_PRIVATE: dict = {}  # non-chief TensorBoard callbacks -> their private folders; fit's guard removes those left


def _apply_tensorboard() -> None:
    """Non-chief workers write their events into a private folder, removed when training or ``fit`` ends."""
    import keras

    cls = keras.callbacks.TensorBoard
    set_model, train_end = cls.set_model, cls.on_train_end

    @functools.wraps(set_model)
    def redirected_set_model(self, model):
        if not _writes_elsewhere(model):
            return set_model(self, model)
        _remove_private(self)
        log_dir, self.log_dir = self.log_dir, tempfile.mkdtemp(prefix="tfnb-keras-worker-")
        _PRIVATE[self] = self.log_dir
        try:
            return set_model(self, model)
        finally:
            self.log_dir = log_dir

    @functools.wraps(train_end)
    def on_train_end(self, logs=None):
        try:
            return train_end(self, logs)
        finally:
            _remove_private(self)

    cls.set_model, cls.on_train_end = redirected_set_model, on_train_end


def _remove_private(*callbacks) -> None:
    """Remove the private folders of these callbacks, or, given none, every one left."""
    for callback in callbacks or list(_PRIVATE):
        if callback in _PRIVATE:
            shutil.rmtree(_PRIVATE.pop(callback), ignore_errors=True)


PATCHES = (  # each defect and its upstream issue: the table in docs/keras3.md, "The corrections"
    Patch("gradient-all-reduce", _probe_gradients, _apply_gradients),
    Patch("loss-scale", _probe_loss_scale, _apply_loss_scale),
    Patch("symbolic-build", _probe_symbolic_build, _apply_symbolic_build, safe=True),
    Patch("distributed-datasets", _probe_distributed_datasets, _apply_distributed_datasets, safe=True),
    Patch("metric-reduction", _probe_reduce_scalars, _apply_reduce_scalars, safe=True),
    Patch("metric-variables", _probe_metric_variables, _apply_metric_variables, safe=True, early=True),
    Patch("backup-and-restore", _probe_backup, _apply_backup, safe=True),
    Patch("model-checkpoint", _probe_checkpoint, _apply_checkpoint, safe=True),
    Patch("tensorboard", _probe_tensorboard, _apply_tensorboard, safe=True),
)
