"""Refusals about the Spark cluster or session a run is given: task slots, GPUs, the session object, an
executor Python that cannot run the task. The shared local[2] session; the GPU-conf and stopped-session cases
have sessions of their own."""
from __future__ import annotations

import glob
import os
import platform
import subprocess
import sys
import sysconfig
from pathlib import Path

import tfnb
from components import need
from conftest import child_processes
from tfnb import ClusterError, ConfigError
from tfnb import _protocol as events

from refusals import Detail, Refusals, case, on_stopped_session, one, table


@case("cluster", "`num_workers=3` on 2 task slots", ClusterError, "needs 3 task slots", "has 2",
      Detail("spark.executor.instances"), says="lower num_workers or add executors/cores", spark=True)
def run_more_tasks_than_slots(env):
    tfnb.run(one, num_workers=3, spark=env.spark, display=False)


@case("cluster", "`gpus_per_worker=1` on local[2]", ClusterError, "gpus_per_worker=1",
      "local master (local[2])", "spark.task.resource.gpu.amount=1", Detail("spark.driver.resource.gpu.amount"),
      says="set spark.task.resource.gpu.amount when the session starts, or use a cluster master", spark=True)
def run_gpus_per_worker_on_local(env):
    tfnb.run(one, num_workers=2, spark=env.spark, gpus_per_worker=1, display=False)


@case("cluster", "`use_gpu=True` without spark.task.resource.gpu.amount", ClusterError, "use_gpu=True",
      "spark.task.resource.gpu.amount=1", "use_gpu=None",
      says="set spark.task.resource.gpu.amount (+ executor GPUs), or use_gpu=None", spark=True)
def run_gpu_without_gpu_conf(env):
    tfnb.run(one, num_workers=2, spark=env.spark, use_gpu=True, display=False)


@case("cluster", "`spark=spark.sparkContext`", ConfigError, "(SparkContext)", "not its SparkContext",
      says="pass the SparkSession", spark=True)
def run_spark_context(env):
    tfnb.run(one, num_workers=2, spark=env.spark.sparkContext, display=False)


@case("cluster", "`spark='local[2]'`", ConfigError, "spark='local[2]'", "leave spark= out",
      says="pass a SparkSession, or leave spark= out", spark=True)
def run_spark_str(env):
    tfnb.run(one, num_workers=2, spark="local[2]", display=False)


@case("cluster", "spark.task.resource.gpu.amount=1 on local[2] without driver GPUs", ClusterError,
      "spark.task.resource.gpu.amount=1", "spark.driver.resource.gpu.amount is unset",
      "unset spark.task.resource.gpu.amount", Detail("spark.driver.resource.gpu.discoveryScript"),
      says="unset the task GPU amount, or give the driver/executors GPUs",
      own_session={"spark.task.resource.gpu.amount": "1", "spark.executor.resource.gpu.amount": "1"})
def run_gpu_conf_without_gpus(env):
    session = env.spark
    yield
    tfnb.run(one, num_workers=2, spark=session, display=False)


@case("cluster", "stopped SparkSession", ConfigError, "stopped SparkSession", "SparkSession.builder.getOrCreate()",
      says="start a new session (or leave spark= out)", own_session={})
def run_stopped_session(env):
    yield from on_stopped_session(env, lambda session: tfnb.run(one, num_workers=2, spark=session, display=False))


# ---------------------------------------------------------------- executors whose Python cannot run the task
# Spark starts its Python workers with the Python the driver names (SparkContext.pythonExec, PYSPARK_PYTHON when
# the session started) and keeps them apart by it, so pointing the shared session at another Python is what
# PYSPARK_PYTHON does, without a session (a JVM) per case. The workers get Spark's own pyspark.zip and py4j on
# PYTHONPATH, before the tests' (this checkout, so tfnb): a venv without pip lacks pyarrow and cloudpickle only.

DRIVER = "%d.%d" % sys.version_info[:2]
OTHER = next((p for v in ("3.12", "3.11", "3.10", "3.13") if v != DRIVER for p in sorted(
    glob.glob(os.path.expanduser(f"~/.pyenv/versions/{v}.*/bin/python{v}")) + glob.glob(f"/usr/bin/python{v}"))),
    None)  # a Python of another minor version
