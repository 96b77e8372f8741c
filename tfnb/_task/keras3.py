"""Keras 3 under tf.distribute, in the train_fn process (docs/keras3.md). The first model method, optimizer ``apply``
or distributed dataset under a strategy calls :func:`ready`: it refuses what cannot work, applies the corrections
(keras3_patches) whose defect reproduces, and runs the self-check (selfcheck) on versions newer than tested."""
from __future__ import annotations

import functools
import sys
from types import SimpleNamespace

from .._deps import KERAS_FLOOR, _version, tested_range
from .keras3_patches import _PRIVATE, PATCHES, Patch, _remove_private, _trainer

_GUARDED = ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch")


def install(keras) -> None:
    """Guard Keras' entry points (no probe at import: TensorFlow configures collectives only before its first tensor);
    the ``early`` patches (no tensor; their defect is in what ``compile`` creates) apply here."""
    if not str(getattr(keras, "__version__", "")).startswith("3.") or hasattr(keras, "_tfnb"):
        return
    # applied: the names of the patches applied, once probed; checked: the self-check ran, or runs now
    keras._tfnb = SimpleNamespace(applied=None, checked=False, early=(), failed=None)
    try:
        keras._tfnb.early = tuple(p.name for p in PATCHES if p.early and _apply_if_needed(p, str(keras.__version__)))
    except Exception as e:  # noqa: BLE001 - `import keras` must work; a run under a strategy stops on it (ready)
        keras._tfnb.failed = e
    for name in _GUARDED:
        setattr(keras.Model, name, _guarded(keras, getattr(keras.Model, name), name))
    # a custom loop distributes its dataset eagerly on every worker before its first step: the self-check goes there
    strategy_cls = getattr(getattr(sys.modules.get("tensorflow"), "distribute", None), "Strategy", None)
    for name in ("experimental_distribute_dataset", "distribute_datasets_from_function"):
        if getattr(strategy_cls, name, None) is not None:
            setattr(strategy_cls, name, _before(getattr(strategy_cls, name), lambda s: _distributing(keras, s)))
    try:
        from keras.src.optimizers.base_optimizer import BaseOptimizer
    except ImportError:  # not the layout of the tested releases: the first fit still checks
        return
    BaseOptimizer.apply = _before(BaseOptimizer.apply, lambda optimizer: _applying(keras, optimizer))


def _before(method, check):
    """``method``, calling ``check(self)`` first."""
    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        check(self)
        return method(self, *args, **kwargs)

    return checked


def _distributing(keras, strategy) -> None:
    import tensorflow as tf

    mirrored = (tf.distribute.MultiWorkerMirroredStrategy, tf.distribute.MirroredStrategy)
    if not keras._tfnb.checked and isinstance(strategy, mirrored) and _supported(keras):
        ready(keras, strategy)


def _applying(keras, optimizer) -> None:
    """A custom loop's first ``apply`` under a strategy gets the corrections too."""
    if keras._tfnb.applied is None and _under_strategy(optimizer):
        import tensorflow as tf

        ready(keras, tf.distribute.get_strategy())


def _supported(keras) -> bool:
    return _version(str(keras.__version__), 3) >= KERAS_FLOOR and keras.config.backend() == "tensorflow"


def _under_strategy(owner) -> bool:
    tf = sys.modules.get("tensorflow")  # Keras 3 on the TensorFlow backend has imported it
    if tf is None:
        return False
    own = type(getattr(owner, "_distribute_strategy", None)).__module__.startswith("tensorflow")
    return own or tf.distribute.has_strategy()


def _guarded(keras, method, name: str):
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        under = _under_strategy(self)
        if under:
            ready(keras, self.distribute_strategy)
        if name in ("train_on_batch", "test_on_batch") and under and "metric-reduction" in (keras._tfnb.applied or ()) \
                and _trainer()._collective_all_reduce_multi_worker(self.distribute_strategy):
            return _global_batch_logs(self, method, args, kwargs)
        try:
            return method(self, *args, **kwargs)
        finally:
            if name == "fit" and _PRIVATE:
                _remove_private()
    return guarded


