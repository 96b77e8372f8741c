"""Resources per run and per role, on real components: a standalone master and worker started from the pip
pyspark, the worker advertising four GPUs through a discovery script, and an application of two executors
of (2 cores, 2 GPUs). No real GPU is needed: what is checked is that the addresses Spark assigns reach
``ctx.gpus`` and CUDA_VISIBLE_DEVICES, that a run can ask for other amounts than the cluster's conf
without a restart, that parameter servers hold none, and that what cannot be placed is refused at once.

pyspark 4.3 runs here, so the Spark 4 path (``mapInArrow(..., profile=)``) is what the cluster tests
exercise, on a classic session and (slow) on Spark Connect. The Spark 3.5 branch
(``RDD.barrier().withResources`` on classic sessions, standalone-only on 3.5.0, refused under Spark Connect)
is covered by unit tests of the decision functions given a version and a master
(``test_support_by_version_and_master``, ``test_plan_on_spark_3_5``) and, marked slow, by a real run on
Spark 3.5.0 from the simulated Databricks runtime's virtualenv (tests/test_runtime_sim.py builds it).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import threading
import time
from pathlib import Path

import pytest

import tfnb
from tfnb.errors import ClusterError, RunCancelledError, WorkerError
from tfnb.launcher import EventKind, LaunchHooks
from tfnb.launcher.resources import Ask, Placement, build_method, fit_error, plan, profile_support, room

# ---------------------------------------------------------------- the decisions, given version and master


@pytest.mark.parametrize("version, master, connect, refused", [
    ((3, 5, 0), "spark://h:7077", False, None),
    ((3, 5, 0), "local-cluster[2,1,1024]", False, None),
    ((3, 5, 0), "yarn", False, "Spark 3.5.0 runs them on standalone masters only, not on yarn"),
    ((3, 5, 0), "k8s://https://api:6443", False, "standalone masters only"),
    ((3, 5, 1), "yarn", False, None),
    ((3, 5, 4), "k8s://https://api:6443", False, None),
    ((3, 5, 1), "spark://h:7077", True, "Spark Connect session on Spark 3.5.1 (spark://h:7077) cannot attach"),
    ((4, 0, 0), "yarn", True, None),
    ((4, 3, 0), "spark://h:7077", False, None),
    ((4, 3, 0), "local[2]", False, "no Spark version runs them on a local master (local[2])"),
    ((3, 5, 0), "local", False, "local master (local)"),
    ((4, 0, 1), "local[*]", True, "local master"),
    ((4, 0, 0), "mesos://h:5050", False, None),  # not assumed either way: the session is asked
])
def test_support_by_version_and_master(version, master, connect, refused):
    why = profile_support(version, master, connect=connect)
    assert (why is None) if refused is None else (refused in why), why


def test_build_method_follows_the_older_of_server_and_client():
    assert build_method((4, 0, 0), (4, 3, 0)) == "profile"
    assert build_method((3, 5, 1), (3, 5, 1)) == "rdd"  # Spark 3.5: RDD.barrier().withResources
    assert build_method((4, 0, 0), (3, 5, 2)) == "rdd"  # a 3.5 client's mapInArrow has no profile=


class _Conf:
    def __init__(self, values):
        self.values = values

    def get(self, key, default=None):
        return self.values.get(key, default)


class _Classic35:
    """What plan() reads of a classic Spark 3.5 session: its version and conf (no JVM: isSupported cannot
    be asked, so the static table decides)."""

    def __init__(self, version, master, **conf):
        self.version = version
        self.conf = _Conf({"spark.master": master, **conf})


_Connect35 = type("SparkSession", (_Classic35,), {"__module__": "pyspark.sql.connect.session"})


def test_plan_on_spark_3_5():
    # 3.5.0 on YARN: refused, naming the version, the master and the conf to set instead
    with pytest.raises(ClusterError) as info:
        plan(_Classic35("3.5.0", "yarn"), num_workers=2, gpus_per_worker=2)
    text = str(info.value)
    assert "gpus_per_worker=2" in text and "Spark 3.5.0" in text and "yarn" in text
    assert "spark.task.resource.gpu.amount=2" in text and "spark.executor.resource.gpu.amount" in text
    # 3.5.1 on YARN and 3.5.0 standalone: a profile, attached through the RDD API
    for version, master in (("3.5.1", "yarn"), ("3.5.0", "spark://h:7077")):
        placement = plan(_Classic35(version, master), num_workers=2, gpus_per_worker=2)
        assert placement.worker_profile and placement.build == "rdd" and placement.workers == Ask(1, 2.0)
    # Spark Connect on 3.5: no RDDs and no profile= on mapInArrow
    with pytest.raises(ClusterError, match=r"Spark Connect session on Spark 3.5.2 \(spark://h:7077\) cannot"):
        plan(_Connect35("3.5.2", "spark://h:7077"), num_workers=2, cpus_per_worker=2)
    # what equals the conf needs no profile, so it runs anywhere, local[N] included
    same = plan(_Classic35("3.5.0", "local[2]", **{"spark.task.cpus": "2"}), num_workers=2, cpus_per_worker=2)
    assert not same.worker_profile
    # GPU workers on a conf that gives every task a GPU: the ps tasks get a CPU-only profile of their own
    # job, or, where Spark cannot run one, share the workers' stage (with a warning naming the driver)
    gpu_conf = {"spark.task.resource.gpu.amount": "1"}
    ps = plan(_Classic35("3.5.0", "spark://h:7077", **gpu_conf), num_workers=2, num_ps=1)
    assert ps.ps == Ask(1, 0.0) and ps.ps_profile and not ps.worker_profile
    shared = plan(_Classic35("3.5.0", "yarn", **gpu_conf), num_workers=2, num_ps=1)
    assert shared.ps is None and not shared.ps_on_driver
    assert plan(_Classic35("3.5.0", "yarn", **gpu_conf), num_workers=2, num_ps=1, ps_placement="driver").ps_on_driver
    # per-run GPUs on a conf without: the ps job needs no profile (the default gives no GPU)
    own = plan(_Classic35("3.5.0", "spark://h:7077"), num_workers=2, num_ps=1, gpus_per_worker=1)
    assert own.ps == Ask(1, 0.0) and not own.ps_profile and own.worker_profile


def test_the_arithmetic_of_what_fits():
    executors = [(2, 2.0), (2, 2.0)]
    assert room(executors, Ask(1, 2.0), 3) == (2, 0)
    assert room(executors, Ask(1, 1.0), 2, Ask(1, 0.0)) == (4, 2)  # two workers leave 1 + 1 (or 2 + 0) cores
    assert room(executors, Ask(2, 1.0), 2, Ask(1, 0.0)) == (2, 0)
    error = fit_error("spark://h:7077", executors, Placement(Ask(1, 2.0), worker_profile=True), 3, 0,
                      "gpus_per_worker=2")
    text = str(error)
    assert "3 chief/worker tasks of 2 GPUs and 1 CPU each (gpus_per_worker=2): 3 × 2 = 6 GPUs" in text
    assert "2 executors × (2 GPUs, 2 cores) = 4 GPUs, room for 2 such tasks" in text
    assert fit_error("m", executors, Placement(Ask(1, 2.0), worker_profile=True), 2, 0, "k") is None
    ps = fit_error("m", executors, Placement(Ask(2, 2.0), True, ps=Ask(1, 0.0)), 2, 1, "k")
    assert "needs 1 ps task of no GPU and 1 CPU each beside its 2 workers" in str(ps)
    assert "room for 0 ps tasks" in str(ps) and "ps_placement='driver'" in str(ps)


# ---------------------------------------------------------------- local[N]: never a profile


def one(ctx):
    return 1


def test_local_master_refuses_a_per_run_gpu_request_naming_the_fix(spark):
    with pytest.raises(ClusterError) as info:
        tfnb.run(one, num_workers=2, spark=spark, gpus_per_worker=1, display=False)
    text = str(info.value)
    print(text)
    assert "gpus_per_worker=1" in text and "local master (local[2])" in text
    assert "spark.task.resource.gpu.amount=1" in text and "spark.driver.resource.gpu.amount" in text
    # asking what the conf gives anyway needs no profile: it runs
    assert tfnb.run(one, num_workers=2, spark=spark, cpus_per_worker=1, preimport=(), warm=False,
                    display=False) == 1


# ---------------------------------------------------------------- a standalone cluster with (stub) GPUs


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory):
    from test_masters import standalone

    folder = tmp_path_factory.mktemp("gpu-cluster")
    script = folder / "discover_gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1", "2", "3"]}\'\n')
    script.chmod(0o755)
    properties = {"spark.worker.resource.gpu.amount": "4", "spark.worker.resource.gpu.discoveryScript": str(script)}
    with standalone(folder, workers=1, cores=4, memory="2g", properties=properties) as url:
        yield url


# two executors of (2 cores, 2 GPUs) on the one worker
APP = {"spark.driver.host": "127.0.0.1", "spark.executor.cores": "2", "spark.cores.max": "4",
       "spark.executor.memory": "512m", "spark.executor.resource.gpu.amount": "2"}
# the conf the issue starts from: every task of the cluster takes a GPU
GPU_TASKS = {**APP, "spark.task.resource.gpu.amount": "1"}


@pytest.fixture
def gpu_session(gpu_cluster):
    from conftest import spark_session

    return spark_session(gpu_cluster, **GPU_TASKS)


def placement(ctx, out_dir):
    from test_masters import executor_jvm_pid

    info = {"job_name": ctx.job_name, "gpus": list(ctx.gpus), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "jvm": executor_jvm_pid()}
    Path(out_dir, f"{ctx.task_index}.json").write_text(json.dumps(info))
    return info


def _both(tmp_path, name, **options):
    out = tmp_path / name
    out.mkdir()
    tfnb.run(placement, num_workers=2, args=(str(out),), spark=options.pop("spark"), preimport=(), warm=False,
             display=False, timeout=300, **options)
    return [json.loads((out / f"{i}.json").read_text()) for i in range(2)]


def test_gpus_per_worker_change_between_runs_without_a_restart(gpu_session, tmp_path, no_orphans):
    conf = _both(tmp_path, "conf", spark=gpu_session)  # spark.task.resource.gpu.amount=1
    assert [len(t["gpus"]) for t in conf] == [1, 1] and all(t["cuda"] == t["gpus"][0] for t in conf)
    two = _both(tmp_path, "two", spark=gpu_session, gpus_per_worker=2, cpus_per_worker=2)
    assert [len(t["gpus"]) for t in two] == [2, 2]
    assert sorted(g for t in two for g in t["gpus"]) == ["0", "1", "2", "3"]  # as Spark dealt them
    assert all(t["cuda"] == ",".join(t["gpus"]) for t in two)
    assert two[0]["jvm"] != two[1]["jvm"]  # one executor's 2 GPUs and 2 cores each
    none = _both(tmp_path, "none", spark=gpu_session, gpus_per_worker=0)
    assert [t["gpus"] for t in none] == [[], []] and [t["cuda"] for t in none] == ["", ""]


@pytest.mark.timeout(300)  # were tfnb to wait TFNB_SLOT_WAIT for room, this fails the test
def test_an_impossible_request_is_refused_at_once_with_the_arithmetic(gpu_session, monkeypatch):
    monkeypatch.setenv("TFNB_SLOT_WAIT", "600")
    with pytest.raises(ClusterError) as info:
        tfnb.run(one, num_workers=3, spark=gpu_session, gpus_per_worker=2, display=False)
    text = str(info.value)
    print(text)
    assert "needs 3 chief/worker tasks of 2 GPUs and 1 CPU each (gpus_per_worker=2): 3 × 2 = 6 GPUs" in text
    assert f"({gpu_session.conf.get('spark.master')}) has 2 executors × (2 GPUs, 2 cores) = 4 GPUs" in text
    assert "room for 2 such tasks" in text and "spark.executor.resource.gpu.amount" in text
    with pytest.raises(ClusterError, match="room for 0 ps tasks; lower num_ps.*ps_placement='driver'") as ps:
        tfnb.run(one, num_workers=2, num_ps=1, spark=gpu_session, gpus_per_worker=2, cpus_per_worker=2,
                 display=False)
    print(ps.value)


class States:
    """A display that keeps each task's state events (they carry its GPUs and pids)."""

    def __init__(self, on_state=None):
        self.states: dict[tuple[str, int], list[dict]] = {}
        self.on_state = on_state

    def __call__(self, event):
        if event.kind == EventKind.STATE and event.job_name != "driver":
            self.states.setdefault((event.job_name, event.task_index), []).append(dict(event.data))
            if self.on_state is not None:
                self.on_state(event)

    def first(self, job, index, key):
        return next(s[key] for s in self.states[(job, index)] if key in s)


