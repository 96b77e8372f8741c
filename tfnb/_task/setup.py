"""What a barrier task is given (:class:`TaskSpec`) and the pure functions it sets itself up with."""
from __future__ import annotations

import importlib.util
import socket
from dataclasses import dataclass, field
from typing import Any

from .._protocol import ENV_PREIMPORT

ENV_SUPERVISOR = "TFNB_SUPERVISOR_PID"  # a fresh train_fn process' supervisor: it dies with it (tfnb._task.child)

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


def assign_role(rank: int, num_workers: int, num_ps: int) -> tuple[str, int]:
    """(job_name, task_index) for barrier partition ``rank``: chief first, then workers, then ps."""
    if rank < num_workers:
        return ("chief" if rank == 0 else "worker"), rank
    return "ps", rank - num_workers


def tf_config_for(addresses: list[str], job: str, index: int, num_workers: int, num_ps: int) -> dict:
    """TF_CONFIG of an assign_role task: all ``worker`` for MultiWorkerMirroredStrategy; with ps, a ``chief`` job."""
    if num_ps == 0:
        return {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}}
    cluster = {"chief": addresses[:1], "worker": addresses[1:num_workers], "ps": addresses[num_workers:]}
    return {"cluster": cluster, "task": {"type": job, "index": index - (job == "worker")}}


def assigned_gpus(resources: dict, use_gpu: bool | None, job_name: str = "worker") -> tuple[str, ...]:
    """GPU addresses Spark gave this task, honouring ``use_gpu`` (a ps task needs none)."""
    info = resources.get("gpu")
    gpus = tuple(info.addresses) if info is not None else ()
    if use_gpu and not gpus and job_name != "ps":
        raise RuntimeError("use_gpu=True but Spark assigned this task no GPU; set spark.task.resource.gpu.amount "
                           "(and spark.executor.resource.gpu.amount with a discovery script), or pass use_gpu=False")
    return gpus if use_gpu is not False else ()


def child_env(base: dict, spec: TaskSpec, gpus: tuple) -> dict:
    """The train_fn process environment; TF_CONFIG is added by the child once the cluster is known. With no GPU
    assigned the process sees none, even on a GPU host: Spark did not give it one."""
    env = {name: value for name, value in base.items() if name != "TF_CONFIG"}
    if spec.legacy_keras or (spec.legacy_keras is None and importlib.util.find_spec("tf_keras") is not None):
        # tf.keras code keeps tf-keras's behaviour where it is installed; `import keras` is Keras 3 either way
        env.setdefault("TF_USE_LEGACY_KERAS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update({"CUDA_VISIBLE_DEVICES": ",".join(gpus), "PYTHONUNBUFFERED": "1", "TFNB_RUN_ID": spec.run_id,
                "TFNB_ATTEMPT": str(spec.attempt), ENV_PREIMPORT: ",".join(spec.preimport)})
    env.update(spec.env)
    return env


def reserve_port() -> socket.socket:
    """A socket bound to a free port on all interfaces, held until the child is about to start TF."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    sock.set_inheritable(True)
    return sock