def _global_batch_logs(model, method, args, kwargs):
    """``*_on_batch`` under ``metric-reduction``: the step's logs are this worker's, so the values returned are read
    from the metric variables over every worker (every worker calls the method)."""
    import numpy as np

    want_dict = kwargs.pop("return_dict", False)
    logs = method(model, *args, **kwargs, return_dict=True)
    logs = {k: np.array(v) for k, v in dict(model._get_metrics_result_or_logs(logs)).items()}
    return logs if want_dict else model._flatten_metrics_in_order(logs)


def ready(keras, strategy) -> tuple[str, ...]:
    """The names of the patches applied in this process: applied once, the self-check run once (eagerly, outside a
    step) on untested versions. ConfigError for ParameterServerStrategy, a Keras older than tested or not on
    TensorFlow, a failed probe of a correction not safe to apply blindly, or a failed self-check."""
    import tensorflow as tf

    from ..errors import KERAS3_PS, KERAS3_UNTESTED, ConfigError

    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise ConfigError(KERAS3_PS)
    if not isinstance(strategy, (tf.distribute.MultiWorkerMirroredStrategy, tf.distribute.MirroredStrategy)):
        return keras._tfnb.applied or ()
    version = str(keras.__version__)
    if not _supported(keras):
        raise ConfigError(KERAS3_UNTESTED.format(version=version, backend=keras.config.backend(), **tested_range()))
    if keras._tfnb.failed is not None:
        raise _probe_failed(version, "metric-variables", keras._tfnb.failed) from keras._tfnb.failed
    if keras._tfnb.applied is None:
        from concurrent.futures import ThreadPoolExecutor

        def probe() -> tuple[str, ...]:
            return tuple(p.name for p in PATCHES
                         if p.name in keras._tfnb.early or not p.early and _apply_if_needed(p, version))

        # on a thread of its own: out of the strategy scope fit may run in (scopes are per thread)
        with ThreadPoolExecutor(1, thread_name_prefix="tfnb-keras3-probe") as pool:
            keras._tfnb.applied = pool.submit(probe).result()  # its exception raised here
    if "gradient-all-reduce" in keras._tfnb.applied and len(strategy.extended.worker_devices) > 1:
        from ..errors import KERAS3_DEVICES

        raise ConfigError(KERAS3_DEVICES.format(version=version, devices=len(strategy.extended.worker_devices)))
    outside_a_step = tf.distribute.in_cross_replica_context() or not tf.distribute.has_strategy()
    if not keras._tfnb.checked and tf.executing_eagerly() and outside_a_step:
        from . import selfcheck

        keras._tfnb.checked = True  # the check's own fit, custom loop and train_on_batch do not check again
        try:
            selfcheck.check_or_refuse(keras, strategy, selfcheck.untested(selfcheck.versions(keras, tf)))
        except BaseException:
            keras._tfnb.checked = False
            raise
    return keras._tfnb.applied


def _apply_if_needed(patch: Patch, version: str) -> bool:
    """Probe, and apply where the defect reproduces; a probe that fails applies a safe correction, else refuses."""
    try:
        needed = patch.probe()
    except Exception as e:  # noqa: BLE001 - whatever broke, the probe could not say "not needed"
        if not patch.safe:
            raise _probe_failed(version, patch.name, e) from e
        needed = True
    if needed:
        patch.apply()
    return bool(needed)


def _probe_failed(version: str, name: str, e: Exception):
    from ..errors import KERAS3_PROBE, ConfigError, summary

    return ConfigError(KERAS3_PROBE.format(version=version, name=name, error=summary(e, 120), **tested_range()))


def selfcheck_fn(ctx) -> dict:
    """The train_fn of ``tfnb.selfcheck``: the check under MultiWorkerMirroredStrategy, whatever the versions."""
    import tensorflow as tf

    from . import selfcheck

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    import keras

    if not str(keras.__version__).startswith("3."):
        raise RuntimeError(f"keras is {keras.__version__} here: the self-check is for Keras 3")
    before, keras._tfnb.checked = keras._tfnb.checked, True  # the check below is the one the caller asked for
    try:
        ready(keras, strategy)
        result = selfcheck.check(keras, strategy)
    finally:
        keras._tfnb.checked = before
    return {**result, "versions": selfcheck.versions(keras, tf), "patches": list(keras._tfnb.applied or ())}
