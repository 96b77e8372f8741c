"""Shared fixtures: a real SparkSession, an artifacts folder; leak checks on every test (leakcheck.py);
under CI, a skip for a missing real component is a failure (see components.py).

The suite runs on pytest-xdist workers (setup.cfg: ``-n auto --dist loadgroup``): most tests wait on a JVM,
TensorFlow or a server starting. Each worker is a test process of its own, with its own Spark session, tfnb
state folder (warm standbys, TensorBoard bookkeeping, model cache, run logs), S3 and MLflow servers and
leak checks; ports come from ``components.free_port``. :func:`pytest_xdist_auto_num_workers` picks how many
workers; :func:`pytest_collection_modifyitems` keeps each file on one worker (module fixtures, tests that
restart the session) and starts the longest work first."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from components import IN_CI, free_port, is_missing_component
from environments import jvm_options

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"

# Spark's Python workers must run this interpreter, and find the test modules so functions
# defined in them unpickle on executors.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "tests"), str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# tf.keras in this process is tf-keras, as in every train_fn process and the notebooks: the evaluator
# restores checkpoints the workers wrote, whichever test module imports TensorFlow first.
os.environ["TF_USE_LEGACY_KERAS"] = "1"
# Idle standbys end with the Spark session (checked at the end of the session); this bounds them too.
os.environ.setdefault("TFNB_WARM_IDLE", "120")
# The tests' JVM options (tests/environments.py): for every driver (spark-submit: pyspark, the Spark Connect
# server, dbsim's clusters), the standalone daemons, and the executors of the sessions below.
_DRIVER_JVM = jvm_options("driver")  # once: it hashes pyspark's jars
os.environ.setdefault("SPARK_SUBMIT_OPTS", _DRIVER_JVM)
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", _DRIVER_JVM)

pytest_plugins = ["s3server", "leakcheck"]

_current = {"master": None, "session": None}


def spark_session(master: str = "local[2]", **conf):
    """The one classic SparkSession of this test process, restarted when another master is asked for, or when a test
    stopped it (a refusal case does)."""
    from pyspark.sql import SparkSession

    key = (master, tuple(sorted(conf.items())))
    if _current["master"] == key and _current["session"].sparkContext._jsc is not None:
        return _current["session"]
    previous = _current["session"] or SparkSession.getActiveSession()
    if previous is not None:
        jvm = previous.sparkContext._jvm
        previous.stop()
        # The builder leaves its options behind as JVM system properties; the next session must not
        # inherit them (a GPU task requirement would make local[2] tasks unschedulable).
        for name, _ in (_current["master"] or ((), ()))[1]:
            jvm.java.lang.System.clearProperty(name)
    builder = (SparkSession.builder.master(master).appName("tfnb-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.executor.extraJavaOptions", jvm_options("executor")))
    for k, v in conf.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    _current.update(master=key, session=session)
    if m := re.fullmatch(r"local-cluster\[\s*(\d+)\s*,.*\]", master):
        _wait_for_executors(session, int(m.group(1)))
    elif master.startswith("spark://") and {"spark.cores.max", "spark.executor.cores"} <= conf.keys():
        _wait_for_executors(session, int(conf["spark.cores.max"]) // int(conf["spark.executor.cores"]))
    return session


def stub_gpus(folder: Path, count: int) -> str:
    """A Spark GPU discovery script (written in ``folder``) that reports ``count`` GPUs, "0" on: stubs, for
    Spark's GPU scheduling without GPUs."""
    script = folder / f"discover_{count}_gpus.sh"
    addresses = ", ".join(f'"{i}"' for i in range(count))
    script.write_text(f"#!/bin/sh\necho '{{\"name\": \"gpu\", \"addresses\": [{addresses}]}}'\n")
    script.chmod(0o755)
    return str(script)


def gpu_local_cluster(folder: Path, gpus: int):
    """The session on local-cluster[2,1,1024] (two executor JVMs) with ``gpus`` stub GPUs per executor, all of
    them asked for by each task."""
    amount, script = str(gpus), stub_gpus(folder, gpus)
    return spark_session("local-cluster[2,1,1024]", **{
        "spark.worker.resource.gpu.amount": amount, "spark.worker.resource.gpu.discoveryScript": script,
        "spark.executor.resource.gpu.amount": amount, "spark.task.resource.gpu.amount": amount})


