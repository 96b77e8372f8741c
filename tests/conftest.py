"""Shared fixtures: a real SparkSession, process/port leak checks, an artifacts folder; under CI, a
skip for a missing real component is a failure (see components.py)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from components import IN_CI, is_missing_component

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

pytest_plugins = ["s3server"]

_current = {"master": None, "session": None}


def spark_session(master: str = "local[2]", **conf):
    """The one classic SparkSession of this test process, restarted when another master is asked for."""
    from pyspark.sql import SparkSession

    key = (master, tuple(sorted(conf.items())))
    if _current["master"] == key:
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
               .config("spark.sql.shuffle.partitions", "4"))
    for k, v in conf.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    _current.update(master=key, session=session)
    return session


@pytest.fixture
def spark():
    """A local[2] session (two task slots), shared by the tests that ask for it."""
    return spark_session("local[2]")


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def _idle_standby(proc: Path, cmd: str) -> bool:
    """A warm standby nobody claimed yet (its nanny's socket, or while it imports the .part, exists)."""
    if "--standby" not in cmd.split():
        return False
    try:
        ppid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
        nanny = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
    except (OSError, IndexError):
        return False
    if b"tfnb._task.warm" not in nanny:
        return False
    path = nanny[nanny.index(b"tfnb._task.warm") + 1].decode()
    return os.path.exists(path) or os.path.exists(path + ".part")


def child_processes() -> list[str]:
    """Command lines of tfnb train_fn processes still alive on this machine."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "tfnb._task.child" in cmd and not _idle_standby(d, cmd):
            out.append(f"{d.name}: {cmd}")
    return out


@pytest.fixture
def no_orphans():
    """Asserts after the test that no train_fn process outlived its run."""
    before = set(child_processes())
    yield
    import time

    deadline = time.monotonic() + 10
    left = [p for p in child_processes() if p not in before]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in child_processes() if p not in before]
    assert not left, f"train_fn processes left running: {left}"


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
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    _fail_in_ci(report)
    return report


def pytest_sessionfinish(session, exitstatus):
    if _current["session"] is not None:
        _current["session"].stop()
