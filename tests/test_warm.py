"""Warm reruns: a standby process per host waits with its imports done; each rerun's processes are forked from it.

What a standby is doing is read from the socket tfnb/_task/warm.py keeps for it (``.sock.part`` while it
imports, ``.sock`` once warm, gone once it stops taking runs), through the leak checker's view of this test
process's processes (tests/leakcheck.py); a standby's import lasts exactly as long as the test holds
a lock, never a fixed time.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import leakcheck
import tfnb
from tfnb.launcher import LaunchHooks
from conftest import _current, spark_session


def process_info(ctx):
    import os as _os

    import numpy

    return {"pid": _os.getpid(), "parent": _os.getppid(), "value": _os.environ.get("VALUE"),
            "draw": float(numpy.random.random())}


def standbys(state: str | None = None) -> set[int]:
    """Pids of this test process's standbys in ``state``."""
    return {p.pid for p in standby_processes() if state in (None, p.state)}


def standby_processes() -> list[leakcheck.Proc]:
    """This test process's standbys (not the train_fn processes they forked)."""
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


def _queued(pids: set[int], at_least: int = 1) -> bool:
    """Whether ``at_least`` connections wait (tasks' claims, say while they import) on one of these standbys'
    sockets: connections on the socket they bound (``/proc/net/unix`` lists them under the name bound, ``<pid>.new``
    beside the standby's socket, even once that name is gone; flags 0) besides the listener (flags 00010000)."""
    paths = {os.path.join(os.path.dirname(p.argv[p.argv.index("tfnb._task.warm") + 1]), f"{p.pid}.new")
             for p in standby_processes() if p.pid in pids}
    rows = [f for line in Path("/proc/net/unix").read_text().splitlines()[1:] if len(f := line.split()) > 7]
    return sum(f[7] in paths and f[3] != "00010000" for f in rows) >= at_least


@pytest.fixture(autouse=True)
def light_preimport(monkeypatch):
    monkeypatch.setenv("TFNB_PREIMPORT", "numpy.random")  # light, and with a random state a fork would share


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


def test_runs_fork_from_one_standby_and_a_changed_env_discards_it(session):
    opts = dict(num_workers=2, spark=session, display=False)
    first = tfnb.run(process_info, env={"VALUE": "a"}, **opts, hooks=LaunchHooks(all_results=True))
    warm = standbys("warm")
    assert len(warm) == 1, f"not one standby for the host: {standby_processes()}"
    # the first run forks from it too once it listens within ensure's wait (60 s); past that a task starts fresh,
    # so the runs after it are the ones that must fork from it
    for _ in range(2):
        again = tfnb.run(process_info, env={"VALUE": "a"}, **opts, hooks=LaunchHooks(all_results=True))
        # a fresh process per task and run, forked by the standby, which stays for the next run
        assert {r["parent"] for r in again} == warm and {r["value"] for r in again} == {"a"}, again
        assert not {r["pid"] for r in again} & {r["pid"] for r in first}
        assert len({r["draw"] for r in again + first}) == 4, "forked processes share numpy's random state"
        assert standbys("warm") == warm, "the standby did not stay for the next run"
        first = again
    discarded = [p for p in standby_processes() if p.pid in warm]
    third = tfnb.run(process_info, env={"VALUE": "b"}, **opts)
    assert third["value"] == "b" and third["parent"] not in warm, "a standby with another env= ran"
    assert not leakcheck.wait_gone(discarded, 30), "the standby for env VALUE=a was not discarded"


SLOW_IMPORT = """
import fcntl, os, sys
if sys.argv[0].endswith("warm.py"):  # a standby's import lasts until the test releases its lock on HOLD
    with open(os.environ["HOLD"]) as f:
        fcntl.flock(f, fcntl.LOCK_SH)
"""


def importing_then_info(ctx):
    import slow_import  # noqa: F401 - the module the standbys preimport

    return process_info(ctx)