@contextlib.contextmanager
def spark_connect(master: str = "local[2]", **conf):
    """A Spark Connect client of a real Spark Connect server on loopback (a Spark on ``master``, with ``conf``, the
    Connect plugin and a token), as a notebook on standard access mode or serverless has one; the classic local[2]
    session comes back after."""
    from pyspark.sql import SparkSession

    port, token = free_port(), uuid.uuid4().hex
    spark_session(master, **conf, **{"spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
                                     "spark.connect.grpc.binding.address": "127.0.0.1",
                                     "spark.connect.grpc.binding.port": str(port),
                                     "spark.connect.authenticate.token": token})
    connect_mode = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    # pyspark flags the process as a Connect client (SPARK_CONNECT_MODE_ENABLED): pyspark.sql.functions then build
    # Connect expressions
    client = SparkSession.builder.remote(f"sc://localhost:{port}/;token={token}").create()
    try:
        assert type(client).__module__.startswith("pyspark.sql.connect")
        yield client
    finally:
        client.stop()
        if connect_mode is None:  # this process goes on hosting classic sessions
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        spark_session("local[2]")  # the shared session, back for the tests that follow


def _wait_for_executors(session, count: int, limit: float = 300.0) -> None:
    """Until ``count`` executors registered (the master string's, or spark.cores.max / spark.executor.cores): on a
    busy machine their JVMs take longer than tfnb's slot wait (TFNB_SLOT_WAIT, 30 s), and a test would meet a
    cluster still starting instead of the one it asked for."""
    status = session.sparkContext._jsc.sc().getExecutorMemoryStatus  # the driver's block manager counts too
    end = time.monotonic() + limit
    while status().size() - 1 < count:
        if time.monotonic() > end:
            raise TimeoutError(f"{count} executors of {session.conf.get('spark.master')} did not register "
                               f"within {limit:g} s")
        time.sleep(0.1)  # nothing in pyspark to block on until an executor registers


@pytest.fixture
def spark():
    """A local[2] session (two task slots), shared by the tests that ask for it."""
    return spark_session("local[2]")


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def child_processes() -> list[str]:
    """``PID: command line`` of this test process's train_fn processes that are not idle standbys."""
    import leakcheck  # the plugin (pytest_plugins below), imported once pytest has loaded it

    return [f"{p.pid}: {' '.join(p.argv)}" for p in leakcheck.processes() if p.kind == leakcheck.TRAIN_FN]


@pytest.fixture
def no_orphans(leak_check):
    """Kept for the tests that ask for it: every test is now checked for processes it leaves behind
    (leak_check, tests/leakcheck.py), train_fn processes among them."""


@pytest.fixture
def no_aws_credentials(tmp_path, monkeypatch):
    """This process with no AWS credentials anywhere boto3 looks: no AWS_* variables, no credentials or
    config file, no instance metadata."""
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def no_gcsfs(monkeypatch):
    """This process as if gcsfs were not installed (the monitoring extra brings it along)."""
    import importlib

    monkeypatch.setitem(sys.modules, "gcsfs", None)  # `import gcsfs` now raises ImportError
    registry = importlib.import_module("fsspec.registry")._registry  # classes fsspec already imported
    for scheme in ("gs", "gcs"):
        monkeypatch.delitem(registry, scheme, raising=False)


def _fail_in_ci(report) -> None:
    """Turn a skip for a missing component into a failure when CI is set (components.need's rule,
    applied to importorskip and to skips raised in fixtures and helpers)."""
    if not IN_CI or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if is_missing_component(reason):
        report.outcome = "failed"
        report.longrepr = f"CI is set, so a missing component fails instead of skipping: {reason}"


def pytest_runtest_setup(item):
    # A browser test finds out before it starts (not midway, after minutes of training) that
    # chromium is missing: a skip here, a failure under CI.
    if item.get_closest_marker("browser"):
        from browser import require_chromium

        require_chromium()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    _fail_in_ci(report)
    if report.failed and call.when == "call" and "chromium_page" in getattr(item, "funcargs", {}):
        _page_on_failure(item, report)
    return report


def _page_on_failure(item, report) -> None:
    """A failed browser test's report carries what the page showed (cells' text, a screenshot in
    test-artifacts) and the tail of JupyterLab's log, where kernel tracebacks land."""
    page, lab = item.funcargs["chromium_page"], item.funcargs.get("jupyter_lab")
    try:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{item.name}-failed.png"), full_page=True)
        cells = page.locator(".jp-Cell").all_inner_texts()
        report.sections.append(("page at failure", "\n---\n".join(cells)[-6000:]))
    except Exception as e:  # the page itself may be what failed
        report.sections.append(("page at failure", f"unreadable: {e!r}"))
    if lab is not None and hasattr(lab, "log_tail"):
        report.sections.append(("JupyterLab log", lab.log_tail()))


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    _fail_in_ci(report)
    return report


# ---------------------------------------------------------------- parallel workers (pytest-xdist)

