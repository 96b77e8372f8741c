"""What a barrier task is given (:class:`TaskSpec`) and the pure functions it sets itself up with."""
from __future__ import annotations

import importlib.util
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any

from .._protocol import ENV_PREIMPORT

ENV_SUPERVISOR = "TFNB_SUPERVISOR_PID"  # a fresh train_fn process' supervisor: it dies with it (tfnb._task.child)

# What TensorFlow's C++ logging prints before it reads TF_CPP_MIN_LOG_LEVEL, never actionable: dropped unless it is 0
_TF_STARTUP_NOISE = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    r"|^[IWE]\d{4} [\d:.]+\s+\d+ (port\.cc|cudart_stub\.cc|cpu_feature_guard\.cc|cuda_platform\.cc|"
    r"cuda_executor\.cc|cuda_dnn\.cc|cuda_fft\.cc|cuda_blas\.cc)(:\d+)?\] "
    r"|^To enable the following instructions: .* in other operations, rebuild TensorFlow")


@dataclass(frozen=True)
class TaskSpec:
    """Everything a barrier task needs, as plain values the driver fixed before launch."""

    run_id: str
    attempt: int
    max_attempts: int
    num_workers: int
    num_ps: int
    channel: tuple
    token: str = field(repr=False)
    payload: bytes = field(repr=False)  # cloudpickle of (train_fn, args, kwargs)
    model_dir: str | None = None
    log_dir: str | None = None
    use_gpu: bool | None = None
    env: tuple = field(default=(), repr=False)  # ((name, value), ...) for the train_fn process; often credentials
    legacy_keras: bool | None = None  # None: tf.keras is tf-keras where it is installed
    preimport: tuple = ("tensorflow",)  # imported by the child while the tasks exchange addresses
    feed: Any = None  # feeding.FeedSpec when tfnb.run(data=df)
    profile_steps: tuple | None = None  # (first, last) steps each worker traces (tfnb._task.profiling)
    profile_run: str = ""  # the profile plugin's run folder for this attempt
    stop_grace: float = 5.0
    hooks: TaskHooks = field(default_factory=lambda: TaskHooks())  # an add-on's LaunchHooks, task part
    settings: tuple = field(default=(), repr=False)  # the driver's TFNB_* settings, (name, value) pairs
    warm: bool = False  # fork the train_fn process from this host's warm standby (started when none matches)
    warm_idle: float = 600.0  # seconds an unclaimed standby waits before it exits
    linger: bool = False  # a finished train_fn process waits until every task's train_fn has returned
    first_rank: int = 0  # rank of partition 0: num_workers for the ps tasks' own job (tfnb.launcher.resources)
    requested_workers: int = 0  # the run's num_workers; an elastic run's launch may have fewer (num_workers)
    resized_from: int | None = None  # the previous launch's num_workers when this one has another
    min_workers: int | None = None  # an elastic run's floor; its tasks agree on resizes at epoch boundaries


@dataclass(frozen=True)
class TaskHooks:
    """The task's part of :class:`tfnb.launcher.LaunchHooks` (see there): plain values and the feeder."""

    feeder: Any = None
    all_results: bool = False
    keep_port: bool = False
    task_cwd: bool = False


def is_startup_noise(line: str, min_log_level: str) -> bool:
    return min_log_level not in ("", "0") and bool(_TF_STARTUP_NOISE.match(line))


def assign_role(rank: int, num_workers: int, num_ps: int) -> tuple[str, int]:
    """(job_name, task_index) for barrier partition ``rank``: chief first, then workers, then ps."""
    if rank < num_workers:
        return ("chief" if rank == 0 else "worker"), rank
    return "ps", rank - num_workers


def build_cluster(addresses: list[str], num_workers: int, num_ps: int) -> dict[str, list[str]]:
    """TF cluster spec: every task a ``worker`` for MultiWorkerMirroredStrategy; with ps tasks, a ``chief`` job."""
    if num_ps == 0:
        return {"worker": list(addresses)}
    return {"chief": [addresses[0]], "worker": list(addresses[1:num_workers]), "ps": list(addresses[num_workers:])}


def tf_config_for(cluster: dict, job_name: str, task_index: int, num_ps: int) -> dict:
    if num_ps == 0:
        task = {"type": "worker", "index": task_index}
    elif job_name == "worker":
        task = {"type": "worker", "index": task_index - 1}
    else:
        task = {"type": job_name, "index": task_index if job_name == "ps" else 0}
    return {"cluster": cluster, "task": task}


def assigned_gpus(resources: dict, use_gpu: bool | None, job_name: str = "worker") -> tuple[str, ...]:
    """GPU addresses Spark gave this task, honouring ``use_gpu`` (a ps task needs none)."""
    info = resources.get("gpu")
    gpus = tuple(info.addresses) if info is not None else ()
    if use_gpu and not gpus and job_name != "ps":
        raise RuntimeError("use_gpu=True but Spark assigned this task no GPU; set spark.task.resource.gpu.amount "
                           "(and spark.executor.resource.gpu.amount with a discovery script), or pass use_gpu=False")
    return gpus if use_gpu is not False else ()


def child_env(base: dict, spec: TaskSpec, gpus: tuple) -> dict:
    """The train_fn process environment; TF_CONFIG is added by the child once the cluster is known."""
    env = dict(base)
    # With no GPU assigned the process sees none, even on a GPU host: Spark did not give it one.
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    if spec.legacy_keras or (spec.legacy_keras is None and importlib.util.find_spec("tf_keras") is not None):
        # tf.keras code keeps tf-keras's behaviour where it is installed; `import keras` is Keras 3 either way
        env.setdefault("TF_USE_LEGACY_KERAS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.pop("TF_CONFIG", None)
    env["PYTHONUNBUFFERED"] = "1"
    env["TFNB_RUN_ID"] = spec.run_id
    env["TFNB_ATTEMPT"] = str(spec.attempt)
    env[ENV_PREIMPORT] = ",".join(spec.preimport)
    env.update(dict(spec.env))
    return env


def reserve_port() -> socket.socket:
    """A socket bound to a free port on all interfaces, held until the child is about to start TF."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    sock.set_inheritable(True)
    return sock


def _spark_local_dir() -> str | None:
    # Spark deletes its local dirs when the application ends, even after a task killed before its clean-up
    dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    first = dirs.split(",")[0] if dirs else ""
    return first if first and os.path.isdir(first) else None
