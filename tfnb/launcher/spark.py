"""The launcher's Spark glue: the session, what the cluster can host, where tasks reach the driver, job tags.
Each check refuses, with the fix, what could never run."""
from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import re
import socket
import sys
from pathlib import PurePosixPath
from typing import Sequence

from .._config import setting
from ..errors import ClusterError, ConfigError
from .resources import _asked, _conf, _local_cores, check_fit, is_connect, plan


def _refuse_in_task(verb: str) -> None:
    """Refuse a driver verb inside train_fn (TFNB_RUN_ID is set) or a Spark task: it would start a second Spark."""
    run_id = os.environ.get("TFNB_RUN_ID")
    pyspark = sys.modules.get("pyspark")  # a Spark task has imported it; the check imports nothing
    task = getattr(pyspark, "TaskContext", None)
    task = task.get() if task is not None else None
    if run_id is not None:
        where, fix = (f"inside train_fn (a train_fn process of run {run_id})",
                      "train_fn already runs on every worker: train there, and call tfnb.run once from the notebook")
    elif task is not None:
        where, fix = (f"inside a Spark task (stage {task.stageId()}, partition {task.partitionId()}) on an executor",
                      "call it from the notebook, not from a UDF or a mapInArrow/mapPartitions/foreach function")
    else:
        return
    raise ConfigError(f"{verb} was called {where}, but it runs on the Spark driver only; {fix}")


def get_spark(spark=None, num_slots: int = 2):
    """``spark``, else the active session, else a new ``local[N]`` one whose Python workers run this interpreter."""
    from .._deps import require_spark

    _refuse_in_task("tfnb's launcher")
    require_spark(spark)  # Spark >= 3.5, or one error naming the floor and the fix
    if spark is not None:
        return spark
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    cores = max(num_slots, os.cpu_count() or 1)
    return (SparkSession.builder.master(f"local[{cores}]").appName("tfnb")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate())


def _check_session(spark) -> None:
    if not (hasattr(type(spark), "conf") and callable(getattr(spark, "range", None))
            and callable(getattr(spark, "interruptTag", None))):
        hint = ("pass the SparkSession (spark), not its SparkContext" if type(spark).__name__ == "SparkContext"
                else "pass a SparkSession (classic or Spark Connect), or leave spark= out to use the active one")
        raise ConfigError(f"spark={repr(spark)[:80]} ({type(spark).__name__}) is not a SparkSession; {hint}")
    if is_connect(spark):
        stopped = bool(getattr(spark, "is_stopped", False))
    else:
        jsc = getattr(getattr(spark, "_sc", None), "_jsc", None)
        try:
            stopped = jsc is None or jsc.sc().isStopped()
        except Exception:  # noqa: BLE001 - a dead JVM gateway: as stopped as it gets
            stopped = True
    if stopped:
        raise ConfigError("spark= is a stopped SparkSession (spark.stop() was called, or its SparkContext "
                          "ended); start a new one with SparkSession.builder.getOrCreate() and pass that, "
                          "or leave spark= out")


