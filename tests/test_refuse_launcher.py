"""Refusals of tfnb.run's arguments and TFNB_* settings: raised before a Spark session is needed
(TFNB_DISPLAY's is the one checked with the shared session)."""
from __future__ import annotations

import threading

import tfnb
from tfnb import ConfigError

from refusals import Refusals, case, one


@case("launcher", "`tfnb.run('train.py', ...)`", ConfigError, "got str", "(ctx, *args)",
      says="pass a function taking (ctx, *args)")
def run_train_fn_not_callable(env):
    tfnb.run("train.py", num_workers=2, display=False)


@case("launcher", "`num_workers=0`", ConfigError, "num_workers=0", "num_workers=2",
      says="an int >= 1, e.g. num_workers=2")
def run_num_workers_zero(env):
    tfnb.run(one, num_workers=0, display=False)


@case("launcher", "`num_workers='2'`", ConfigError, "num_workers='2'", "int >= 1",
      says="an int >= 1, e.g. num_workers=2")
def run_num_workers_str(env):
    tfnb.run(one, num_workers="2", display=False)


@case("launcher", "`num_ps=-1`", ConfigError, "num_ps=-1", "num_ps=0 runs MultiWorkerMirroredStrategy",
      says="an int >= 0 (0: MultiWorkerMirroredStrategy)")
def run_num_ps_negative(env):
    tfnb.run(one, num_workers=2, num_ps=-1, display=False)


@case("launcher", "`num_ps=1` with `num_workers=1`", ConfigError, "num_ps=1", "num_workers >= 2 or num_ps=0",
      says="num_workers >= 2 (a chief and a worker), or num_ps=0")
def run_ps_without_worker(env):
    tfnb.run(one, num_workers=1, num_ps=1, display=False)


@case("launcher", "`gpus_per_worker=1.5`", ConfigError, "gpus_per_worker=1.5", "int >= 0",
      "spark.task.resource.gpu.amount", says="whole GPUs per chief/worker task (0: none), or None for the conf's")
def run_gpus_per_worker_fraction(env):
    tfnb.run(one, num_workers=2, gpus_per_worker=1.5, display=False)


@case("launcher", "`cpus_per_worker=0`", ConfigError, "cpus_per_worker=0", "int >= 1", "spark.task.cpus",
      says="CPU cores per chief/worker task (>= 1), or None for spark.task.cpus")
def run_cpus_per_worker_zero(env):
    tfnb.run(one, num_workers=2, cpus_per_worker=0, display=False)


@case("launcher", "`use_gpu=False` with `gpus_per_worker=2`", ConfigError, "use_gpu=False", "gpus_per_worker=2",
      "gpus_per_worker=0", says="gpus_per_worker=0 for a run without GPUs, or leave use_gpu out")
def run_use_gpu_false_with_gpus(env):
    tfnb.run(one, num_workers=2, use_gpu=False, gpus_per_worker=2, display=False)


@case("launcher", "`ps_placement='gpu'`", ConfigError, "ps_placement='gpu'", "'executors'", "'driver'",
      says="'executors' (default) or 'driver'")
def run_ps_placement_unknown(env):
    tfnb.run(one, num_workers=2, num_ps=1, ps_placement="gpu", display=False)


@case("launcher", "`args=5`", ConfigError, "got int", "args=(value,)", says="a tuple: args=(value,)")
def run_args_not_tuple(env):
    tfnb.run(one, num_workers=2, args=5, display=False)


@case("launcher", "`timeout=0`", ConfigError, "timeout=0", "None for no limit", says="seconds > 0, or None")
def run_timeout_zero(env):
    tfnb.run(one, num_workers=2, timeout=0, display=False)


@case("launcher", "`TFNB_TIMEOUT=soon`", ConfigError, "TFNB_TIMEOUT='soon'", "fix or unset TFNB_TIMEOUT",
      says="fix or unset the variable")
def run_timeout_env_not_a_number(env):
    env.setenv("TFNB_TIMEOUT", "soon")
    tfnb.run(one, num_workers=2, display=False)


@case("launcher", "`timeout='10'`", ConfigError, "timeout='10'", "number of seconds > 0",
      says="a number of seconds > 0, or None")
def run_timeout_str(env):
    tfnb.run(one, num_workers=2, timeout="10", display=False)


@case("launcher", "`max_attempts=0`", ConfigError, "max_attempts=0", "1 = never relaunch",
      says=">= 1 (1 = never relaunch)")
def run_max_attempts_zero(env):
    tfnb.run(one, num_workers=2, max_attempts=0, display=False)


@case("launcher", "`max_attempts=2.5`", ConfigError, "max_attempts=2.5", "int >= 1", says="an int >= 1")
def run_max_attempts_float(env):
    tfnb.run(one, num_workers=2, max_attempts=2.5, display=False)


@case("launcher", "`TFNB_MAX_ATTEMPTS=many`", ConfigError, "TFNB_MAX_ATTEMPTS='many'", "fix or unset",
      says="fix or unset the variable")
def run_max_attempts_env(env):
    env.setenv("TFNB_MAX_ATTEMPTS", "many")
    tfnb.run(one, num_workers=2, display=False)


@case("launcher", "`preimport='tensorflow'`", ConfigError, "preimport='tensorflow'", "preimport=('tensorflow',)",
      says="a sequence: preimport=('tensorflow',)")
def run_preimport_str(env):
    tfnb.run(one, num_workers=2, preimport="tensorflow", display=False)


@case("launcher", "`preimport=[1]`", ConfigError, "preimport=[1]", "preimport=('tensorflow',)",
      says="module names as strings")
def run_preimport_not_names(env):
    tfnb.run(one, num_workers=2, preimport=[1], display=False)


@case("launcher", "`profile_steps=(25, 20)`", ConfigError, "profile_steps=(25, 20)", "profile_steps=(20, 25)",
      says="(first, last) with first <= last")
def run_profile_steps_reversed(env):
    tfnb.run(one, num_workers=2, profile_steps=(25, 20), log_dir="/tmp/logs", display=False)


@case("launcher", "`profile_steps=(20, 25)` without `log_dir`", ConfigError, "profile_steps=(20, 25)",
      "pass log_dir=", says="pass log_dir= (where the traces go)")
def run_profile_steps_no_log_dir(env):
    tfnb.run(one, num_workers=2, profile_steps=(20, 25), display=False)


@case("launcher", "`mlflow=1`", ConfigError, "mlflow=1", "mlflow='my-training'",
      says="True, an experiment name or None")
def run_mlflow_not_bool_or_name(env):
    tfnb.run(one, num_workers=2, mlflow=1, display=False)


@case("launcher", "`env={'SEED': 1}`", ConfigError, "'SEED': 'int'", "str()", says="str -> str; convert with str()")
def run_env_not_str(env):
    tfnb.run(one, num_workers=2, env={"SEED": 1}, display=False)


@case("launcher", "`env=['SEED=1']`", ConfigError, "not list", "str()", says="a dict of str -> str")
def run_env_not_mapping(env):
    tfnb.run(one, num_workers=2, env=["SEED=1"], display=False)


@case("launcher", "train_fn capturing a lock", ConfigError, "cannot be sent to the workers", "lock",
      "create those inside train_fn", says="capture plain values only; create objects inside train_fn")
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


class TestRefusals(Refusals):
    """The cases above."""
