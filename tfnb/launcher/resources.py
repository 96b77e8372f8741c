"""What the tasks ask Spark for (the conf, or a task resource profile for ``gpus_per_worker=``/``cpus_per_worker=``),
where the ps tasks go, and whether it all fits on the executors (docs/resources.md)."""
from __future__ import annotations

import collections
import logging
import os
import re
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

from .._deps import _version
from ..errors import ClusterError

log = logging.getLogger(__name__)

# Spark's own words when it refuses a profile (ResourceProfileManager.isSupported), in a job's error too
_SPARK_REFUSAL = re.compile(r"(Task)?ResourceProfiles are only supported[^\n]*")


def spark_version(text: str) -> tuple[int, int, int]:
    return _version(text, 3)  # type: ignore[return-value]


def _local_cores(master: str) -> int | None:
    """The cores of a local master's one JVM (``local``, ``local[N]``, ``local[*]``); None for other masters."""
    m = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master.strip())
    if not m:
        return None
    return (os.cpu_count() or 1) if m.group(1) == "*" else int(m.group(1) or 1)


def profile_support(version: tuple[int, int, int], master: str, *, connect: bool) -> str | None:
    """Why a task resource profile cannot run with this Spark ``version`` and ``master``; None if nothing rules it out
    (standalone and local-cluster from 3.5.0, YARN and Kubernetes from 3.5.1, never local[N])."""
    v = ".".join(map(str, version))
    if _local_cores(master) is not None:
        return f"no Spark version runs them on a local master ({master})"
    if connect and version < (4, 0, 0):
        return (f"a Spark Connect session on Spark {v} ({master or 'master unknown'}) cannot attach one: "
                "mapInArrow takes profile= from Spark 4.0, and Spark Connect has no RDD API")
    if version < (3, 5, 1) and master.startswith(("yarn", "k8s://")):
        return f"Spark {v} runs them on standalone masters only, not on {master} (YARN and Kubernetes from 3.5.1)"
    return None


def build_method(version: tuple[int, int, int], client: tuple[int, int, int]) -> str:
    """``"profile"`` (mapInArrow's profile=, Spark 4.0+ on server and client) or ``"rdd"`` (withResources, 3.5)."""
    return "profile" if min(version, client) >= (4, 0, 0) else "rdd"


@dataclass(frozen=True)
class Ask:
    cpus: int
    gpus: float

    def __str__(self) -> str:
        gpus = f"{self.gpus:g} GPU{'s' if self.gpus != 1 else ''}" if self.gpus else "no GPU"
        return f"{gpus} and {self.cpus} CPU{'s' if self.cpus != 1 else ''}"


@dataclass(frozen=True)
class Placement:
    """Where a run's tasks go and what each asks for, as :func:`plan` decided it. ``ps``: what each ps task asks
    in a barrier job of its own (None: they share the workers' stage, run on the driver, or there are none);
    ``*_profile``: that stage carries a task resource profile; ``build``: see :func:`build_method`."""

    workers: Ask
    worker_profile: bool = False
    ps: Ask | None = None
    ps_profile: bool = False
    ps_on_driver: bool = False
    build: str = "profile"
    profiles: dict = field(default_factory=dict, compare=False, repr=False)  # Ask -> ResourceProfile, see with_profiles

    def profile(self, ask: Ask):
        if ask in self.profiles:
            return self.profiles[ask]
        from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

        requests = TaskResourceRequests().cpus(ask.cpus)
        if ask.gpus:
            requests = requests.resource("gpu", ask.gpus)
        return ResourceProfileBuilder().require(requests).build


def with_profiles(spark, placement: Placement) -> Placement:
    """``placement`` with its profiles built once for every attempt. A Spark Connect profile registers through the
    calling thread's active session (the job's thread has none): its id is taken here, ``spark`` made active."""
    profiles = {a: placement.profile(a) for a, on in ((placement.workers, placement.worker_profile),
                                                      (placement.ps, placement.ps_profile)) if on and a is not None}
    if profiles and is_connect(spark):
        local = type(spark)._active_session  # pyspark.sql.connect's per-thread active session
        before = getattr(local, "session", None)
        local.session = spark
        try:
            for profile in profiles.values():
                profile.id  # noqa: B018 - registers it with the server, once
        finally:
            local.session = before
    return replace(placement, profiles=profiles)