OTHER_MINOR = OTHER.rpartition("python")[2] if OTHER else "3.x"


def executors_python(folder: Path, kind: str) -> str:
    """A Python for the executors, made in a fraction of a second: ``bare`` (a venv without pip), ``other-minor``
    (the same from another minor version), ``no-cloudpickle`` (links to all of this venv's packages but
    cloudpickle) or ``broken-pyspark`` (a bare venv whose .pth puts a stale pyspark folder first on sys.path)."""
    if kind == "other-minor":
        need(f"a Python other than {DRIVER}", OTHER is not None, "pyenv install 3.12")
    venv = folder / kind
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    subprocess.run([OTHER if kind == "other-minor" else sys.executable, "-m", "venv", "--without-pip", venv],
                   check=True, env=env)
    site = Path(glob.glob(str(venv / "lib" / "python3.*" / "site-packages"))[0])
    if kind == "no-cloudpickle":
        for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
            if not entry.name.startswith("cloudpickle"):
                (site / entry.name).symlink_to(entry)
    elif kind == "broken-pyspark":  # a half-removed install: its __init__ imports a module no longer there
        (venv / "stale" / "pyspark").mkdir(parents=True)
        (venv / "stale" / "pyspark" / "__init__.py").write_text("from pyspark.conf import SparkConf  # noqa: F401\n")
        (site / "stale.pth").write_text(f"import sys; sys.path.insert(0, {str(venv / 'stale')!r})\n")
    return str(venv / "bin" / "python")


def run_on_executors_python(env, kind):
    python = executors_python(env.tmp, kind)
    session = env.spark
    env.monkeypatch.setattr(session.sparkContext, "pythonExec", python)
    yield
    seen: list = []
    try:
        tfnb.run(one, num_workers=2, spark=session, display=seen.append, max_attempts=2)
    except ClusterError as e:
        text = str(e)
        assert not [ev for ev in seen if ev.kind == events.ATTEMPT], f"relaunched: {text}"
        first = text.splitlines()[0]
        assert len(first) <= 200 and f"executor {session.conf.get('spark.driver.host')}" in first, first
        assert python in text and "did not relaunch it (max_attempts=2)" in text, text
        assert not any(s in text for s in ("Py4J", "collectToPython", "spark -1", "at org.apache")), text
        assert not session.sparkContext.statusTracker().getActiveJobsIds() and not child_processes()
        raise


table("cluster", ClusterError, run_on_executors_python, [
    ("run_executors_without_pyarrow", {"kind": "bare"},
     "executors' Python without pyarrow (PYSPARK_PYTHON)",
     (f"Python {platform.python_version()} lacks pyarrow", "install it there", "PYSPARK_PYTHON",
      Detail("ModuleNotFoundError: No module named 'pyarrow'")),
     "install pyarrow into the executors' Python, or point PYSPARK_PYTHON at a Python with it"),
    ("run_executors_without_cloudpickle", {"kind": "no-cloudpickle"},
     "executors' Python without cloudpickle (PYSPARK_PYTHON)",
     (f"Python {platform.python_version()} lacks cloudpickle", "install it there", "PYSPARK_PYTHON",
      Detail("ModuleNotFoundError: No module named 'cloudpickle'")),
     "install cloudpickle into the executors' Python, or point PYSPARK_PYTHON at a Python with it"),
    ("run_executors_on_another_python", {"kind": "other-minor"},
     f"executors' Python of another minor version ({OTHER_MINOR} under a {DRIVER} driver)",
     (f"runs Python {OTHER_MINOR} but the driver {DRIVER}", f"spark.pyspark.python to a Python {DRIVER}",
      Detail("PYTHON_VERSION_MISMATCH"), Detail("cannot cross minor versions")),
     "point PYSPARK_PYTHON / spark.pyspark.python at a Python of the driver's minor version"),
    ("run_executors_with_broken_pyspark", {"kind": "broken-pyspark"},
     "executors' Python with a broken pyspark first on sys.path",
     ("has a broken pyspark (ModuleNotFoundError: No module named 'pyspark.conf')", Detail("/stale/pyspark"),
      "remove the pyspark that shadows Spark's own"),
     "remove the pyspark that shadows Spark's own, or reinstall the cluster's"),
], spark=True)


class TestRefusals(Refusals):
    """The cases above."""
