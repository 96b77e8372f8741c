"""Refusals of ``tfnb.Evaluator``'s arguments and TFNB_EVAL_INTERVAL (no Spark, no TensorFlow)."""
from __future__ import annotations

import tfnb
from tfnb import ConfigError

from refusals import Refusals, table


def _evaluator(env, environ: dict | None = None, **kwargs):
    """tfnb.Evaluator with working arguments but ``kwargs``, with the TFNB_* ``environ`` set."""
    for name, value in (environ or {}).items():
        env.setenv(name, value)
    args = dict(model_fn=lambda: None, dataset_fn=lambda: [], checkpoint_dir=str(env.tmp / "ckpt"),
                log_dir=str(env.tmp / "eval"))
    args.update(kwargs)
    return tfnb.Evaluator(args.pop("model_fn"), args.pop("dataset_fn"), args.pop("checkpoint_dir"),
                          args.pop("log_dir"), **args)


table("evaluator", ConfigError, _evaluator, [
    ("evaluator_model_fn_not_callable", dict(model_fn="model.keras"),
     "`Evaluator(model_fn='model.keras', ...)`", ("'model.keras'", "a function returning a Keras model"),
     "a function that builds the model"),
    ("evaluator_dataset_not_fn", dict(dataset_fn=[1, 2, 3]),
     "`dataset_fn=<a dataset>`", ("dataset_fn must be a function", "dataset_fn=lambda: val_ds"),
     "wrap it: dataset_fn=lambda: val_ds"),
    ("evaluator_interval", dict(interval=-1),
     "`interval=-1`", ("interval=-1", "interval=10"), "seconds > 0, e.g. interval=10"),
    ("evaluator_mode", dict(mode="up"),
     "`mode='up'`", ("mode='up'", "'min', 'max' or 'auto'"), "'min', 'max' or 'auto'"),
    ("evaluator_export_format", dict(export_format="onnx"),
     "`export_format='onnx'`", ("export_format='onnx'", "savedmodel"), "one of the listed formats, or None"),
    ("evaluator_metrics_str", dict(metrics="accuracy"),
     "`metrics='accuracy'`", ("metrics='accuracy'", "metrics=['accuracy']"), "a list: metrics=['accuracy']"),
    ("evaluator_step", dict(step="batch"),
     "`step='batch'`", ("step='batch'", "function(checkpoint) -> int"),
     "one of the listed rules, or a function(checkpoint) -> int"),
    ("evaluator_interval_env", dict(environ={"TFNB_EVAL_INTERVAL": "soon"}),
     "`TFNB_EVAL_INTERVAL=soon`", ("TFNB_EVAL_INTERVAL='soon'", "fix or unset"), "fix or unset the variable"),
    ("evaluator_checkpoint_none", dict(checkpoint_dir=None),
     "`checkpoint_dir=None`", ("checkpoint_dir=None", "model_dir given to tfnb.run"),
     "a directory path or URL (the run's model_dir)"),
    ("evaluator_max_retries", dict(max_retries=0), "`max_retries=0`", ("max_retries=0", "int >= 1"), "an int >= 1"),
    ("evaluator_best_metric", dict(best_metric=5),
     "`best_metric=5`", ("best_metric=5", "'loss'"), "a metric name such as 'loss', or None"),
    ("evaluator_timeout", dict(timeout=0),
     "`timeout=0`", ("timeout=0", "or None to wait for training to end"), "seconds > 0, or None"),
])


class TestRefusals(Refusals):
    """The cases above."""