def check_cluster(spark, needed: int, wait: float | None = None, use_gpu: bool | None = None, *,
                  num_ps: int = 0, gpus_per_worker: int | None = None, cpus_per_worker: int | None = None,
                  ps_placement: str = "executors"):
    """Fail fast when Spark could never schedule the run's barrier stage(s) of ``needed`` tasks; return its
    :class:`~tfnb.launcher.resources.Placement`. ConfigError: ``spark`` is not a live SparkSession; ClusterError:
    dynamic allocation, too few task slots, GPUs it cannot give, or a per-run request this Spark cannot attach."""
    _check_session(spark)
    wait = setting("slot_wait", wait, 30.0, float)  # seconds for executors to register before judging
    gpu_per_task = float(_conf(spark, "spark.task.resource.gpu.amount", "0") or 0)
    if use_gpu and gpus_per_worker is None and gpu_per_task <= 0:
        # Spark hands GPUs only to tasks that ask for them; without this conf every task would fail after launch.
        raise ClusterError(
            f"use_gpu=True but spark.task.resource.gpu.amount is {gpu_per_task:g} on this session, so no task gets "
            "a GPU; pass gpus_per_worker=1, set spark.task.resource.gpu.amount=1, or pass use_gpu=None\n"
            "Spark gives GPUs only to tasks that ask for them: gpus_per_worker=1 asks for this run; "
            "spark.task.resource.gpu.amount=1 with spark.executor.resource.gpu.amount (plus a GPU discovery "
            "script), set when the cluster starts, asks for every task; use_gpu=None runs on whatever the tasks get.")
    if (_conf(spark, "spark.dynamicAllocation.enabled", "false") or "false").lower() == "true":
        raise ClusterError(
            "Spark barrier mode does not run with dynamic allocation; start the cluster with "
            "spark.dynamicAllocation.enabled=false (on Databricks: a fixed-size cluster, autoscaling off)")
    master = _conf(spark, "spark.master", "") or ""
    # Local tasks get the driver's GPUs; a cluster's, the executors' (a Connect client may not see that conf).
    owner = "executor" if _local_cores(master) is None else "driver"
    have = _conf(spark, f"spark.{owner}.resource.gpu.amount")
    if gpu_per_task > 0 and float(have or 0) <= 0 and (owner == "driver" or not is_connect(spark)):
        raise ClusterError(
            f"spark.task.resource.gpu.amount={gpu_per_task:g} but spark.{owner}.resource.gpu.amount is "
            f"{have or 'unset'} on {master}, so no task can be given its GPU; unset "
            f"spark.task.resource.gpu.amount, or give the {owner} GPUs\n"
            f"The {owner}'s GPUs are spark.{owner}.resource.gpu.amount and spark.{owner}.resource.gpu.discoveryScript, "
            "set when the session (or cluster) starts.")
    placement = plan(spark, num_workers=needed - num_ps, num_ps=num_ps, gpus_per_worker=gpus_per_worker,
                     cpus_per_worker=cpus_per_worker, ps_placement=ps_placement)
    knobs = (_asked(gpus_per_worker, cpus_per_worker)
             or f"spark.task.resource.gpu.amount={gpu_per_task:g}, spark.task.cpus={placement.workers.cpus}")
    check_fit(spark, placement, needed - num_ps, num_ps, knobs, wait)
    return placement


_SHARED_ROOTS = ("/dbfs", "/Volumes", "/Workspace")  # Databricks: FUSE views of shared storage on every node
_SHARED_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs",
                        "9p", "virtiofs", "fuse"})  # and every fuse.* (sshfs, s3fs, gcsfuse...)


def _mount_type(path: str, table: str = "/proc/mounts") -> str:
    """The filesystem type of the mount holding ``path`` (the longest mount point in ``table``), "" unknown."""
    best, kind = "", ""
    with contextlib.suppress(OSError), open(table) as f:
        for line in f:
            fields = line.split()
            if len(fields) < 3:
                continue
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])  # \040 is a space
            if PurePosixPath(path).is_relative_to(point) and len(point) >= len(best):
                best, kind = point, fields[2]
    return kind


def is_shared_path(path, shared_prefixes: Sequence[str] = ()) -> bool:
    """Whether every host sees ``path`` as the driver does: URLs, ``/dbfs``, ``/Volumes``, ``/Workspace``, network or
    FUSE mounts (the driver's /proc/mounts), and paths under ``shared_prefixes``."""
    from ..storage import normalize

    text = normalize(path)
    if "://" in text:
        return True
    real = os.path.realpath(text)
    roots = (*_SHARED_ROOTS, *shared_prefixes)
    if any(PurePosixPath(p).is_relative_to(root) for p in (text, real) for root in roots):
        return True
    kind = _mount_type(real)
    return kind in _SHARED_FS or kind.startswith("fuse.")


