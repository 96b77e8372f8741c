"""tfnb.run on every kind of Spark master: local-cluster (separate executor JVMs) with GPU resources from a
stub discovery script, Spark Connect, and a real standalone master + workers started from the pip package."""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

import tfnb
from tfnb.errors import ClusterError


@pytest.fixture(autouse=True)
def no_tensorflow_preimport(monkeypatch):
    # These train_fns never import TensorFlow; skip the default early import to keep the suite fast.
    monkeypatch.setenv("TFNB_PREIMPORT", "")

def executor_jvm_pid() -> int:
    """The pid of the executor JVM this process descends from."""
    pid = os.getpid()
    while pid > 1:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"java" in cmd.split(b"\0")[0]:
            return pid
        status = Path(f"/proc/{pid}/status").read_text()
        pid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
    return -1


def report_placement(ctx, out_dir):
    info = {"job_name": ctx.job_name, "jvm": executor_jvm_pid(), "gpus": list(ctx.gpus),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}
    Path(out_dir, f"{ctx.task_index}.json").write_text(json.dumps(info))
    return info


def test_local_cluster_separate_executors_with_stub_gpus(tmp_path, no_orphans):
    from conftest import gpu_local_cluster

    session = gpu_local_cluster(tmp_path, 1)
    chief = tfnb.run(report_placement, num_workers=2, args=(str(tmp_path),), spark=session, display=False,
                     timeout=300)
    worker = json.loads((tmp_path / "1.json").read_text())
    assert chief["jvm"] != worker["jvm"] and -1 not in (chief["jvm"], worker["jvm"])  # two executors
    assert chief["gpus"] == worker["gpus"] == ["0"] and chief["cuda"] == worker["cuda"] == "0"
    hidden = tfnb.run(report_placement, num_workers=2, args=(str(tmp_path),), spark=session, display=False,
                      use_gpu=False, timeout=300)
    assert hidden["gpus"] == [] and hidden["cuda"] == ""
    with pytest.raises(ClusterError, match="needs 3 task slots"):
        tfnb.run(report_placement, num_workers=3, args=(str(tmp_path),), spark=session, display=False)


def test_cpu_tasks_see_no_gpu(spark, tmp_path):
    chief = tfnb.run(report_placement, num_workers=2, args=(str(tmp_path),), spark=spark, display=False)
    assert chief["gpus"] == [] and chief["cuda"] == ""


def describe(ctx):
    return {"job_name": ctx.job_name, "cluster": dict(ctx.cluster_spec), "pid": os.getpid()}


def fail(ctx):
    if ctx.task_index == 1:
        raise KeyError("missing-feature")
    time.sleep(600)


def report_feed(ctx):
    return {"rows": list(ctx.feed.rows_per_worker), "steps": ctx.steps_per_epoch(100),
            "lengths": ctx.feed.state()["lengths"]}


def test_spark_connect_session(no_orphans):
    """tfnb.run on a Spark Connect session (no SparkContext, no RDD API): runs again, a worker's error, a timeout's
    cancel, and a fed DataFrame (plans only)."""
    from conftest import spark_connect
    from pyspark.sql import functions as F

    from tfnb.errors import RunTimeoutError, WorkerError

    with spark_connect() as spark:
        first = tfnb.run(describe, num_workers=2, spark=spark, display=False)
        second = tfnb.run(describe, num_workers=2, spark=spark, display=False)
        with pytest.raises(WorkerError) as error:
            tfnb.run(fail, num_workers=2, spark=spark, display=False, timeout=120)
        with pytest.raises(RunTimeoutError):
            tfnb.run(lambda ctx: time.sleep(600), num_workers=2, spark=spark, display=False, timeout=5)
        after_cancel = tfnb.run(describe, num_workers=2, spark=spark, display=False)
        df = spark.range(0, 1000, 1, 1).select(
            (F.col("id") / 1000.0).alias("x"), F.array(F.col("id").cast("float"), F.lit(1.0)).alias("v"))
        feed = tfnb.run(report_feed, num_workers=2, data=df, spark=spark, display=False)
    assert first["job_name"] == second["job_name"] == "chief"
    assert first["pid"] != second["pid"]
    assert error.value.task_index == 1 and error.value.exc_type == "KeyError"
    assert "missing-feature" in str(error.value)
    assert after_cancel["job_name"] == "chief"
    assert feed == {"rows": [500, 500], "steps": 5, "lengths": {"v": 2}}


def _master_url(log: Path, deadline: float) -> str:
    """The URL of a standalone master started on port 0, read from its log."""
    while time.monotonic() < deadline:
        found = re.search(r"Starting Spark master at (spark://\S+)", log.read_text(errors="replace"))
        if found:
            return found.group(1)
        time.sleep(0.2)
    raise TimeoutError(f"the standalone master did not start; see {log}")


