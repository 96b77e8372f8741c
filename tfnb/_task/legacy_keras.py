"""tf-keras under MultiWorkerMirroredStrategy: each step's logs (fit's per-batch logs, ``train_on_batch``,
``test_on_batch``) are the mean over the replicas. tf-keras sums them ("auto" is "sum" outside TPUs): N times the
loss, an accuracy of 1.6 on 2 workers. Its epoch ends and ``evaluate`` read the metric variables: right already."""
from __future__ import annotations

import functools


def install(tf_keras) -> None:
    try:
        from tf_keras.src.engine import training
    except ImportError:  # not the layout of the tested releases: the logs stay tf-keras's
        return
    original = training.reduce_per_replica

    @functools.wraps(original)
    def reduce_per_replica(values, strategy, reduction):
        out = original(values, strategy, reduction)
        if reduction != "auto" or not training._collective_all_reduce_multi_worker(strategy):
            return out
        import tensorflow as tf

        n = strategy.num_replicas_in_sync
        return tf.nest.map_structure(lambda v: v / n if tf.is_tensor(v) and v.dtype.is_floating else v, out)

    training.reduce_per_replica = reduce_per_replica