def test_a_run_waits_for_its_standby_to_finish_importing(session, tmp_path):
    # The tasks claim the standby they started (or one a run just before started) while it still imports:
    # they wait for the rest of that import, then get their processes forked from it.
    (tmp_path / "slow_import.py").write_text(SLOW_IMPORT)
    hold, done = tmp_path / "hold", {}
    opts = dict(num_workers=2, spark=session, display=False, preimport=("slow_import",),
                env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "HOLD": str(hold)})
    with open(hold, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run = threading.Thread(target=lambda: done.update(result=tfnb.run(importing_then_info, **opts)))
        run.start()
        try:
            importing = at_least(1, "importing")
            assert importing, f"no standby began importing: {standby_processes()}"
            assert wait_for(lambda: _queued(importing), 120), "the run's tasks did not wait for the standby"
            importing |= standbys("importing")  # each task may have started a standby: any of them, still importing
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)  # the import ends: the run goes on
            run.join(300)
    assert done["result"]["parent"] in importing, "the run started new processes instead of waiting for the standby"


def test_a_standby_discarded_while_claims_wait_leaves_the_run_to_fresh_processes(session):
    # The tasks' claims wait in the standby's queue behind a task of other settings, which discards it: they
    # start their train_fn processes fresh, and the run goes on in its first attempt.
    from tfnb._task import warm

    opts = dict(num_workers=2, spark=session, display=False, env={"VALUE": "d"}, max_attempts=1,
                hooks=LaunchHooks(all_results=True))
    (standby,) = {r["parent"] for r in tfnb.run(process_info, **opts)}  # leaves its standby warm
    os.kill(standby, signal.SIGSTOP)  # it takes no claim until continued: the claims below queue up
    try:
        for conn in warm.claim(warm.key(("json",), True, (), ())):  # other settings: told to exit first
            conn.close()
        run = ThreadPoolExecutor(1).submit(tfnb.run, process_info, **opts)
        assert wait_for(lambda: _queued({standby}, 3), 120), "the run's claims did not queue up"
    finally:
        os.kill(standby, signal.SIGCONT)
    result = run.result(300)  # not WorkerError (ProcessDied), nor a relaunch (max_attempts=1)
    assert {r["value"] for r in result} == {"d"} and standby not in {r["parent"] for r in result}
    assert not leakcheck.wait_gone([p for p in standby_processes() if p.pid == standby], 30)


def test_a_standby_needs_a_short_private_folder():
    # (A run meeting either turns standbys off with one warning line per task: tests/test_security.py.)
    from tfnb._task import warm

    want, env = warm.key((), True, (), ()), dict(os.environ, TFNB_PREIMPORT="")
    long = tempfile.mkdtemp(prefix="tfnb-w-" + "x" * 70)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TFNB_STATE_DIR", long)
            with pytest.raises(warm.Unavailable, match=rf"^TFNB_STATE_DIR '{long}' is too long for the standbys' "
                                                        r"Unix sockets: .* over the 107 .*set TFNB_STATE_DIR on the "
                                                        r"executors to a folder of at most \d+ bytes"):
                warm.ensure(want, env, 5)
        assert not list(Path(long).glob("*/*.sock*"))
    finally:
        shutil.rmtree(long, ignore_errors=True)


def test_an_idle_standby_exits_after_the_idle_timeout(session, monkeypatch):
    monkeypatch.setenv("TFNB_WARM_IDLE", "3")
    tfnb.run(process_info, num_workers=2, spark=session, display=False)
    waiting = wait_for(lambda: [p for p in standby_processes() if p.argv[-2] == "3.0"])  # not an earlier test's
    assert waiting, f"the run left no standby: {standby_processes()}"
    # the session goes on: only their idle timeout (3 s, the suite's is 120 s) can end them
    assert not leakcheck.wait_gone(waiting, 60), f"standbys still waiting after their idle timeout: {waiting}"


def test_warm_false_leaves_nothing(session):
    before = {p.pid for p in standby_processes()}
    tfnb.run(process_info, num_workers=2, spark=session, display=False, warm=False)
    assert not [p for p in standby_processes() if p.pid not in before]
    # the same run with warm=True has started a standby by the time it returns: the check above sees it
    tfnb.run(process_info, num_workers=2, spark=session, display=False)
    assert [p for p in standby_processes() if p.pid not in before]


# ---------------------------------------------------------------- standbys keyed by the GPUs they were started with