def check_dirs_shared(spark, **dirs) -> None:
    """ConfigError for directories (``model_dir=...``) on the driver's own disk when executors run on other hosts;
    TFNB_SHARED_PATHS lists prefixes of shared disks tfnb cannot detect."""
    dirs = {k: v for k, v in dirs.items() if v}
    master = _conf(spark, "spark.master", "") or ""
    if not dirs or is_connect(spark) or master.startswith("local"):
        return
    prefixes = [p.strip() for p in setting("shared_paths", None, "", str).split(",") if p.strip()]
    local = {k: v for k, v in dirs.items() if not is_shared_path(v, prefixes)}
    if not local:
        return
    executors = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()  # the driver's own included
    hosts = _other_hosts({e.host() for e in executors} - {_conf(spark, "spark.driver.host")})
    if not hosts:
        return
    named = " and ".join(f"{k}={os.fspath(v)!r}" for k, v in local.items())
    raise ConfigError(
        f"{named} {'is' if len(local) == 1 else 'are'} on the driver's own disk, but executors run on other hosts "
        f"({', '.join(hosts[:3])}{', ...' if len(hosts) > 3 else ''}); use storage every host sees (/Volumes/..., "
        "/dbfs/... or s3://...)\n"
        "train_fn there would write to folders the driver never sees. Storage every host sees: a Unity Catalog "
        "Volume ('/Volumes/<catalog>/<schema>/<volume>/...'), a dbfs:/-backed '/dbfs/...' path or an "
        "'s3://bucket/prefix' URL; for a disk every host mounts at the same path, list its prefix in "
        "TFNB_SHARED_PATHS.")


def _is_this_machine(host: str) -> bool:
    """Whether an executor's ``host`` is the driver's machine: ``localhost``, its name, or resolving to a loopback
    address or one of its interfaces' (a route asked to it leaves from that very address; no packet is sent)."""
    name = host.strip("[]")
    if name.lower() in ("localhost", socket.gethostname().lower()):
        return True
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return False  # a name this machine cannot resolve is none of its own
    for family, _, _, _, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        ip = ipaddress.ip_address(sockaddr[0].split("%")[0])
        if ip.is_loopback:
            return True
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as s:  # OSError: no route to it
            s.connect((sockaddr[0], 9, *sockaddr[2:]))  # IPv6: flow info and scope (a link-local's interface)
            if ipaddress.ip_address(s.getsockname()[0].split("%")[0]) == ip:
                return True
    return False


def _other_hosts(hosts, enough: int = 6) -> list[str]:
    """The first ``enough`` of ``hosts`` (sorted) that are not the driver's machine."""
    return list(itertools.islice((h for h in sorted(filter(None, hosts)) if not _is_this_machine(h)), enough))


def _driver_host(spark) -> str:
    """Where tasks reach the driver: loopback for local masters, else spark.driver.host."""
    if _local_cores(_conf(spark, "spark.master", "") or "") is not None:
        return "127.0.0.1"
    return _conf(spark, "spark.driver.host") or "127.0.0.1"


@contextlib.contextmanager
def job_tag(spark, tag: str):
    """Tag the jobs this thread starts in the block for :func:`interrupt_jobs`. Classic sessions get a job group
    instead: their tags are scoped to the thread that added them, so the driver's interruptTag would miss the job."""
    connect = is_connect(spark)
    if connect:
        spark.addTag(tag)
    else:
        spark.sparkContext.setJobGroup(tag, tag, interruptOnCancel=True)
    try:
        yield
    finally:
        if connect:
            spark.removeTag(tag)
        else:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)


def interrupt_jobs(spark, tag: str) -> None:
    """Cancel the jobs started under :func:`job_tag` ``tag``."""
    if is_connect(spark):
        spark.interruptTag(tag)
    else:
        spark.sparkContext.cancelJobGroup(tag)
