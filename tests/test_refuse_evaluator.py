"""Refusals of ``tfnb.Evaluator``'s arguments and TFNB_EVAL_INTERVAL (no Spark, no TensorFlow)."""
from __future__ import annotations

import tfnb
from tfnb import ConfigError

from refusals import Refusals, case


def _evaluator(env, **kwargs):
    args = dict(model_fn=lambda: None, dataset_fn=lambda: [], checkpoint_dir=str(env.tmp / "ckpt"),
                log_dir=str(env.tmp / "eval"))
    args.update(kwargs)
    return tfnb.Evaluator(args.pop("model_fn"), args.pop("dataset_fn"), args.pop("checkpoint_dir"),
                          args.pop("log_dir"), **args)


@case("evaluator", "`Evaluator(model_fn='model.keras', ...)`", ConfigError, "'model.keras'",
      "a function returning a tf-keras model", says="a function that builds the model")
def evaluator_model_fn_not_callable(env):
    _evaluator(env, model_fn="model.keras")


@case("evaluator", "`dataset_fn=<a dataset>`", ConfigError, "dataset_fn must be a function",
      "dataset_fn=lambda: val_ds", says="wrap it: dataset_fn=lambda: val_ds")
def evaluator_dataset_not_fn(env):
    _evaluator(env, dataset_fn=[1, 2, 3])


@case("evaluator", "`interval=-1`", ConfigError, "interval=-1", "interval=10", says="seconds > 0, e.g. interval=10")
def evaluator_interval(env):
    _evaluator(env, interval=-1)


@case("evaluator", "`mode='up'`", ConfigError, "mode='up'", "'min', 'max' or 'auto'", says="'min', 'max' or 'auto'")
def evaluator_mode(env):
    _evaluator(env, mode="up")


@case("evaluator", "`export_format='onnx'`", ConfigError, "export_format='onnx'", "savedmodel",
      says="one of the listed formats, or None")
def evaluator_export_format(env):
    _evaluator(env, export_format="onnx")


@case("evaluator", "`metrics='accuracy'`", ConfigError, "metrics='accuracy'", "metrics=['accuracy']",
      says="a list: metrics=['accuracy']")
def evaluator_metrics_str(env):
    _evaluator(env, metrics="accuracy")


@case("evaluator", "`step='batch'`", ConfigError, "step='batch'", "function(checkpoint) -> int",
      says="one of the listed rules, or a function(checkpoint) -> int")
def evaluator_step(env):
    _evaluator(env, step="batch")


@case("evaluator", "`TFNB_EVAL_INTERVAL=soon`", ConfigError, "TFNB_EVAL_INTERVAL='soon'", "fix or unset",
      says="fix or unset the variable")
def evaluator_interval_env(env):
    env.setenv("TFNB_EVAL_INTERVAL", "soon")
    _evaluator(env)


@case("evaluator", "`checkpoint_dir=None`", ConfigError, "checkpoint_dir=None", "model_dir given to tfnb.run",
      says="a directory path or URL (the run's model_dir)")
def evaluator_checkpoint_none(env):
    _evaluator(env, checkpoint_dir=None)


@case("evaluator", "`max_retries=0`", ConfigError, "max_retries=0", "int >= 1", says="an int >= 1")
def evaluator_max_retries(env):
    _evaluator(env, max_retries=0)


@case("evaluator", "`best_metric=5`", ConfigError, "best_metric=5", "'loss'",
      says="a metric name such as 'loss', or None")
def evaluator_best_metric(env):
    _evaluator(env, best_metric=5)


@case("evaluator", "`timeout=0`", ConfigError, "timeout=0", "or None to wait for training to end",
      says="seconds > 0, or None")
def evaluator_timeout(env):
    _evaluator(env, timeout=0)


class TestRefusals(Refusals):
    """The cases above."""
