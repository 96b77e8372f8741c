"""tfnb installed into a simulated Databricks Runtime 15.4 LTS ML (tests/dbsim/runtimes.py, RUNTIME_A): a
separate virtualenv holding what that runtime preinstalls (pyspark 3.5.0, TensorFlow 2.16.1 + tf-keras 2.16.0,
the floor tfnb states, and the runtime's pyarrow, pandas, boto3, fsspec, ipywidgets...). The built tfnb wheel
goes in with a plain `pip install`; the suite checks that no preinstalled package changed version, and
`./dev matrix` (marker ``long``) that a 2-worker MultiWorkerMirroredStrategy `tfnb.run` trains Keras 3.3.3 there
exactly as one process, through a killed worker, on that Spark 3.5. The runtime virtualenv is built once
(a minute or two: TensorFlow and pyspark are large downloads) and cached under
~/.cache/tfnb-runtime-sim/<hash of its requirements>; each run installs into a virtualenv of its own over it,
so the cache stays as built. tests/test_dbsim.py runs notebooks on the same runtime through the Databricks simulator."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dbsim.runtimes import RUNTIME_A
from environments import jvm_options

ROOT = Path(__file__).resolve().parent.parent

HEAVY = ("tensorflow", "tf_keras", "keras", "tensorboard", "pyspark", "py4j", "ipywidgets", "IPython", "boto3",
         "botocore", "pandas", "pyarrow", "numpy", "fsspec", "cloudpickle", "tqdm")


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def _clean_env() -> dict:
    # the test process puts this checkout on PYTHONPATH (for Spark's workers): the runtime must not see it
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}


def _packages(python: Path) -> dict[str, str]:
    out = _run([python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"], env=_clean_env()).stdout
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(out)}


def _runtime_env() -> Path:
    """The cached virtualenv of Runtime 15.4 LTS ML as the simulator has it (RUNTIME_A.requirements: what the
    runtime has before tfnb arrives), built (once, under a lock) if missing."""
    try:
        return RUNTIME_A.venv()
    except RuntimeError as e:
        raise AssertionError(str(e)) from e


@pytest.fixture
def runtime(tmp_path):
    """A virtualenv over the cached runtime's, as Databricks makes one for a notebook's libraries: it sees the
    runtime's packages, and pip installs into it, never into the cache."""
    base = _runtime_env()
    env = tmp_path / "env"
    _run([base / "bin" / "python", "-m", "venv", "--without-pip", env], env=_clean_env())
    (site,) = env.glob("lib/python3*/site-packages")
    (base_site,) = base.glob("lib/python3*/site-packages")
    (site / "_runtime.pth").write_text(f"import site; site.addsitedir({str(base_site)!r})\n")
    return env / "bin" / "python"


def _wheel(out: Path) -> Path:
    # Built from a copy of the sources so the worktree gets no build/ or egg-info; standard PEP 517 build.
    src = out / "src"
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "tfnb", src / "tfnb", ignore=shutil.ignore_patterns("__pycache__"))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check", "-w", out, src])
    (wheel,) = out.glob("tfnb-*.whl")
    return wheel


TRAIN = textwrap.dedent("""
    import json, os, sys, tempfile, time
    import pyspark
    from pyspark.sql import SparkSession
    import tfnb
    import keras3_train  # tests/keras3_train.py (on PYTHONPATH, tfnb not): Keras 3's floor, 3.3.3

    spark = (SparkSession.builder.master("local[2]").appName("runtime-sim")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    model_dir, ends = tempfile.mkdtemp(), []
    try:
        # through a killed worker (relaunch, BackupAndRestore), then fed through ctx.dataset
        attempt = tfnb.run(keras3_train.train_fn, num_workers=2, args=(2, 0), spark=spark, model_dir=model_dir,
                           log_dir=os.path.join(model_dir, "logs"), max_attempts=2, timeout=600,
                           display=lambda e: ends.append(e.data) if e.kind == "progress" and e.job_name == "chief"
                           and e.data.get("epoch_end") else None)
        x, y = keras3_train.data()
        df = spark.createDataFrame([(r.tolist(), int(l)) for r, l in zip(x[:256], y[:256])],
                                   "features array<float>, label long")
        tfnb.run(keras3_train.fed_fn, num_workers=2, data=df, spark=spark, model_dir=model_dir, display=False,
                 timeout=600)
        # Cancelling on Spark 3.5 (no job tags on classic sessions there): a run that outlives its timeout.
        try:
            tfnb.run(lambda ctx: __import__("time").sleep(600), num_workers=2, spark=spark, display=False, timeout=5)
            cancelled = "not cancelled"
        except tfnb.RunTimeoutError as e:
            cancelled = type(e).__name__
        deadline = time.monotonic() + 60
        while spark.sparkContext.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
            time.sleep(0.5)
        active = list(spark.sparkContext.statusTracker().getActiveJobsIds())
        pyspark_worker = spark.range(1).rdd.map(lambda _: __import__("pyspark").__version__).collect()[0]
    finally:
        spark.stop()
    print("RESULT " + json.dumps({"pyspark": pyspark.__version__, "tfnb": tfnb.__file__, "attempt": attempt,
                                  "pyspark_worker": pyspark_worker, "cancelled": cancelled, "active_jobs": active,
                                  "workers": keras3_train.reports(model_dir, 2), "epoch_ends": ends,
                                  "fed": keras3_train.reports(model_dir, 2, "fed"),
                                  "expected": keras3_train.one_process(2)}))
""")


