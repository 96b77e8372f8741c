"""Refusals of tfnb.run's arguments and TFNB_* settings: raised before a Spark session is needed
(TFNB_DISPLAY's is the one checked with the shared session)."""
from __future__ import annotations

import threading

import tfnb
from tfnb import ConfigError, WorkerError

from refusals import Refusals, case, one, table


def _run(env, /, train_fn=one, environ: dict | None = None, **kwargs):
    """tfnb.run(train_fn, num_workers=2, **kwargs) with the TFNB_* ``environ`` set, and no display (``env``
    positional-only: tfnb.run has an ``env=`` of its own)."""
    for name, value in (environ or {}).items():
        env.setenv(name, value)
    tfnb.run(train_fn, **{"num_workers": 2, **kwargs}, display=False)


table("launcher", ConfigError, _run, [
    ("run_train_fn_not_callable", dict(train_fn="train.py"),
     "`tfnb.run('train.py', ...)`", ("got str", "(ctx, *args)"), "pass a function taking (ctx, *args)"),
    ("run_num_workers_zero", dict(num_workers=0),
     "`num_workers=0`", ("num_workers=0", "num_workers=2"), "an int >= 1, e.g. num_workers=2"),
    ("run_num_workers_str", dict(num_workers="2"),
     "`num_workers='2'`", ("num_workers='2'", "int >= 1"), "an int >= 1, e.g. num_workers=2"),
    ("run_num_ps_negative", dict(num_ps=-1),
     "`num_ps=-1`", ("num_ps=-1", "num_ps=0 runs MultiWorkerMirroredStrategy"),
     "an int >= 0 (0: MultiWorkerMirroredStrategy)"),
    ("run_ps_without_worker", dict(num_workers=1, num_ps=1),
     "`num_ps=1` with `num_workers=1`", ("num_ps=1", "num_workers >= 2 or num_ps=0"),
     "num_workers >= 2 (a chief and a worker), or num_ps=0"),
    ("run_gpus_per_worker_fraction", dict(gpus_per_worker=1.5),
     "`gpus_per_worker=1.5`", ("gpus_per_worker=1.5", "int >= 0", "spark.task.resource.gpu.amount"),
     "whole GPUs per chief/worker task (0: none), or None for the conf's"),
    ("run_cpus_per_worker_zero", dict(cpus_per_worker=0),
     "`cpus_per_worker=0`", ("cpus_per_worker=0", "int >= 1", "spark.task.cpus"),
     "CPU cores per chief/worker task (>= 1), or None for spark.task.cpus"),
    ("run_use_gpu_false_with_gpus", dict(use_gpu=False, gpus_per_worker=2),
     "`use_gpu=False` with `gpus_per_worker=2`", ("use_gpu=False", "gpus_per_worker=2", "gpus_per_worker=0"),
     "gpus_per_worker=0 for a run without GPUs, or leave use_gpu out"),
    ("run_ps_placement_unknown", dict(num_ps=1, ps_placement="gpu"),
     "`ps_placement='gpu'`", ("ps_placement='gpu'", "'executors'", "'driver'"), "'executors' (default) or 'driver'"),
    ("run_args_not_tuple", dict(args=5), "`args=5`", ("got int", "args=(value,)"), "a tuple: args=(value,)"),
    ("run_timeout_zero", dict(timeout=0), "`timeout=0`", ("timeout=0", "None for no limit"), "seconds > 0, or None"),
    ("run_timeout_env_not_a_number", dict(environ={"TFNB_TIMEOUT": "soon"}),
     "`TFNB_TIMEOUT=soon`", ("TFNB_TIMEOUT='soon'", "fix or unset TFNB_TIMEOUT"), "fix or unset the variable"),
    ("run_timeout_str", dict(timeout="10"),
     "`timeout='10'`", ("timeout='10'", "number of seconds > 0"), "a number of seconds > 0, or None"),
    ("run_max_attempts_zero", dict(max_attempts=0),
     "`max_attempts=0`", ("max_attempts=0", "1 = never relaunch"), ">= 1 (1 = never relaunch)"),
    ("run_max_attempts_float", dict(max_attempts=2.5),
     "`max_attempts=2.5`", ("max_attempts=2.5", "int >= 1"), "an int >= 1"),
    ("run_max_attempts_env", dict(environ={"TFNB_MAX_ATTEMPTS": "many"}),
     "`TFNB_MAX_ATTEMPTS=many`", ("TFNB_MAX_ATTEMPTS='many'", "fix or unset"), "fix or unset the variable"),
    ("run_preimport_str", dict(preimport="tensorflow"),
     "`preimport='tensorflow'`", ("preimport='tensorflow'", "preimport=('tensorflow',)"),
     "a sequence: preimport=('tensorflow',)"),
    ("run_preimport_not_names", dict(preimport=[1]),
     "`preimport=[1]`", ("preimport=[1]", "preimport=('tensorflow',)"), "module names as strings"),
    ("run_profile_steps_reversed", dict(profile_steps=(25, 20), log_dir="/tmp/logs"),
     "`profile_steps=(25, 20)`", ("profile_steps=(25, 20)", "profile_steps=(20, 25)"),
     "(first, last) with first <= last"),
    ("run_profile_steps_no_log_dir", dict(profile_steps=(20, 25)),
     "`profile_steps=(20, 25)` without `log_dir`", ("profile_steps=(20, 25)", "pass log_dir="),
     "pass log_dir= (where the traces go)"),
    ("run_mlflow_not_bool_or_name", dict(mlflow=1),
     "`mlflow=1`", ("mlflow=1", "mlflow='my-training'"), "True, an experiment name or None"),
    ("run_env_not_str", dict(env={"SEED": 1}),
     "`env={'SEED': 1}`", ("'SEED': 'int'", "str()"), "str -> str; convert with str()"),
    ("run_env_not_mapping", dict(env=["SEED=1"]), "`env=['SEED=1']`", ("not list", "str()"), "a dict of str -> str"),
    ("run_ps_job_wait_zero", dict(environ={"TFNB_PS_JOB_WAIT": "0"}),
     "`TFNB_PS_JOB_WAIT=0`", ("TFNB_PS_JOB_WAIT=0 ", "seconds > 0", "unset TFNB_PS_JOB_WAIT"),
     "seconds > 0, or unset it (300)"),
    ("run_min_workers_above_num_workers", dict(num_workers=2, min_workers=3),
     "`min_workers=3` with `num_workers=2`", ("min_workers=3", "min_workers <= 2"), "min_workers <= num_workers"),
    ("run_min_workers_with_ps", dict(num_workers=2, num_ps=1, min_workers=1),
     "`min_workers=1` with `num_ps=1`", ("num_ps=1", "leave min_workers out"),
     "num_ps=0 (elastic runs are MultiWorkerMirroredStrategy runs), or no min_workers"),
    ("run_replace_wait_zero", dict(min_workers=1, replace_wait=0),
     "`replace_wait=0`", ("replace_wait=0", "seconds > 0"), "seconds > 0"),
])


