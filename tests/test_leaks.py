"""The leak checker (tests/leakcheck.py) on tests that leak on purpose, run by a pytest of their own so
that this suite stays green: real rclone servers and a real warm standby (tfnb._task.warm)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

LEAKY = '''
import os, subprocess, sys
import s3server

def note(what, pid):  # in a file, not on stdout: a pytest-xdist worker's output is not shown
    with open("pids", "a") as f:
        f.write(f"{what} {pid}\\n")

def test_forgets_its_server(tmp_path):
    server = s3server.start_rclone(tmp_path)
    note("FORGOTTEN", server.proc.pid)

def test_orphans_a_server(tmp_path):
    # through a shell that exits at once: by the time the test ends, the server's parent is init
    cmd = f'"{s3server.rclone_binary()}" serve s3 --addr 127.0.0.1:0 "{tmp_path}" >/dev/null 2>&1 & echo $!'
    pid = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=True).stdout.strip()
    note("ORPHANED", pid)

KEPT = []

def test_leaves_a_process_forked_from_a_standby_that_then_died(tmp_path):
    # the train_fn process keeps the standby's command line; with its parent gone only its folder tells it apart
    import signal
    from tfnb._task import setup, warm

    want = warm.key(("json",), True, (), ())
    warm.ensure(want, dict(os.environ), 60)
    import pickle
    with open(tmp_path / "payload.pkl", "wb") as f:  # what its task would have written: it then waits for go
        pickle.dump({"fn": None, "args": (), "kwargs": {}, "mode": "train"}, f)
    held = setup.reserve_port()
    from tfnb._task.supervisor import TrainFnProcess
    claimed = TrainFnProcess(next(warm.claim(want)), str(tmp_path), str(tmp_path), dict(os.environ), held.fileno())
    KEPT.append((claimed, held))  # its connection open: the process waits for its go
    standby = int(open(f"/proc/{claimed.pid}/stat").read().rsplit(")", 1)[1].split()[1])
    import time
    end = time.monotonic() + 30  # the forked process names itself first thing (warm.TRAIN_FN); then its standby dies
    while open(f"/proc/{claimed.pid}/comm").read().strip() != "tfnb-train_fn" and time.monotonic() < end:
        time.sleep(0.01)
    os.kill(standby, signal.SIGKILL)
    note("FORKED", claimed.pid)

def test_leaves_a_standby_that_outlives_the_session(tmp_path):
    # watching this pytest process instead of a Spark Python daemon, it cannot end with the session
    standby = subprocess.Popen([sys.executable, "-m", "tfnb._task.warm", str(tmp_path / "s.sock"), "600",
                                str(os.getpid())])
    note("STANDBY", standby.pid)
'''

CLEAN = '''
import os, subprocess, sys
import s3server

def test_stops_its_server(tmp_path):
    with s3server.start_rclone(tmp_path) as server:
        server.client().list_buckets()

def test_leaves_a_standby_that_ends_with_its_daemon(tmp_path):
    daemon = subprocess.Popen(["sleep", "600"])  # stands for the executor's Python daemon
    subprocess.Popen([sys.executable, "-m", "tfnb._task.warm", str(tmp_path / "s.sock"), "600", str(daemon.pid)])
    daemon.kill()  # the Spark session ends
    daemon.wait()
'''


# in this process, and on two pytest-xdist workers (each checks its own; the controller reports and fails)
WORKERS = pytest.mark.parametrize("workers", ["0", "2"])


def run_pytest(folder: Path, source: str, workers: str, **env: str) -> subprocess.CompletedProcess:
    (folder / "test_inner.py").write_text(textwrap.dedent(source))
    env = dict(os.environ, TFNB_PREIMPORT="json", **env)  # what the standby imports does not matter
    # --rootdir: node ids stay "test_inner.py::..." whatever setup.py or ini file a folder above holds
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "leakcheck", "-p", "no:cacheprovider", "-s", "-q",
                           "-n", workers, "--rootdir", str(folder), "test_inner.py"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


@WORKERS
def test_leaked_servers_fail_their_test_and_a_standby_that_outlives_the_session_fails_the_run(tmp_path, workers):
    done = run_pytest(tmp_path, LEAKY, workers, LEAKCHECK_GRACE="3")  # these never end by themselves: waiting is moot
    out = done.stdout
    noted = (tmp_path / "pids").read_text()
    pids = {k: int(v) for k, v in re.findall(r"^(FORGOTTEN|ORPHANED|FORKED|STANDBY) (\d+)$", noted, re.M)}
    assert done.returncode == 1 and set(pids) == {"FORGOTTEN", "ORPHANED", "FORKED", "STANDBY"}, out + done.stderr
    assert re.search(r"4 passed, 3 errors", out), out
    assert re.search(r"ERROR at teardown of test_leaves_a_process_forked_from_a_standby_that_then_died _+\n"
                     r"(\[gw\d\] .*\n)?test_inner.py::test_leaves_a_process_forked_from_a_standby_that_then_died left "
                     r"1 process\(es\) running \(ended now with SIGKILL\):\n"
                     rf"  train_fn child +pid {pids['FORKED']} +\S+ -m tfnb\._task\.warm ", out), out
    for test, pid in (("test_forgets_its_server", pids["FORGOTTEN"]), ("test_orphans_a_server", pids["ORPHANED"])):
        assert re.search(rf"ERROR at teardown of {test} _+\n(\[gw\d\] .*\n)?"  # the worker's line, under xdist
                         rf"test_inner.py::{test} left 1 process\(es\) running \(ended now with SIGKILL\):\n"
                         rf"  rclone +pid {pid} +\S+/rclone serve s3 ", out), out
    standby = rf"  idle warm standby +pid {pids['STANDBY']} +\S+ -m tfnb\._task\.warm \S+/s\.sock 600 "
    assert re.search(r"the session( \(worker gw[01]\))? left 1 process\(es\) running \(ended now with SIGKILL\):\n"
                     rf"{standby}", out), out
    assert "some outlived the session" in out
    assert not [name for name, pid in pids.items() if running(pid)], "the checker killed what it reported"


@WORKERS
def test_a_run_that_stops_what_it_starts_passes_and_its_standby_is_counted(tmp_path, workers):
    done = run_pytest(tmp_path, CLEAN, workers)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "leakcheck: 1 idle warm standby(s) were left between tests (by design); all ended with the Spark " \
           "session" in done.stdout