# Two cores: a third worker fills the time the other two wait on a JVM, a download or a server; a fourth
# only slows every start-up (measured on a subset, see README "Tests").
WORKERS = 3
# Work units (a file, or one test of a file in SPLIT), longest first, from a run's --durations: they are
# handed out in this order, so the last ones to finish are short.
LONGEST_FIRST = (  # seconds in a 3-worker run of the whole suite (2026-11-29, idle machine): 144, 127, 124, 90, ...
    "tests/test_databricks.py::test_runtime_15_4_ml_import_attach_run_all", "tests/test_resources.py",
    "tests/test_dbsim.py", "tests/test_inference.py", "tests/test_recovery.py", "tests/test_mirrored.py",
    "tests/test_docs.py", "tests/test_notebooks.py", "tests/test_masters.py", "tests/test_compat.py",
    "tests/test_elastic.py", "tests/test_progress.py", "tests/test_sweep.py", "tests/test_selfcheck.py",
    "tests/test_mlflow.py", "tests/test_keras3.py", "tests/test_storage.py", "tests/test_launcher.py",
    "tests/test_browser_tensorboard.py", "tests/test_cli.py", "tests/test_leaks.py", "tests/test_tensorboard.py",
    "tests/test_front_door.py", "tests/test_refuse_launcher.py", "tests/test_feeding.py", "tests/test_stall.py",
    "tests/test_warm.py", "tests/test_training.py", "tests/test_profile.py", "tests/test_monitoring.py",
    "tests/test_evaluator.py", "tests/test_refuse_cluster.py",
    "tests/test_databricks.py::test_spark_4_runtime_without_a_volume_says_how_to_create_one", "tests/test_staging.py",
    "tests/test_security.py", "tests/test_runtime_sim.py", "tests/test_channel.py", "tests/test_charts.py",
    "tests/test_refus",
)
# Files whose tests share nothing (no module fixture, no order between them): each test is a unit.
SPLIT = ("tests/test_databricks.py",)


@pytest.hookimpl(tryfirst=True)  # before xdist's own (CPU count)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (setup.cfg): WORKERS (TFNB_TEST_WORKERS overrides), but no more than the test files named
    on the command line, and none for a single file (``pytest tests/test_cli.py -k demo`` runs in this
    process). PYTEST_XDIST_AUTO_NUM_WORKERS, xdist's own setting, wins over both."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    workers = int(os.environ.get("TFNB_TEST_WORKERS", WORKERS))
    named = {a.split("::")[0] for a in config.args}
    if named and all(n.endswith(".py") for n in named):
        return min(workers, len(named)) if len(named) > 1 else 0
    return workers


def unit(nodeid: str) -> str:
    """The work unit of a test: its file, so module fixtures are set up once and tests that restart or stop
    the shared Spark session keep their order; one test for SPLIT files; every tests/test_refus* file in one
    unit (the refusals stop the shared session on purpose)."""
    path = nodeid.split("::")[0]
    if os.path.basename(path).startswith("test_refus"):
        return "tests/test_refus"
    return nodeid.split("[")[0] if path in SPLIT else path


def _rank(scope: str) -> int:
    return next((i for i, u in enumerate(LONGEST_FIRST) if scope.startswith(u)), len(LONGEST_FIRST))


@pytest.hookimpl(tryfirst=True)  # before xdist's own loadfile scheduler
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (setup.cfg), refined: work units as :func:`unit` says, handed out longest first
    (LONGEST_FIRST), one at a time (a worker gets the next unit when it starts the last test of its current
    one, not two tests before, so the last units go to whichever worker is free)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return unit(nodeid)

        def _assign_work_unit(self, node):
            self.workqueue.move_to_end(min(self.workqueue, key=_rank), last=False)  # min: the first of equals
            super()._assign_work_unit(node)

        def _reschedule(self, node):
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
            elif self._pending_of(self.assigned_work[node]) <= 1:
                self._assign_work_unit(node)

    return Units(config, log)


def pytest_sessionfinish(session, exitstatus):
    if _current["session"] is not None:
        _current["session"].stop()


def pytest_configure(config):
    # tfnb's per-user state (warm standbys' sockets, TensorBoard bookkeeping, model cache, run logs) is
    # this test process's own: other runs on the machine (pytest-xdist workers, other people's) can neither
    # claim its standbys nor reuse its TensorBoards. Here, not at import: Spark's Python workers import
    # this module too (to unpickle test functions) and must keep the test process's folder. Short path:
    # the standbys' Unix sockets live below it.
    config.tfnb_state_dir = os.environ["TFNB_STATE_DIR"] = tempfile.mkdtemp(prefix="tfnb-t-")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    shutil.rmtree(getattr(config, "tfnb_state_dir", ""), ignore_errors=True)  # after leakcheck's end-of-session check


@pytest.fixture(autouse=True)
def _test_module_by_value(request):
    """A train_fn defined in a test module goes to its train_fn processes by value, as a notebook's does: the
    process then never imports the test module and everything it imports (pytest, servers' clients, MLflow...),
    seconds in every process of every run."""
    import cloudpickle

    if request.module.__name__ not in cloudpickle.list_registry_pickle_by_value():
        cloudpickle.register_pickle_by_value(request.module)