def _wait_for_workers(log: Path, count: int, deadline: float) -> None:
    """Wait until ``count`` workers registered with the master whose log is ``log``."""
    while time.monotonic() < deadline:
        if log.read_text(errors="replace").count("Master: Registering worker ") >= count:
            return
        time.sleep(0.5)
    raise TimeoutError(f"{count} standalone workers did not register; see {log}")


@contextlib.contextmanager
def standalone(folder: Path, workers: int = 2, *, cores: int = 1, memory: str = "1g",
               properties: dict | None = None, spark_home: str | None = None, env: dict | None = None):
    """A real standalone master and ``workers`` workers of ``cores`` cores each, run from the pip pyspark
    package's spark-class (or ``spark_home``'s); ``properties`` go to each worker's conf (e.g. the GPUs it
    advertises: spark.worker.resource.gpu.amount and .discoveryScript); ``env`` is the daemons' environment
    (default: this process'). Yields the master URL and stops every daemon (by pid) afterwards."""
    import pyspark

    spark_home = spark_home or os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    env = dict(env or os.environ, SPARK_HOME=spark_home, SPARK_LOG_DIR=str(folder / "logs"),
               SPARK_WORKER_DIR=str(folder / "work"))
    extra = []
    if properties:
        (folder / "worker.conf").write_text("".join(f"{k} {v}\n" for k, v in properties.items()))
        extra = ["--properties-file", str(folder / "worker.conf")]
    procs = []
    logs = []

    def start(args, name):
        log = open(folder / f"{name}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen([spark_class, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))

    try:
        start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
               "--webui-port", "0"], "master")
        url = _master_url(folder / "master.log", time.monotonic() + 60)
        for i in range(workers):
            start(["org.apache.spark.deploy.worker.Worker", "--cores", str(cores), "--memory", memory, "--host",
                   "127.0.0.1", "--webui-port", "0", *extra, url], f"worker{i}")
        _wait_for_workers(folder / "master.log", workers, time.monotonic() + 120)
        yield url
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, 15)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
        for log in logs:
            log.close()


# A session on the standalone master: one single-core executor per worker, as on a real cluster.
STANDALONE_CONF = {"spark.driver.host": "127.0.0.1", "spark.executor.memory": "768m", "spark.cores.max": "2",
                   "spark.executor.cores": "1"}


@pytest.fixture
def standalone_cluster(tmp_path):
    with standalone(tmp_path) as url:
        yield url


def interface_addresses() -> list[tuple[str, str]]:
    """(address, interface) of every address this machine's interfaces hold, as the kernel lists them
    (/proc/net/fib_trie's LOCAL entries, /proc/net/if_inet6), not as tfnb finds them."""
    import ipaddress

    found, last = [], None
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/fib_trie").read_text().split("Local:")[0].splitlines():
            if "|--" in line:
                last = line.split("|--")[1].strip()
            elif "/32 host LOCAL" in line and last:
                found.append((last, ""))
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw, *_, name = line.split()
            found.append((str(ipaddress.IPv6Address(int(raw, 16))), name))
    return found


def test_every_address_of_this_machine_is_this_machine():
    # A one-machine cluster: executors may report any of these while the driver binds another.
    from tfnb.launcher.spark import _is_this_machine, _other_hosts

    mine = interface_addresses()
    assert mine, "the kernel lists no interface address"
    names = ["localhost", "127.0.0.1", "127.0.0.2", "::1", "[::1]", socket.gethostname(),
             *{info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)},
             *(f"{a}%{i}" if a.startswith("fe80:") else a for a, i in mine)]  # a link-local needs its interface
    assert [n for n in names if not _is_this_machine(n)] == []
    others = [a for a in ("198.51.100.7", "203.0.113.9", "2001:db8::7") if a not in {a for a, _ in mine}]
    assert _other_hosts([*names, *others, "no-such-host.invalid"]) == sorted([*others, "no-such-host.invalid"])


@pytest.mark.slow
def test_standalone_master_and_workers(standalone_cluster, tmp_path, no_orphans):
    from conftest import spark_session

    # Workers bind loopback, the driver the machine's own address (when it has one): one machine all the
    # same, so a model_dir on its disk is seen by every task
    own = next((a for a, _ in interface_addresses() if "." in a and not a.startswith("127.")), "127.0.0.1")
    session = spark_session(standalone_cluster, **{**STANDALONE_CONF, "spark.driver.host": own})
    chief = tfnb.run(report_placement, num_workers=2, args=(str(tmp_path),), spark=session, display=False,
                     timeout=300, model_dir=str(tmp_path / "model"))
    worker = json.loads((tmp_path / "1.json").read_text())
    assert chief["job_name"] == "chief" and worker["job_name"] == "worker"
    assert chief["jvm"] != worker["jvm"]
    assert (tmp_path / "model").is_dir()
    session.stop()
