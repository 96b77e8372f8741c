"""tf-keras under MultiWorkerMirroredStrategy: ``train_on_batch`` and ``test_on_batch`` return the global values.
tf-keras sums each step's per-replica results ("auto" is "sum" outside TPUs): N times the loss on N workers. The
metrics hold the global values, read across the workers instead (every worker calls the method)."""
from __future__ import annotations

import functools
import inspect


def install(tf_keras) -> None:
    model = getattr(tf_keras, "Model", None)
    if model is None or hasattr(tf_keras, "_tfnb"):
        return
    tf_keras._tfnb = True
    for name in ("train_on_batch", "test_on_batch"):
        if hasattr(model, name):
            setattr(model, name, _global_results(getattr(model, name)))


def _multi_worker(model) -> bool:
    extended = getattr(getattr(model, "distribute_strategy", None), "extended", None)
    in_multi = getattr(extended, "_in_multi_worker_mode", None)
    return bool(in_multi and in_multi())


def _global_results(method):
    signature = inspect.signature(method)

    @functools.wraps(method)
    def on_batch(self, *args, **kwargs):
        if not _multi_worker(self):
            return method(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        as_dict = bound.arguments.pop("return_dict", False)
        logs = method(*bound.args, **bound.kwargs, return_dict=True)
        from tf_keras.src.engine.training import flatten_metrics_in_order
        from tf_keras.src.utils import tf_utils

        with self.distribute_strategy.scope():  # cross-replica: each metric read over every worker's replicas
            logs = {**logs, **tf_utils.sync_to_numpy_or_python_type(self.get_metrics_result())}
        return logs if as_dict else flatten_metrics_in_order(logs, self.metrics_names)

    return on_batch