def test_a_standby_is_named_once_it_listens():
    """A task that finds a standby's socket queues on it: were it named before it listens, a connect in between
    would be refused, taken for a dead standby's, and its name unlinked, leaving it unclaimable."""
    import subprocess
    import sys

    from tfnb._task import warm

    want = warm.key(("json",), True, (("WINDOW", "1"),), ())
    path = warm._path(want)
    slow_listen = ("import runpy, socket, sys, time\n"
                   "listen = socket.socket.listen\n"
                   "socket.socket.listen = lambda s, *a: (time.sleep(2), listen(s, *a))[1]\n"
                   f"sys.argv = ['', {path!r}, '60', '{os.getpid()}']\n"
                   "runpy.run_module('tfnb._task.warm', run_name='__main__', alter_sys=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", slow_listen], env=dict(os.environ, TFNB_PREIMPORT="json"))
    try:
        named = wait_for(lambda: [p for p in (path + ".part", path) if os.path.exists(p)], 30)
        assert named, "the standby never named its socket"
        conn = warm._connect(named[0])
        assert conn is not None and os.path.exists(named[0]), "a named standby refused a task"
        with conn:
            conn.sendall(b'{"exit": true}\n')  # other settings: it ends
        assert proc.wait(30) == 0
    finally:
        proc.kill()


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
        for conn in warm.claim(gpu1):  # the task on GPU 1 reaches its own standby (which stays)...
            conn.close()
        # ...discards the one with other settings, and leaves GPU 0's to the task on GPU 0
        assert wait_for(lambda: keys() == sorted([gpu0, gpu1]), 15), keys()
        for conn in warm.claim(both):  # a run given both GPUs: the others' standbys can serve no one now
            conn.close()
        assert wait_for(lambda: keys() == [] and not mine(), 15), (keys(), mine())
    finally:
        for conn in warm.claim("none.none"):  # other settings than any: every standby left exits
            conn.close()
        wait_for(lambda: not mine(), 15)
        shutil.rmtree(base, ignore_errors=True)


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def _waiting_workdir(folder: Path) -> str:
    """A task's folder as its supervisor leaves it before ``go``: the train_fn process waits there."""
    import pickle

    with open(folder / "payload.pkl", "wb") as f:
        pickle.dump({"fn": None, "args": (), "kwargs": {}, "mode": "train"}, f)
    return str(folder)


@pytest.mark.parametrize("forked", [True, False])
def test_a_stopped_train_fn_process_dies_with_its_task(tmp_path, forked):
    """A train_fn process stopped by SIGSTOP cannot run its own watch of its task; when the task's Python worker is
    killed (Spark cancelling it) the process goes all the same: its standby kills it, or, started fresh, the kernel
    (parent-death signal)."""
    import subprocess
    import sys

    workdir = _waiting_workdir(tmp_path)
    if forked:  # the task is this test: its end of the claim's connection closing is the task dying
        from tfnb._task import setup, warm
        from tfnb._task.supervisor import TrainFnProcess

        want = warm.key(("json",), True, (), ())
        warm.ensure(want, dict(os.environ, TFNB_PREIMPORT="json"), 60)
        held = setup.reserve_port()
        claimed = TrainFnProcess(next(warm.claim(want)), workdir, workdir, dict(os.environ), held.fileno())
        pid = claimed.pid
        held.close()
        standby = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    else:  # the task is a process of its own that starts the train_fn process as the supervisor does
        from tfnb._task.supervisor import _CHILD_MAIN, ENV_SUPERVISOR

        task = subprocess.Popen([sys.executable, "-c", (
            "import os, subprocess, sys, time\n"
            f"p = subprocess.Popen([sys.executable, '-c', {_CHILD_MAIN!r}, {workdir!r}], stdin=subprocess.PIPE, "
            f"env=dict(os.environ, {ENV_SUPERVISOR}=str(os.getpid())), start_new_session=True)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
        pid = int(task.stdout.readline())
    [proc] = wait_for(lambda: [p for p in leakcheck.processes() if p.pid == pid and p.kind == leakcheck.TRAIN_FN], 30)
    assert wait_for(lambda: (tmp_path / "stacks.txt").exists(), 30)  # started: it waits for its go
    os.kill(pid, signal.SIGSTOP)
    assert wait_for(lambda: _stopped(pid), 10)
    if forked:
        claimed.conn.close()
        claimed.stdin.close()
    else:
        task.kill()
        task.wait()
    try:
        assert not leakcheck.wait_gone([proc], 10), f"the stopped train_fn process {pid} outlived its task"
    finally:
        if forked:  # it watches this test's parent, not a Spark daemon: it would outlive the session
            os.kill(standby, signal.SIGKILL)