def variable_on_the_ps(ctx):
    """The chief of a ParameterServerStrategy cluster: one variable, placed on the ps, read back."""
    import tensorflow as tf

    strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
    with strategy.scope():
        v = tf.Variable(3.0)
    return {"device": v.device, "value": float(v.read_value()), "gpus": list(ctx.gpus),
            "cluster": {k: list(v) for k, v in ctx.cluster_spec.items()}}


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@pytest.mark.parametrize("where", ["executors", "driver"])
def test_parameter_servers_hold_no_gpu(gpu_session, where, no_orphans):
    parents = {}

    def on_state(event):  # while the ps serves: whose child is its process?
        if (event.job_name, event.data.get("state")) == ("ps", "serving"):
            parents["ps"] = _parent(states.first("ps", 0, "pid"))

    states = States(on_state)
    result = tfnb.run(variable_on_the_ps, num_workers=2, num_ps=1, spark=gpu_session, ps_placement=where,
                      display=states, timeout=300, max_attempts=1)
    assert "/job:ps" in result["device"] and result["value"] == 3.0  # the TF cluster spans both halves
    assert len(states.first("chief", 0, "gpus")) == 1 and len(states.first("worker", 1, "gpus")) == 1
    assert states.first("ps", 0, "gpus") == []  # spark.task.resource.gpu.amount=1, yet the ps holds none
    ps_pid = states.first("ps", 0, "pid")  # the ps task's own process
    if where == "driver":
        assert parents["ps"] == os.getpid()  # a process of this driver, not a Spark task
        assert result["cluster"]["ps"][0].startswith("127.0.0.1:")
        assert not Path(f"/proc/{ps_pid}").exists()  # and gone with the run
    else:
        assert parents["ps"] != os.getpid()


