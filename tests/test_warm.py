"""Warm reruns: a standby process per task waits with its imports done; reruns hand it the payload."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import tfnb
from conftest import _current, spark_session


def process_info(ctx):
    import os as _os
    import time as _time

    ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
    boot = next(int(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))
    started = boot + ticks / _os.sysconf("SC_CLK_TCK")
    return {"pid": _os.getpid(), "started": started, "now": _time.time(), "value": _os.environ.get("VALUE")}


def standbys() -> list[str]:
    return [p for p in os.popen("ps -eo pid,args").read().splitlines()
            if "tfnb._task.child --standby" in p or "tfnb._task.warm" in p]


def wait_for(predicate, limit: float = 60.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    return predicate()


def warm_sockets(n: int):
    folder = Path(f"/tmp/tfnb-warm-{os.getuid()}")
    return wait_for(lambda: len(list(folder.glob("*.sock"))) >= n)


@pytest.fixture(autouse=True)
def light_preimport(monkeypatch):
    monkeypatch.setenv("TFNB_PREIMPORT", "json")  # what a standby imports does not matter here


@pytest.fixture(scope="module")
def session():
    """A session of its own, stopped at the end: stopping it must take its standbys down too."""
    s = spark_session("local[2]", **{"spark.tfnb.test": "warm"})
    # the previous session's standbys go with it
    assert wait_for(lambda: not standbys(), 15), f"standbys outlived their session: {standbys()}"
    yield s
    s.stop()
    _current.update(master=None, session=None)
    assert wait_for(lambda: not standbys(), 15), f"standbys outlived their session: {standbys()}"


def test_a_rerun_uses_a_standby_and_a_changed_env_discards_it(session, no_orphans):
    first = tfnb.run(process_info, num_workers=2, spark=session, display=False, env={"VALUE": "a"})
    assert warm_sockets(2), "no standby was left after a successful run"
    called = time.time()
    second = tfnb.run(process_info, num_workers=2, spark=session, display=False, env={"VALUE": "a"})
    assert second["pid"] != first["pid"]  # a fresh process per run, never reused after train_fn ran
    assert second["started"] < called, "the rerun started a new process instead of using the standby"
    assert second["value"] == "a"
    assert warm_sockets(2)
    called = time.time()
    third = tfnb.run(process_info, num_workers=2, spark=session, display=False, env={"VALUE": "b"})
    assert third["value"] == "b" and third["started"] >= called - 1, "a standby with another env= was used"


def importing_then_info(ctx):
    import slow_import  # noqa: F401 - the module the standbys preimport: takes seconds

    return process_info(ctx)


def test_a_rerun_claims_a_standby_that_is_still_importing(session, tmp_path, no_orphans):
    # A notebook rerun right after a run: its standbys have not finished importing. Claiming one
    # costs only the rest of its import; a fresh process would pay all of it.
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(4)\n")
    opts = dict(num_workers=2, spark=session, display=False, preimport=("slow_import",),
                env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    tfnb.run(importing_then_info, **opts)
    folder = Path(f"/tmp/tfnb-warm-{os.getuid()}")
    assert wait_for(lambda: len(list(folder.glob("*.sock.part"))) >= 2, 30), "no standby began importing"
    assert not list(folder.glob("*.sock")), "the standbys finished importing before the rerun"
    importing = {int(p.split()[0]) for p in standbys() if "tfnb._task.child --standby" in p}
    second = tfnb.run(importing_then_info, **opts)
    assert second["pid"] in importing, "the rerun started new processes instead of the importing standbys"


def test_an_idle_standby_exits_after_the_idle_timeout(session, monkeypatch, no_orphans):
    monkeypatch.setenv("TFNB_WARM_IDLE", "2")
    tfnb.run(process_info, num_workers=2, spark=session, display=False)
    assert wait_for(lambda: not standbys(), 30), f"standbys still waiting after their idle timeout: {standbys()}"


def test_warm_false_leaves_nothing(session, no_orphans):
    tfnb.run(process_info, num_workers=2, spark=session, display=False, warm=False)
    assert not standbys()