def _install(runtime: Path, tmp_path: Path) -> None:
    """``pip install`` the built wheel into the runtime: nothing it preinstalled may change version."""
    before = _packages(runtime)
    assert before["pyspark"] == "3.5.0" and "tfnb" not in before

    wheel = _wheel(tmp_path)
    _run([runtime, "-m", "pip", "install", "--disable-pip-version-check", wheel], env=_clean_env())

    after = _packages(runtime)
    changed = {name: (v, after.get(name)) for name, v in before.items() if after.get(name) != v}
    assert not changed, f"pip install tfnb changed preinstalled packages (name: (before, after)): {changed}"
    assert after["tfnb"] == wheel.name.split("-")[1]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_wheel_installs_into_a_runtime_without_changing_it(runtime, tmp_path):
    _install(runtime, tmp_path)


# ./dev matrix: the Keras floor trained exactly is a version-matrix check (docs/compatibility.md trains 3.3.3 too);
# the suite's Run All on this runtime (tests/test_databricks.py) trains it through the notebooks
@pytest.mark.long
@pytest.mark.timeout(1800)
def test_keras3_floor_trains_as_one_process_on_spark_3_5_in_that_runtime(runtime, tmp_path, no_orphans):
    _install(runtime, tmp_path)
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = _clean_env()  # tfnb from the wheel
    (spark_home,) = _runtime_env().glob("lib/python3*/site-packages/pyspark")
    env.update(PYSPARK_PYTHON=str(runtime), PYSPARK_DRIVER_PYTHON=str(runtime), TF_CPP_MIN_LOG_LEVEL="2",
               SPARK_SUBMIT_OPTS=jvm_options("driver", spark_home),  # the class archive of this Spark's jars
               PYTHONPATH=str(ROOT / "tests"))  # keras3_train for the driver and the executors; tfnb is the wheel's
    res = _run([runtime, script], cwd=tmp_path, env=env, timeout=900)
    result = json.loads(res.stdout.split("RESULT ", 1)[1])
    assert result["pyspark"] == result["pyspark_worker"] == "3.5.0"
    assert "site-packages" in result["tfnb"] and str(ROOT) not in result["tfnb"]
    assert result["cancelled"] == "RunTimeoutError" and result["active_jobs"] == []
    # Keras 3.3.3 on TensorFlow 2.16.1 trains as one process through a killed worker, fed data too, with the
    # corrections of the defects only this Keras has (tests/test_keras3.py does the same on the newest Keras)
    from test_keras3 import check_like_one_process

    workers = result["workers"]
    assert result["attempt"] == 2 and workers[0]["keras"] == "3.3.3" and workers[0]["began"] == [1]
    found = {n for n, yes in workers[0]["probes_before"].items() if yes}
    assert {"gradient-all-reduce", "loss-scale", "metric-variables", "distributed-datasets"} <= found \
        == set(workers[0]["patches"])
    reports = tmp_path / "reports"
    reports.mkdir()
    for i, w in enumerate(workers):
        (reports / f"worker-{i}.json").write_text(json.dumps(w))
    check_like_one_process(reports, 2, result["expected"])
    reported = {r["epoch"]: r for r in result["epoch_ends"]}
    assert [reported[e]["loss"] for e in (1, 2)] == pytest.approx(result["expected"]["history"]["loss"], abs=1e-5)
    for w in result["fed"]:  # ctx.dataset(..., strategy=): a dataset distributed from a function
        assert w["weights"] == pytest.approx(result["fed"][0]["weights"], abs=1e-6)


def test_import_tfnb_loads_nothing_heavy():
    code = ("import sys, json, tfnb; from tfnb import run, Evaluator, EventSync, stage; "
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    out = _run([sys.executable, "-c", code], cwd=ROOT).stdout
    assert json.loads(out) == []


def test_old_spark_is_refused_naming_the_floor_and_the_fix(monkeypatch):
    import pyspark

    import tfnb
    from tfnb.errors import MissingDependencyError

    monkeypatch.setattr(pyspark, "__version__", "3.4.1")  # what an older runtime's pyspark reports
    with pytest.raises(MissingDependencyError) as err:
        tfnb.run(lambda ctx: None, num_workers=2, display=False)
    message = str(err.value)
    assert "Spark 3.4.1 is too old: tfnb needs Spark >= 3.5" in message
    assert "barrier DataFrame.mapInArrow" in message and "Runtime 14.3 LTS or later" in message


def test_old_tensorflow_is_refused_naming_the_floor_and_the_fix(monkeypatch):
    import tensorflow as tf

    from tfnb._deps import require
    from tfnb.errors import MissingDependencyError

    monkeypatch.setattr(tf, "__version__", "2.15.1")
    with pytest.raises(MissingDependencyError, match=r"TensorFlow 2.15.1 is too old: tfnb needs TensorFlow >= 2.16"
                                                    r".*Runtime ML 15.4 LTS or later"):
        require("tensorflow", "the evaluator")