def wait_for_release(ctx, flag):
    end = time.monotonic() + 120
    while not os.path.exists(flag) and time.monotonic() < end:
        time.sleep(0.2)
    return ctx.job_name


@pytest.mark.parametrize("where", ["executors", "driver"])
@pytest.mark.parametrize("how", ["killed", "cancelled"])
def test_a_dead_ps_fails_the_run_and_cancel_stops_it(gpu_session, tmp_path, where, how, no_orphans):
    cancel = threading.Event()

    def on_state(event):
        if (event.job_name, event.data.get("state")) != ("ps", "serving"):
            return
        if how == "cancelled":
            cancel.set()
        else:  # the ps' TensorFlow server on an executor; the whole ps process on the driver
            pid = event.data["pid"] if where == "executors" else states.first("ps", 0, "pid")
            threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()

    states = States(on_state)
    expected = WorkerError if how == "killed" else RunCancelledError
    with pytest.raises(expected) as info:
        tfnb.run(wait_for_release, num_workers=2, num_ps=1, args=(str(tmp_path / "flag"),), spark=gpu_session,
                 ps_placement=where, display=states, hooks=LaunchHooks(cancel=cancel), max_attempts=1,
                 preimport=(), warm=False, timeout=300)
    print(f"{where}, {how}: {type(info.value).__name__}: {info.value}")
    if how == "killed":
        failure = info.value.failure
        assert (failure.job_name, failure.task_index, failure.exc_type) == ("ps", 0, "ProcessDied")
        assert "SIGKILL" in failure.message
        if where == "driver":
            assert "the ps process on the driver was killed by SIGKILL" in failure.message
    ps_pid = states.first("ps", 0, "pid")
    assert where == "executors" or not Path(f"/proc/{ps_pid}").exists()  # no driver ps process left