@case("launcher", "train_fn capturing a lock", ConfigError, "cannot be sent to the workers", "lock",
      "create such objects inside train_fn", says="capture plain values only; create objects inside train_fn")
def run_unpicklable_train_fn(env):
    lock = threading.Lock()

    def uses_lock(ctx):
        with lock:
            return 1

    tfnb.run(uses_lock, num_workers=2, display=False)


@case("launcher", "`TFNB_DISPLAY=fancy`", ConfigError, "'fancy'", "TFNB_DISPLAY=widget, console or none",
      says="widget, console or none", spark=True)
def run_display_env(env):
    env.setenv("TFNB_DISPLAY", "fancy")
    tfnb.run(one, num_workers=2, spark=env.spark)


@case("launcher", "`display='panel'`", ConfigError, "display='panel'", "a callable taking RunEvents",
      "False for none", says="a callable, False, or None for the default")
def run_display_text(env):
    tfnb.run(one, num_workers=2, display="panel")


def keras3_fit(ctx, version=None):
    """A Keras 3 model's fit under the run's strategy; ``version`` stands in for another installed Keras."""
    import keras
    import numpy as np
    import tensorflow as tf

    if version:
        keras.__version__ = version
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if ctx.num_ps == 0 else \
        tf.distribute.experimental.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    model.fit(np.zeros((16, 4), "float32"), np.zeros((16, 1), "float32"), batch_size=8, verbose=0)


@case("launcher", "Keras 3.2 (older than the tested ones) fitting under MultiWorkerMirroredStrategy", WorkerError,
      "Keras 3.2.0", "tested: 3.3.3 to 3.15.1", "tf.keras (tf-keras)",
      says="a tested Keras (3.3.3 to 3.15.1), or tf.keras", spark=True)
def run_keras3_untested(env):
    tfnb.run(keras3_fit, num_workers=1, args=("3.2.0",), spark=env.spark, display=False, max_attempts=2)


@case("launcher", "Keras 3 fitting under ParameterServerStrategy (`num_ps=1`)", WorkerError,
      "Keras 3's fit does not train under ParameterServerStrategy", "num_ps=0",
      says="tf.keras (tf-keras) for a ps run, or num_ps=0", spark=True)
def run_keras3_parameter_servers(env):
    tfnb.run(keras3_fit, num_workers=2, num_ps=1, ps_placement="driver", spark=env.spark, display=False,
             max_attempts=2)


class TestRefusals(Refusals):
    """The cases above."""
