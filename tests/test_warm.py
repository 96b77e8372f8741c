"""Warm reruns: a standby process per task waits with its imports done; reruns hand it the payload.

What a standby is doing is read from the socket tfnb/_warm.py keeps for it (``.sock.part`` while it
imports, ``.sock`` once warm, gone once claimed), through the leak checker's view of this test
process's processes (tests/leakcheck.py); a standby's import lasts exactly as long as the test holds
a lock, never a fixed time.
"""
from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import pytest

import leakcheck
import tfnb
from conftest import _current, spark_session


def process_info(ctx):
    import os as _os

    return {"pid": _os.getpid(), "value": _os.environ.get("VALUE")}


def standbys(state: str | None = None) -> set[int]:
    """Pids of this test process's idle standbys' train_fn processes (``tfnb._task.child --standby``) in ``state``."""
    return {p.pid for p in leakcheck.processes()
            if p.kind == leakcheck.STANDBY and "--standby" in p.argv and state in (None, p.state)}


def standby_processes() -> list[leakcheck.Proc]:
    """Every process of this test process's idle standbys, nannies included."""
    return [p for p in leakcheck.processes() if p.kind == leakcheck.STANDBY]


def wait_for(predicate, limit: float = 60.0):
    """``predicate()``'s first true value, or its last one after ``limit`` seconds. It polls: the
    states are other processes' files, with nothing in this process to block on."""
    end = time.monotonic() + limit
    while not (value := predicate()) and time.monotonic() < end:
        time.sleep(0.1)
    return value


def at_least(n: int, state: str) -> set[int]:
    """Pids of ``n`` or more standbys in ``state`` once there are that many (empty after a minute)."""
    return wait_for(lambda: found if len(found := standbys(state)) >= n else set())


@pytest.fixture(autouse=True)
def light_preimport(monkeypatch):
    monkeypatch.setenv("TFNB_PREIMPORT", "json")  # what a standby imports does not matter here


@pytest.fixture(scope="module")
def session():
    """A session of its own, stopped at the end: stopping it must take its standbys down too."""
    s = spark_session("local[2]", **{"spark.tfnb.test": "warm"})
    left = leakcheck.wait_gone(standby_processes(), 30)  # the previous session's standbys went with it
    assert not left, f"standbys outlived their session: {left}"
    yield s
    s.stop()
    _current.update(master=None, session=None)
    left = leakcheck.wait_gone(standby_processes(), 30)
    assert not left, f"standbys outlived their session: {left}"


def test_a_rerun_uses_a_standby_and_a_changed_env_discards_it(session):
    opts = dict(num_workers=2, spark=session, display=False)
    tfnb.run(process_info, env={"VALUE": "a"}, **opts)
    warm = at_least(2, "warm")
    assert warm, f"no standby was left after a successful run: {standby_processes()}"
    second = tfnb.run(process_info, env={"VALUE": "a"}, **opts)
    # a process per run, never reused after train_fn ran: the rerun's is a standby that was waiting
    assert second["value"] == "a" and second["pid"] in warm
    warm = at_least(2, "warm")
    discarded = [p for p in standby_processes() if p.pid in warm]
    third = tfnb.run(process_info, env={"VALUE": "b"}, **opts)
    assert third["value"] == "b" and third["pid"] not in {p.pid for p in discarded}, "a standby with another env= ran"
    assert not leakcheck.wait_gone(discarded, 30), "the standbys for env VALUE=a were not discarded"


SLOW_IMPORT = """
import fcntl, os, sys
if "--standby" in sys.argv:  # a standby's import lasts until the test releases its lock on HOLD
    with open(os.environ["HOLD"]) as f:
        fcntl.flock(f, fcntl.LOCK_SH)
"""


def importing_then_info(ctx):
    import slow_import  # noqa: F401 - the module the standbys preimport

    return process_info(ctx)


def test_a_rerun_claims_a_standby_that_is_still_importing(session, tmp_path):
    # A notebook rerun right after a run: its standbys have not finished importing. Claiming one
    # costs only the rest of its import; a fresh process would pay all of it.
    (tmp_path / "slow_import.py").write_text(SLOW_IMPORT)
    hold, rerun_done = tmp_path / "hold", threading.Event()
    opts = dict(num_workers=2, spark=session, display=False, preimport=("slow_import",),
                env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "HOLD": str(hold)})
    with open(hold, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        tfnb.run(importing_then_info, **opts)
        importing = at_least(2, "importing")
        assert importing, f"no standby began importing: {standby_processes()}"

        def release_once_claimed():  # then the rerun, waiting on the claimed standbys, goes on
            wait_for(lambda: rerun_done.is_set() or not importing & standbys(), 120)
            fcntl.flock(lock, fcntl.LOCK_UN)

        releaser = threading.Thread(target=release_once_claimed)
        releaser.start()
        try:
            second = tfnb.run(importing_then_info, **opts)
        finally:
            rerun_done.set()
            releaser.join()
    assert second["pid"] in importing, "the rerun started new processes instead of the importing standbys"


def test_an_idle_standby_exits_after_the_idle_timeout(session, monkeypatch):
    monkeypatch.setenv("TFNB_WARM_IDLE", "3")
    tfnb.run(process_info, num_workers=2, spark=session, display=False)
    waiting = wait_for(standby_processes)
    assert waiting, "the run left no standby"
    # the session goes on: only their idle timeout (3 s, the suite's is 120 s) can end them
    assert not leakcheck.wait_gone(waiting, 60), f"standbys still waiting after their idle timeout: {waiting}"


def test_warm_false_leaves_nothing(session):
    before = {p.pid for p in standby_processes()}
    tfnb.run(process_info, num_workers=2, spark=session, display=False, warm=False)
    assert not [p for p in standby_processes() if p.pid not in before]
    # the same run with warm=True has left its standbys by the time it returns: the check above sees them
    tfnb.run(process_info, num_workers=2, spark=session, display=False)
    assert [p for p in standby_processes() if p.pid not in before]


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
