"""The cached environments the suite runs things in, built once and reused: the two simulated Databricks
runtimes (tests/dbsim/runtimes.py), the MLflow tracking server's virtualenv, and the class archives of the
Spark JVMs the tests start (this environment's Spark and each runtime's).

``python tests/environments.py`` builds whichever are missing and says how long that took. ``./dev test``
runs it before the whole suite, so a first run's minutes of downloads and installs are reported apart from
the tests' own time; a test that finds one missing still builds it (under the same lock).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from components import cached_venv  # noqa: E402

MLFLOW_SERVER = ["mlflow==3.17.2"]  # its own venv: full mlflow pins a pyarrow older than the test venv's
MLFLOW_CACHE = Path(os.environ.get("TFNB_MLFLOW_SERVER_CACHE", Path.home() / ".cache" / "tfnb-mlflow-server"))


def mlflow_server_venv() -> Path:
    """The MLflow server's virtualenv (built if missing)."""
    return cached_venv(MLFLOW_CACHE, MLFLOW_SERVER)


# The JVMs tests start live for seconds and move little data: the client compiler alone and the serial
# collector start a local-cluster session and run three small jobs in 14 s instead of 23 s on 2 cores.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
JVM_CACHE = Path(os.environ.get("TFNB_JVM_ARCHIVE_CACHE", Path.home() / ".cache" / "tfnb-test-jvm"))
# A JVM given an archive that does not match its class path (another Spark's jars: the simulated runtimes,
# the Spark Connect server) loads its classes as usual; these keep it from saying so on stdout.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_ARCHIVE_JOB = """
import sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local-cluster[1,1,1024]").config("spark.ui.enabled", "false")
         .config("spark.executor.extraJavaOptions", sys.argv[1]).getOrCreate())
df = spark.range(100000).selectExpr("id", "id % 10 AS k")
df.groupBy("k").count().collect()
df.repartition(1).mapInArrow(lambda batches: batches, df.schema, barrier=True).count()
df.toPandas()
spark.stop()
"""


def _pyspark_of(python: str) -> Path:
    """The pyspark folder (its SPARK_HOME) of ``python``'s environment."""
    if python == sys.executable:
        import importlib.util

        return Path(importlib.util.find_spec("pyspark").submodule_search_locations[0])
    (home,) = (Path(python).parent.parent).glob("lib/python3*/site-packages/pyspark")
    return home


def _jvm_archive_dir(spark_home: Path) -> Path:
    """Where the archives for these jars and this Java go (a JVM checks the jars did not change)."""
    jars = sorted((p.name, p.stat().st_size) for p in (spark_home / "jars").glob("*.jar"))
    java = os.path.realpath(shutil.which("java", path=os.path.join(os.environ.get("JAVA_HOME", ""), "bin"))
                            or shutil.which("java") or "java")
    key = json.dumps([jars, str(spark_home), java, JVM_OPTIONS])
    return JVM_CACHE / hashlib.sha256(key.encode()).hexdigest()[:16]


def jvm_options(role: str, spark_home: Path | None = None) -> str:
    """JVM_OPTIONS, with the class archive of ``role`` (``driver``, ``executor``) for the Spark at ``spark_home``
    (this environment's pyspark by default) once it is built: a local-cluster session starts with about a third
    less CPU (the classes come mapped, already verified). The jars may be reached through symbolic links."""
    archive = _jvm_archive_dir(spark_home or _pyspark_of(sys.executable)) / f"{role}.jsa"
    return f"{JVM_OPTIONS} -XX:SharedArchiveFile={archive} {_QUIET}" if archive.exists() else JVM_OPTIONS


def jvm_archives(python: str = sys.executable) -> Path:
    """Dump the classes a local-cluster session's driver and executor load, for the Spark of ``python``'s
    environment (built if missing)."""
    done = _jvm_archive_dir(_pyspark_of(python))
    if (done / "executor.jsa").exists():
        return done
    tmp = done.with_name(f"{done.name}.{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYTHONPATH")}
    env.update(SPARK_SUBMIT_OPTS=f"{JVM_OPTIONS} -XX:ArchiveClassesAtExit={tmp}/driver.jsa",
               PYSPARK_PYTHON=python)
    executor = f"{JVM_OPTIONS} -XX:ArchiveClassesAtExit={tmp}/executor.jsa"
    try:
        res = subprocess.run([python, "-c", _ARCHIVE_JOB, executor], env=env, capture_output=True, text=True,
                             timeout=600)
        if res.returncode != 0:
            raise RuntimeError(f"the archive job failed: {res.stderr[-2000:]}")
        deadline = time.monotonic() + 120  # the JVMs write their archives as they exit, after the job's Python
        while _dumping(str(tmp)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not {"driver.jsa", "executor.jsa"} <= {p.name for p in tmp.iterdir()} or _dumping(str(tmp)):
            raise RuntimeError(f"the JVMs wrote no archives in {tmp}")
        os.rename(tmp, done)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone once renamed; or another build finished first
    return done


def _dumping(folder: str) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if folder.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            pass
    return False


def main() -> int:
    from dbsim.runtimes import RUNTIME_A, RUNTIME_B

    def runtime(r):  # its virtualenv, then the class archives of its Spark's JVMs
        return jvm_archives(str(r.python_path()))

    builds = {"Databricks runtime A": lambda: runtime(RUNTIME_A), "Databricks runtime B": lambda: runtime(RUNTIME_B),
              "MLflow server": mlflow_server_venv, "Spark JVM class archives": jvm_archives}
    start = time.monotonic()
    with ThreadPoolExecutor(len(builds)) as pool:  # downloads and unpacking: side by side
        futures = {name: pool.submit(build) for name, build in builds.items()}
    for name, future in futures.items():
        if error := future.exception():
            print(f"tests/environments.py: {name} could not be built (the tests that need it will say so): {error}",
                  file=sys.stderr)
    print(f"cached environments ready in {time.monotonic() - start:.0f} s (not counted in the tests' time)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