def hold_until(flag, started):
    """A Spark job of someone else's (another notebook on the cluster): each task holds its slot until ``flag``."""
    def hold(rows):
        Path(started, str(os.getpid())).touch()
        end = time.monotonic() + 300
        while not os.path.exists(flag) and time.monotonic() < end:
            time.sleep(0.2)
        return rows
    return hold


def test_a_job_whose_slots_other_jobs_took_ends_the_wait_at_the_exchange(gpu_session, tmp_path, monkeypatch,
                                                                          no_orphans):
    # Both of the run's jobs fit the executors, but another job holds two of their (core, GPU) slots: one of the
    # two barrier jobs starts, the other cannot, and the one that started waits TFNB_PS_JOB_WAIT, not for ever.
    monkeypatch.setenv("TFNB_PS_JOB_WAIT", "3")
    flag, started = tmp_path / "release", tmp_path / "started"
    started.mkdir()
    other = threading.Thread(target=gpu_session.sparkContext.parallelize(range(2), 2)
                             .mapPartitions(hold_until(str(flag), str(started))).collect)
    other.start()
    try:
        end = time.monotonic() + 120
        while len(list(started.iterdir())) < 2 and time.monotonic() < end:
            time.sleep(0.2)
        states = States()
        with pytest.raises(ClusterError) as info:
            tfnb.run(one, num_workers=2, num_ps=1, spark=gpu_session, preimport=(), warm=False, display=states,
                     max_attempts=1, timeout=120)
        # both of the run's jobs were cancelled, the one still waiting for slots too: the other job's alone is left
        assert len(gpu_session.sparkContext.statusTracker().getActiveJobsIds()) == 1, "the run's jobs live on"
    finally:
        flag.touch()
        other.join(60)
    text = str(info.value)
    print(text)
    jobs = "(the chief/worker tasks'|the ps tasks')"
    assert re.match(rf"{jobs} barrier job waited [3-9] s at the address exchange for {jobs} barrier job, which did "
                    r"not start \(\d of \d tasks never reported\): other Spark jobs took its task slots", text), text
    assert "ps_placement='driver'" in text and "TFNB_PS_JOB_WAIT=3" in text
    assert all(s["state"] in ("starting", "stopped") for run in states.states.values() for s in run if "state" in s)


