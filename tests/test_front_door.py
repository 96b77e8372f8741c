"""What a user sees when the run cannot start as asked: one clear error, on real Spark.

Executors where tfnb cannot start (not importable, another version, a train_fn process that cannot
import it) run in a local[2] session whose Python workers start through a wrapper that puts a
``sitecustomize.py`` on PYTHONPATH; its import hook breaks ``import tfnb`` as the file ``mode`` says.
A driver-local ``model_dir`` is refused on a real standalone cluster whose worker is, to the driver, another
host (a name only the Spark JVMs resolve).
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import tfnb
from conftest import spark_session
from s3server import rclone_s3  # noqa: F401
from tfnb import _protocol as events
from tfnb.errors import ClusterError, ConfigError, StorageError, WorkerError, summary


@pytest.fixture(autouse=True)
def no_tensorflow_preimport(monkeypatch):
    monkeypatch.setenv("TFNB_PREIMPORT", "")  # most train_fns here never import TensorFlow


def one(ctx, out=None):
    if out:
        Path(out, f"{ctx.job_name}-{ctx.task_index}").write_text("ran")
    return 1


# ---------------------------------------------------------------- executors where tfnb cannot start

HOOK = '''
import importlib.util, os, sys

MODE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mode")


class BreakTfnb:
    """missing: tfnb is not installed; old: tfnb says it is 0.0.9; child: only train_fn processes lack it."""

    def find_spec(self, name, path=None, target=None):
        if name != "tfnb":
            return None
        with open(MODE) as f:
            mode = f.read()
        if mode == "missing" or (mode == "child" and "TFNB_RUN_ID" in os.environ):
            raise ModuleNotFoundError("No module named 'tfnb'", name="tfnb")
        if mode != "old":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            module.__version__ = "0.0.9"
        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, BreakTfnb())
'''


@pytest.fixture(scope="module")
def hooked(tmp_path_factory):
    """(session, mode file): local[2] whose Python workers break ``import tfnb`` as the mode file says.

    Python workers are not reused, so every task reads the mode anew; the shared session comes back after.
    """
    folder = tmp_path_factory.mktemp("hooked")
    (folder / "sitecustomize.py").write_text(HOOK)
    mode = folder / "mode"
    mode.write_text("ok")
    python = folder / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{folder}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYSPARK_PYTHON", str(python))  # read once, when the SparkContext starts
        session = spark_session("local[2]", **{"spark.python.worker.reuse": "false"})
    yield session, mode
    spark_session("local[2]")


def _refused(session, **kwargs) -> tuple[str, list]:
    seen: list = []
    with pytest.raises(ClusterError) as info:
        tfnb.run(one, num_workers=2, spark=session, display=seen.append, warm=False, max_attempts=2, **kwargs)
    text = str(info.value)
    print(text)  # the message as the user reads it (pytest -s)
    assert info.value.__cause__ is None and "Py4J" not in text and "at org.apache" not in text
    assert not [e for e in seen if e.kind == events.ATTEMPT], "an error that repeats was relaunched"
    assert "so tfnb did not relaunch it (max_attempts=2)" in text
    assert "%pip install it in the notebook" in text and "PYSPARK_PYTHON" in text
    return text


def test_an_executor_without_tfnb_names_host_python_and_fix(hooked, no_orphans):
    session, mode = hooked
    mode.write_text("missing")
    text = _refused(session)
    first = text.splitlines()[0]
    assert re.match(r"the Spark task on executor \S+ \(Python 3\.\d+\.\d+ at /\S+\) cannot import tfnb: "
                    r"ModuleNotFoundError: No module named 'tfnb'; ", first), first
    assert "Last lines of the executor's traceback:" in text


def test_an_executor_with_another_tfnb_version_is_refused_before_train_fn(hooked, tmp_path, no_orphans):
    session, mode = hooked
    mode.write_text("old")
    text = _refused(session, args=(str(tmp_path),))
    assert text.startswith(f"tfnb 0.0.9 on executor ") and f"but tfnb {tfnb.__version__} on this driver" in text
    assert "refused before any train_fn started" in text and f"Install tfnb {tfnb.__version__} on the executors" in text
    assert not list(tmp_path.iterdir()), "train_fn ran"


def test_a_train_fn_process_that_cannot_import_tfnb_keeps_its_cause(hooked, no_orphans):
    session, mode = hooked
    mode.write_text("child")
    text = _refused(session)
    assert re.match(r"the train_fn process on executor \S+ \(Python .*\) cannot import tfnb: ModuleNotFoundError: "
                    r"No module named 'tfnb'; ", text), text


# ---------------------------------------------------------------- directories the executors cannot see


def test_which_paths_every_host_sees(tmp_path):
    from tfnb.launcher.spark import _mount_type, is_shared_path

    for shared in ("s3://bucket/run", "gs://b/x", "dbfs:/runs/1", "/dbfs/runs/1", "/Volumes/main/default/v/run",
                   "/Workspace/Users/me/run", "/dbfs"):
        assert is_shared_path(shared), shared
    for local in ("/tmp/run", "file:///tmp/run", "relative/run", "/dbfsx/run", "/local_disk0/run"):
        assert not is_shared_path(local), local
    assert is_shared_path("/mnt/team/run", ["/mnt/team/"]) and not is_shared_path("/mnt/teams", ["/mnt/team"])
    table = tmp_path / "mounts"
    table.write_text("/dev/vda / ext4 rw 0 0\nsrv:/export /mnt/nfs nfs4 rw 0 0\n"
                     "me@h:/x /mnt/my\\040disk fuse.sshfs rw 0 0\ntmpfs /mnt/nfs/scratch tmpfs rw 0 0\n")
    kinds = {p: _mount_type(p, str(table)) for p in ("/mnt/nfs/run", "/mnt/my disk/run", "/mnt/nfs/scratch/x", "/x")}
    assert kinds == {"/mnt/nfs/run": "nfs4", "/mnt/my disk/run": "fuse.sshfs", "/mnt/nfs/scratch/x": "tmpfs",
                     "/x": "ext4"}


def _spark_daemon(*args: str) -> tuple[subprocess.Popen, str]:
    """A standalone master or worker from the pip pyspark; (process, the line that says it is up)."""
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    ready = re.compile(r"Starting Spark master at (spark://\S+)|Successfully registered with master")
    proc = subprocess.Popen([os.path.join(home, "bin", "spark-class"), *args], env=dict(os.environ, SPARK_HOME=home),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = ready.search(line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep its log flowing
            return proc, m.group(1) or ""
    raise RuntimeError(f"{args[0]} exited with code {proc.wait()}")


@pytest.mark.slow  # 20-40 s: a master, a worker and an application start
def test_a_driver_local_model_dir_is_refused_on_a_cluster_of_other_hosts(tmp_path, monkeypatch, no_orphans):
    from environments import jvm_options

    # Another host, to the driver: a name only the worker's and executors' JVMs resolve (to 127.0.0.2), through a
    # hosts file of their own. (Any address of this machine, loopback included, is this machine.)
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text(f"127.0.0.1 localhost {socket.gethostname()}\n127.0.0.2 other-host.test\n")
    jvm = f" -Djdk.net.hosts.file={hosts_file}"
    monkeypatch.setenv("SPARK_DAEMON_JAVA_OPTS", os.environ.get("SPARK_DAEMON_JAVA_OPTS", "") + jvm)
    daemons = []
    try:
        master, url = _spark_daemon("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                    "--port", "0", "--webui-port", "0")
        daemons.append(master)
        worker, _ = _spark_daemon("org.apache.spark.deploy.worker.Worker", "--cores", "2", "--memory", "2g",
                                  "--host", "other-host.test", "--webui-port", "0", url)
        daemons.append(worker)
        session = spark_session(url, **{"spark.executor.memory": "1g",
                                        "spark.executor.extraJavaOptions": jvm_options("executor") + jvm})
        with pytest.raises(ConfigError) as info:
            tfnb.run(one, num_workers=2, spark=session, display=False, model_dir=str(tmp_path / "model"))
        text = str(info.value)
        print(text)
        hosts = {e.host() for e in session.sparkContext._jsc.sc().statusTracker().getExecutorInfos()}
        assert "other-host.test" in hosts
        assert text.startswith(f"model_dir={str(tmp_path / 'model')!r} is on the driver's own disk, but executors "
                               "run on other hosts (other-host.test)")
        assert "'/Volumes/<catalog>/<schema>/<volume>/...'" in text and "TFNB_SHARED_PATHS" in text
        # declared shared: the run goes ahead, on the one executor there is, the worker's
        monkeypatch.setenv("TFNB_SHARED_PATHS", str(tmp_path))
        assert tfnb.run(one, num_workers=2, spark=session, display=False, warm=False,
                        model_dir=str(tmp_path / "model"), log_dir="s3://bucket/logs") == 1
        spark_session("local[2]")  # the standalone application ends: its executors exit
    finally:
        for proc in reversed(daemons):  # leakcheck (conftest) fails the test if anything below them outlives it
            proc.terminate()
            proc.wait(60)


# ---------------------------------------------------------------- bad inputs that used to pass in silence


@pytest.mark.parametrize("key, knob", [
    ("TF_CONFIG", "read ctx.tf_config instead"),
    ("CUDA_VISIBLE_DEVICES", "pass use_gpu= instead"),
    ("TF_USE_LEGACY_KERAS", "pass legacy_keras=False instead"),
    ("PYTHONUNBUFFERED", "leave it out"),
    ("TFNB_RUN_ID", "read ctx.run_id instead"),
    ("TFNB_PREIMPORT", "pass preimport= instead"),
    ("TFNB_EVENT_FD", "tfnb's own plumbing"),
])
def test_env_that_sets_what_tfnb_sets_is_refused(key, knob):
    with pytest.raises(ConfigError) as info:
        tfnb.run(one, num_workers=2, env={"SEED": "1", key: "s3cr3t"}, display=False)
    text = str(info.value)
    assert text.startswith(f"env= sets {key}, which tfnb sets in every train_fn process: ") and knob in text
    assert "s3cr3t" not in text  # env values are often credentials


def test_tf_use_legacy_keras_is_the_users_with_legacy_keras_off():
    from tfnb.launcher.options import _check_env

    _check_env({"TF_USE_LEGACY_KERAS": "0"}, legacy_keras=False)


def nested_run(ctx):
    tfnb.run(one, num_workers=1, display=False)


def test_run_inside_train_fn_is_refused(spark, no_orphans):
    with pytest.raises(WorkerError) as info:
        tfnb.run(nested_run, num_workers=2, spark=spark, display=False, warm=False)
    assert info.value.exc_type == "tfnb.errors.ConfigError"
    assert re.search(r": tfnb\.run was called inside train_fn \(a train_fn process of run \w+\), but it runs on the "
                     r"Spark driver only; train_fn already runs on every worker", str(info.value))
    assert len(info.value.attempts) == 1


def run_in_task(_):
    try:
        tfnb.run(one, num_workers=1, display=False)
    except ConfigError as e:
        return str(e)


def test_run_inside_a_spark_task_is_refused(spark):
    [text] = spark.sparkContext.parallelize([0], 1).map(run_in_task).collect()
    assert re.fullmatch(r"tfnb\.run was called inside a Spark task \(stage \d+, partition 0\) on an executor, but "
                        r"it runs on the Spark driver only; call it from the notebook, not from a UDF .*", text), text


def test_a_wrapped_storage_error_says_its_cause_once_and_ends_with_the_fix(rclone_s3, tmp_path):
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.out.tfevents.1.host").write_bytes(b"x" * 100)
    rclone_s3.client().create_bucket(Bucket="frontdoor")
    sync = tfnb.EventSync(str(tmp_path / "tb"), "s3://frontdoor/logs", interval=3600, storage_options={
        "key": rclone_s3.access_key, "secret": "wrong" * 8, "endpoint_url": rclone_s3.endpoint_url,
        "region": "us-east-1"})
    with pytest.raises(StorageError) as info:
        sync.flush()
    text = str(info.value)
    print(text)
    assert len(text) - len(str(tmp_path)) < 250 and "\n" not in text and text.endswith("or the profile"), text
    assert text.startswith(f"event sync {tmp_path / 'tb'} -> s3://frontdoor/logs failed: the S3 server at ")
    assert "(SignatureDoesNotMatch);" in text and "signature you provided" not in text  # the server's sentence...
    assert isinstance(info.value.__cause__, StorageError)
    assert "signature you provided" in str(info.value.__cause__)  # ...is in the chained cause, once


def test_summary_of_a_foreign_error_is_one_short_line():
    assert summary(ValueError("x" * 500 + "\nmore")) == "ValueError: " + "x" * 227 + "…"