def _conf(spark, key: str, default: str | None = None) -> str | None:
    try:
        return spark.conf.get(key, default)
    except Exception:  # noqa: BLE001 - Connect raises its own types for unknown keys
        return default


def _asked(gpus: int | None, cpus: int | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (("gpus_per_worker", gpus), ("cpus_per_worker", cpus)) if v is not None)


def _conf_fix(gpus: int | None, cpus: int | None, master: str) -> str:
    local = _local_cores(master) is not None
    conf = [f"spark.task.resource.gpu.amount={gpus}" if gpus else "no spark.task.resource.gpu.amount"] \
        if gpus is not None else []
    conf += [f"spark.task.cpus={cpus}"] if cpus is not None else []
    gpu = (f", with spark.{'driver' if local else 'executor'}.resource.gpu.amount and its discoveryScript"
           if gpus else "")
    if local:
        return (f"set {' and '.join(conf)} when the session starts\nSet it in the session's conf "
                f"(SparkSession.builder.config){gpu}, or run on a standalone, YARN or Kubernetes master "
                "(local-cluster[N,C,M] in tests).")
    return (f"set {' and '.join(conf)} in the cluster's Spark conf\nRestart the cluster after setting it (it "
            f"applies to every task){gpu}, or use a Spark version and cluster manager that run task resource "
            "profiles (docs/resources.md).")


def is_connect(spark) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def refused_by_spark(text: str) -> str | None:
    m = _SPARK_REFUSAL.search(text)
    return m.group(0).strip() if m else None


def _ask_session(spark, placement: Placement, ask: Ask) -> str | None:
    """Spark's own refusal of ``ask`` (``ResourceProfileManager.isSupported``) on a classic session."""
    if is_connect(spark):
        return None  # no JVM to ask: a refusal comes back as the job's error (see refused_by_spark)
    try:
        jrp = placement.profile(ask)._java_resource_profile
        spark.sparkContext._jsc.sc().resourceProfileManager().isSupported(jrp)
    except Exception as e:  # noqa: BLE001 - Py4JJavaError carrying Spark's SparkException
        said = refused_by_spark(str(e))
        if said is None:
            log.debug("isSupported could not be asked: %s", e)
            return None
        return f"this cluster's Spark {spark.version} ({_conf(spark, 'spark.master', '?')}) refuses it: {said}"
    return None


def plan(spark, *, num_workers: int, num_ps: int = 0, gpus_per_worker: int | None = None,
         cpus_per_worker: int | None = None, ps_placement: str = "executors") -> Placement:
    """The workers get a profile only when the per-run asks differ from the conf; beside GPU workers the ps tasks run
    as a second, CPU-only barrier job (a profile where the conf gives every task a GPU and Spark can run one, else
    they share the workers' stage, with a warning). ClusterError: a per-run request this Spark cannot attach."""
    import pyspark

    master = _conf(spark, "spark.master", "") or ""
    default = Ask(int(_conf(spark, "spark.task.cpus", "1") or 1),
                  float(_conf(spark, "spark.task.resource.gpu.amount", "0") or 0))
    ask = Ask(default.cpus if cpus_per_worker is None else cpus_per_worker,
              default.gpus if gpus_per_worker is None else float(gpus_per_worker))
    version = spark_version(getattr(spark, "version", pyspark.__version__))
    client = spark_version(pyspark.__version__)
    placement = Placement(workers=ask, worker_profile=ask != default, build=build_method(version, client))
    if placement.worker_profile:
        why = profile_support(version, master, connect=is_connect(spark)) or _ask_session(spark, placement, ask)
        if why:
            raise ClusterError(f"{_asked(gpus_per_worker, cpus_per_worker)} needs a Spark task resource profile, "
                               f"but {why}; " + _conf_fix(gpus_per_worker, cpus_per_worker, master))
    if num_ps == 0:
        return placement
    if ps_placement == "driver":
        return replace(placement, ps_on_driver=True)
    if not ask.gpus:
        return placement  # CPU workers: the ps tasks share their stage, as ever
    ps = Ask(default.cpus, 0.0)
    if not default.gpus:
        return replace(placement, ps=ps)  # the session's default profile gives no GPU
    why = profile_support(version, master, connect=is_connect(spark)) or _ask_session(spark, placement, ps)
    if why:
        log.warning("tfnb: num_ps=%d: the ps tasks share the workers' stage and hold %g GPU(s) each that they "
                    "never use: a CPU-only task resource profile would keep them off, but %s; pass "
                    "ps_placement='driver' to run them on the driver instead", num_ps, default.gpus, why)
        return placement
    return replace(placement, ps=ps, ps_profile=True)