# ---------------------------------------------------------------- a conf without GPUs per task


@pytest.fixture
def plain_session(gpu_cluster):
    from conftest import spark_session

    return spark_session(gpu_cluster, **APP)


def cuda_devices():
    return os.environ["CUDA_VISIBLE_DEVICES"]


def test_mirrored_runner_asks_for_its_gpus_per_run(plain_session, tmp_path, monkeypatch, no_orphans):
    from tfnb.compat import MirroredStrategyRunner

    monkeypatch.setenv("TFNB_PREIMPORT", "")
    monkeypatch.setenv("TFNB_WARM", "0")
    runner = MirroredStrategyRunner(num_slots=2, use_custom_strategy=True, spark=plain_session)
    assert runner.get_num_tasks() == 2  # spark.task.resource.gpu.amount unset: one GPU per task, per run
    assert runner.run(cuda_devices) in ("0", "1", "2", "3")
    per_run = _both(tmp_path, "per-run", spark=plain_session, gpus_per_worker=1)
    assert [len(t["gpus"]) for t in per_run] == [1, 1]


# ---------------------------------------------------------------- Spark Connect: mapInArrow(profile=)


def gpus(ctx):
    return {"gpus": list(ctx.gpus), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}


@pytest.mark.slow
def test_spark_connect_asks_per_run_through_map_in_arrow(tmp_path, no_orphans):
    """The Connect server runs local-cluster[2,2,1024], whose workers advertise two (stub) GPUs each."""
    from conftest import spark_connect

    script = tmp_path / "discover_gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    script.chmod(0o755)
    conf = {"spark.worker.resource.gpu.amount": "2", "spark.worker.resource.gpu.discoveryScript": str(script),
            "spark.executor.resource.gpu.amount": "2"}
    with spark_connect("local-cluster[2,2,1024]", **conf) as spark:
        options = dict(num_workers=2, spark=spark, display=False, preimport=(), warm=False, timeout=300)
        two = tfnb.run(gpus, gpus_per_worker=2, **options)
        one = tfnb.run(gpus, gpus_per_worker=1, **options)
        with pytest.raises(ClusterError) as refused:
            tfnb.run(gpus, **{**options, "num_workers": 3, "gpus_per_worker": 2})
    assert len(two["gpus"]) == 2 and two["cuda"] == ",".join(two["gpus"])
    assert len(one["gpus"]) == 1
    # the cluster's size from its master string: refused at once, with the arithmetic, without a SparkContext
    assert "3 × 2 = 6 GPUs" in str(refused.value)
    assert "2 executors × (2 GPUs, 2 cores) = 4 GPUs" in str(refused.value)


