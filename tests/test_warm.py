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


# ---------------------------------------------------------------- standbys keyed by the GPUs they were started with


def test_a_standby_is_stale_for_other_settings_or_overlapping_gpus_only():
    from tfnb._task.warm import _stale, key

    one, two, both = key((), True, (), ("0",)), key((), True, (), ("1",)), key((), True, (), ("0", "1"))
    assert one != two and one.split(".")[0] == two.split(".")[0]  # same settings, other GPU
    assert not _stale(one, two)  # a sibling task's standby, on the host's other GPU
    assert _stale(both, one) and _stale(one, both)  # the host's GPUs were dealt anew
    assert _stale(one, key(("json",), True, (), ("1",)))  # other settings
    assert _stale(one, key((), True, (), ())) and _stale(key((), True, (), ()), one)  # GPUs vs none
    assert _stale(one, "0123456789abcdef0123")  # a standby keyed by an older tfnb
    uuid = key((), True, (), ("GPU-5e2f1a9c-0b7d-4e7a-9f3c-2d8e6b1a4c70",))
    assert uuid.split(".")[1].startswith("@") and not _stale(one, uuid)  # cannot tell: left to expire


def test_claiming_leaves_a_siblings_standby_and_discards_stale_ones(monkeypatch):
    import shutil
    import tempfile

    from tfnb._task import warm

    base = tempfile.mkdtemp(prefix="tfnb-w")  # a warm folder of its own; short: a Unix socket path is <= 107 bytes
    monkeypatch.setenv("TFNB_STATE_DIR", base)
    folder = Path(warm.private_dir("warm"))
    env = dict(os.environ, TFNB_PREIMPORT="")
    gpu0, gpu1, both = (warm.key((), True, (), g) for g in (("0",), ("1",), ("0", "1")))
    for want in (gpu0, gpu1, warm.key(("json",), True, (), ("1",))):
        warm.spawn(want, env, 60)

    def keys():
        return sorted(p.name.split("-", 1)[0] for p in folder.glob("*.sock*"))

    def mine():
        return [p for p in os.popen("ps -eo pid,args").read().splitlines() if str(folder) in p]

    try:
        assert wait_for(lambda: len(list(folder.glob("*.sock"))) == 3, 60), keys()
        for conn in warm.claim(gpu1):  # the task on GPU 1 takes its own standby...
            conn.close()
        # ...discards the one with other settings, and leaves GPU 0's to the task on GPU 0
        assert wait_for(lambda: keys() == [gpu0], 15), keys()
        for conn in warm.claim(both):  # a run given both GPUs: GPU 0's standby can serve no one now
            conn.close()
        assert wait_for(lambda: keys() == [] and not mine(), 15), (keys(), mine())
    finally:
        for conn in warm.claim("none.none"):  # other settings than any: every standby left exits
            conn.close()
        wait_for(lambda: not mine(), 15)
        shutil.rmtree(base, ignore_errors=True)
