"""TensorFlowOnSpark 2.2.5 and spark-tensorflow-distributor programs on tfnb, by changing one import:
``from tfnb.compat import TFCluster, TFNode, MirroredStrategyRunner`` (see docs/migrating.md); also the helpers of
``tensorflowonspark.compat``: ``export_saved_model``, ``disable_auto_shard``, ``is_gpu_available``."""
from __future__ import annotations

from . import cluster as TFCluster  # noqa: N812 - TensorFlowOnSpark's module names
from . import node as TFNode  # noqa: N812
from .mirrored import MirroredStrategyRunner

__all__ = ["TFCluster", "TFNode", "MirroredStrategyRunner", "export_saved_model", "disable_auto_shard",
           "is_gpu_available"]


def export_saved_model(model, export_dir: str, is_chief: bool = False) -> None:
    """Save a Keras model as a SavedModel; every node calls it (the save is collective), only the chief keeps it.

    Example:
        >>> compat.export_saved_model(model, args.export_dir, ctx.job_name == "chief")
    """
    import contextlib
    import tempfile

    with (contextlib.nullcontext(export_dir) if is_chief else
          tempfile.TemporaryDirectory(prefix="tfnb-worker-model-", ignore_cleanup_errors=True)) as target:
        if type(model).__module__.startswith("tf_keras"):
            model.save(target, save_format="tf")
        else:  # Keras 3 writes SavedModels with export()
            model.export(target)


def disable_auto_shard(options) -> None:
    """Turn off tf.data auto-sharding on ``options`` (a ``tf.data.Options``).

    Example:
        >>> options = tf.data.Options(); compat.disable_auto_shard(options)
    """
    import tensorflow as tf

    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF


def is_gpu_available() -> bool:
    """True when TensorFlow sees a GPU.

    Example:
        >>> compat.is_gpu_available()
        False
    """
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU")) > 0