# ---------------------------------------------------------------- a real Spark 3.5: the RDD branch


@pytest.mark.long  # ./dev matrix: a Spark 3.5 virtualenv of its own
@pytest.mark.timeout(1200)
def test_spark_3_5_attaches_the_profile_through_the_rdd_api(tmp_path, no_orphans):
    """The Spark 3.5 branch for real: the simulated Databricks runtime's virtualenv (pyspark 3.5.0, built once
    by tests/test_runtime_sim.py) runs the driver, and a standalone cluster started from its Spark the tasks."""
    import subprocess

    from environments import jvm_options
    from test_masters import standalone
    from test_runtime_sim import _runtime_env

    python = _runtime_env() / "bin" / "python"
    (spark_home,) = _runtime_env().glob("lib/python3*/site-packages/pyspark")
    script = tmp_path / "discover_gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1", "2", "3"]}\'\n')
    script.chmod(0o755)
    properties = {"spark.worker.resource.gpu.amount": "4", "spark.worker.resource.gpu.discoveryScript": str(script)}
    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_DRIVER_PYTHON")}
    env.update(PYSPARK_PYTHON=str(python), PYTHONPATH=f"{root}{os.pathsep}{root / 'tests'}")
    # the tests' JVM options with the class archives of this Spark's jars, executors too (a conf folder on the
    # class path would make the JVMs ignore the archives)
    driver, executor = jvm_options("driver", spark_home), jvm_options("executor", spark_home)
    submit = shlex.join(["--conf", f"spark.executor.extraJavaOptions={executor}", "pyspark-shell"])
    env.update(SPARK_SUBMIT_OPTS=driver, SPARK_DAEMON_JAVA_OPTS=driver, PYSPARK_SUBMIT_ARGS=submit)
    with standalone(tmp_path, workers=1, cores=4, memory="2g", properties=properties, spark_home=str(spark_home),
                    env=env) as url:
        res = subprocess.run([python, str(root / "tests" / "scripts" / "resources_35.py"), url], env=env,
                             capture_output=True, text=True, timeout=900)
    line = next((l for l in res.stdout.splitlines() if l.startswith("RESULT ")), None)
    # the executors' own stderr says why a task was lost
    executors = "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}"
                          for p in sorted(tmp_path.glob("work/app-*/*/stderr")))
    assert line, f"the Spark 3.5 run failed:\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}\n{executors}"
    out = json.loads(line[len("RESULT "):])
    assert out["spark"] == "3.5.0" and "build='rdd'" in out["placement"]
    assert len(out["conf"]["gpus"]) == 1 and len(out["two"]["gpus"]) == 2
    assert out["two"]["cuda"] == ",".join(out["two"]["gpus"])
    assert out["ps_states"]["ps 0"] == [] and len(out["ps_states"]["worker 1"]) == 1  # a CPU-only ps job on 3.5