def room(executors: Sequence[tuple[int, float]], workers: Ask, num_workers: int, ps: Ask | None = None,
         ) -> tuple[int, int]:
    """(chief/worker tasks ``executors`` (cores, GPUs) hold, ps tasks that fit beside ``num_workers`` workers packed
    first-fit onto the roomiest executors): what can fit, not where Spark puts each task."""
    def each(cores: int, gpus: float) -> int:
        by_cpu = cores // max(workers.cpus, 1)
        return min(by_cpu, int(gpus // workers.gpus)) if workers.gpus else by_cpu

    fits = [each(c, g) for c, g in executors]
    if ps is None:
        return sum(fits), 0
    left, placed = [], 0
    for (cores, _), n in sorted(zip(executors, fits), key=lambda e: -e[1]):
        take = min(n, num_workers - placed)
        placed += take
        left.append(cores - take * workers.cpus)
    return sum(fits), sum(c // max(ps.cpus, 1) for c in left)


def _describe(executors: Sequence[tuple[int, float]]) -> str:
    groups = collections.Counter(executors)
    return " + ".join(f"{n} executor{'s' if n != 1 else ''} × ({g:g} GPU{'s' if g != 1 else ''}, "
                      f"{c} core{'s' if c != 1 else ''})" for (c, g), n in sorted(groups.items())) or "no executors"


def fit_error(master: str, executors: Sequence[tuple[int, float]], placement: Placement, num_workers: int,
              num_ps: int, knobs: str) -> ClusterError | None:
    """The ClusterError, with the arithmetic, for a run ``executors`` cannot hold; None if it fits."""
    ps = placement.ps
    workers = num_workers + (num_ps if ps is None and not placement.ps_on_driver else 0)
    fit_w, fit_ps = room(executors, placement.workers, workers, ps)
    w = placement.workers
    if fit_w < workers and not placement.worker_profile and ps is None:  # the session's conf: Spark's task slots
        who = "num_workers; the ps run on the driver" if placement.ps_on_driver else "num_workers + num_ps"
        gpu = f", and spark.task.resource.gpu.amount={w.gpus:g} GPU" if w.gpus else ""
        return ClusterError(
            f"the run needs {workers} task slots ({who}) but the cluster ({master}) has {fit_w}; lower "
            "num_workers/num_ps or add executors/cores\n"
            f"A barrier stage runs all its tasks at once. Each task takes spark.task.cpus={w.cpus} core{gpu}; the "
            f"cluster has {_describe(executors)}. More slots come from more executors (spark.executor.instances) or "
            "more cores each (spark.executor.cores).")
    if fit_w < workers:
        what = "chief/worker" if workers == num_workers else "chief/worker/ps"
        need = (f"{workers} × {w.gpus:g} = {workers * w.gpus:g} GPUs" if w.gpus
                else f"{workers} × {w.cpus} = {workers * w.cpus} cores")
        offer = f"{sum(g for _, g in executors):g} GPUs" if w.gpus else f"{sum(c for c, _ in executors)} cores"
        return ClusterError(
            f"the cluster has room for {fit_w} of the run's {workers} {what} tasks; lower num_workers or the "
            f"per-task amounts, or add executors\nIt needs {workers} {what} tasks of {w} each ({knobs}): {need}; the "
            f"cluster ({master}) has {_describe(executors)} = {offer}, room for {fit_w} such "
            f"task{'s' if fit_w != 1 else ''} (a task runs on one executor). Add executors with "
            "spark.executor.instances, or bigger ones with spark.executor.cores and "
            "spark.executor.resource.gpu.amount.")
    if ps is not None and fit_ps < num_ps:
        return ClusterError(
            f"the run's {num_workers} workers leave the cluster room for {fit_ps} ps task{'s' if fit_ps != 1 else ''}; "
            f"lower num_ps (now {num_ps}), add cores, or pass ps_placement='driver'\n"
            f"It needs {num_ps} ps task{'s' if num_ps != 1 else ''} of {ps} each beside its {num_workers} workers of "
            f"{w} each; the cluster ({master}) has {_describe(executors)}. Add cores with spark.executor.cores or "
            "executors with spark.executor.instances.")
    return None


def _executors(spark, leaving: frozenset = frozenset(), own: dict[str, int] | None = None,
               ) -> list[tuple[int, float]] | None:
    """(cores, GPUs) of each registered executor (local: the driver), ``leaving`` left out; None on Spark Connect.
    With ``own`` (executor id -> tasks of a running launch), other jobs' running tasks are taken off."""
    if is_connect(spark):
        return None
    store = spark.sparkContext._jsc.sc().statusStore().executorList(True)
    local = _local_cores(_conf(spark, "spark.master", "") or "") is not None
    task_cpus = int(_conf(spark, "spark.task.cpus", "1") or 1)
    task_gpus = float(_conf(spark, "spark.task.resource.gpu.amount", "0") or 0)
    fallback = float(_conf(spark, f"spark.{'driver' if local else 'executor'}.resource.gpu.amount", "0") or 0)
    out = []
    for i in range(store.size()):
        e = store.apply(i)
        if (e.id() == "driver") != local or e.id() in leaving:
            continue
        gpu = e.resources().get("gpu")
        gpus = float(len(gpu.get().addresses())) if gpu.isDefined() else fallback
        others = 0 if own is None else max(int(e.activeTasks()) - own.get(e.id(), 0), 0)
        out.append((max(int(e.totalCores()) - others * task_cpus, 0), max(gpus - others * task_gpus, 0.0)))
    return out


def _expected(spark, master: str) -> tuple[int | None, tuple[int, float] | None]:
    """(executors the conf promises, (cores, GPUs) each), None where the conf does not say."""
    local = _local_cores(master)
    if local is not None:  # the driver's one JVM
        return 1, (local, float(_conf(spark, "spark.driver.resource.gpu.amount", "0") or 0))
    gpus = float(_conf(spark, "spark.executor.resource.gpu.amount", "0") or 0)
    cluster = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master)  # [N, cores, MB]
    if cluster:
        return int(cluster.group(1)), (int(cluster.group(2)), gpus)
    cores = _conf(spark, "spark.executor.cores")
    count = _conf(spark, "spark.executor.instances")
    if count is None and cores and _conf(spark, "spark.cores.max"):
        count = str(int(_conf(spark, "spark.cores.max")) // max(int(cores), 1))  # standalone
    return (int(count) if count else None), ((int(cores), gpus) if cores else None)


def check_fit(spark, placement: Placement, num_workers: int, num_ps: int, knobs: str, wait: float) -> None:
    """Refuse a run whose tasks cannot all be placed (ClusterError with the arithmetic): at once when even every
    executor the conf promises could not hold it, else after up to TFNB_SLOT_WAIT s (30) for those registering."""
    master = _conf(spark, "spark.master", "") or ""
    count, each = _expected(spark, master)
    if count is not None and each is not None:
        error = fit_error(master, [each] * count, placement, num_workers, num_ps, knobs)
        if error is not None:
            raise error  # even every executor the conf promises could not hold it: no waiting
    executors = _executors(spark)
    if executors is None:
        return  # Spark Connect without the cluster's size in its conf: Spark's own barrier check decides
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and (len(executors) < count if count is not None else
                                           fit_error(master, executors, placement, num_workers, num_ps, knobs)):
        time.sleep(0.25)
        executors = _executors(spark)
    error = fit_error(master, executors, placement, num_workers, num_ps, knobs)
    if error is not None:
        raise error
