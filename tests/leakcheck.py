"""Leak checks, on for every test: a test fails when a process it started is still running after it.

A pytest plugin: conftest.py loads it for the suite, ``pytest -p leakcheck`` loads it into any run
(tests/test_leaks.py runs it that way on tests that leak on purpose).

After each test, the processes of the kinds in :data:`KINDS` that appeared during the test and are
still running ``LEAKCHECK_GRACE`` seconds later (default 30; waited for with pidfds, woken as each
ends, so only a real leak costs the wait) fail the test at teardown, one line each (kind, pid,
command line), and are then killed.

Not leaks:

* warm standbys (``python -m tfnb._task.warm``; the train_fn processes they fork, which carry the same command
  line, are told apart by their parent, or by the name they give themselves once that parent is gone, and
  checked as train_fn processes), left on purpose for the next run:
  counted in the test's report and, at the end of the session, required to end with the Spark session
  (conftest.py gives them an idle timeout for the suite too);
* the pyspark gateway JVM (one per test process, for its whole life) and, while a SparkContext is
  active, the shared session's JVMs and Python workers below it;
* processes started while a module- or session-scoped fixture was set up (S3 and MLflow servers),
  and the processes below them.

At the end of the session every process of those kinds but the gateway JVM must be gone; what is
left is reported the same way and fails the run.

Only this test process's processes count, so parallel runs (pytest-xdist workers, other people's
runs on the same machine) never see each other's: a process counts when its chain of parents
(``/proc/PID/stat``) leads here, or, for one orphaned on the way (its parent exited and init adopted
it), when its environment carries this process's token in ``LEAKCHECK_OWNERS``, which everything
started from here inherits. Under pytest-xdist each worker checks its own tests and its own end of
session and sends that end to the controller (``workeroutput``), which reports it and fails the run;
the controller starts nothing and checks nothing (the workers are its children: it would see theirs).
"""
from __future__ import annotations

import os
import re
import secrets
import select
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

TRAIN_FN, STANDBY, SPARK_JVM, SPARK_PYTHON = "train_fn child", "idle warm standby", "Spark JVM", "Spark Python worker"
TENSORBOARD, RCLONE, MLFLOW, MOTO = "TensorBoard", "rclone", "MLflow server", "moto server"
KINDS = (TRAIN_FN, SPARK_JVM, SPARK_PYTHON, TENSORBOARD, RCLONE, MLFLOW, MOTO)
OWNERS = "LEAKCHECK_OWNERS"  # not TFNB_*: tests start subprocesses with environments stripped of those
GRACE = float(os.environ.get("LEAKCHECK_GRACE", "30"))  # seconds a process may take to end after its test

_TOKEN = f"{os.getpid()}-{secrets.token_hex(4)}"
_TENSORBOARD = re.compile(r"(^|/)tensorboard(\.main)?$")


@dataclass(frozen=True)
class Proc:
    """A process of one of the checked kinds. ``state`` of a standby: warm, importing or starting."""

    pid: int
    ppid: int
    start: int  # clock ticks after boot: with the pid, names one process even once the pid is reused
    argv: tuple[str, ...]
    kind: str
    state: str = ""

    def __str__(self) -> str:
        cmd = " ".join(self.argv).replace("\n", "\\n")
        return f"{self.kind:<19} pid {self.pid:<7} {cmd[:400]}{' ...' if len(cmd) > 400 else ''}"


def _read(path: str) -> bytes:
    """A /proc file's bytes: os.read, a quarter of Path.read_bytes' time (read for every process, twice a test)."""
    fd, chunks = os.open(path, os.O_RDONLY), []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state letter, start time) of a process, None once it is gone."""
    try:
        fields = _read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()
        return int(fields[1]), fields[0].decode(), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _argv(pid: int) -> tuple[str, ...]:
    try:
        raw = _read(f"/proc/{pid}/cmdline")
    except OSError:
        return ()
    return tuple(a.decode(errors="replace") for a in raw.split(b"\0")[:-1])


def _kind(argv: tuple[str, ...]) -> str | None:
    if not argv:
        return None
    joined = " ".join(argv)
    if "tfnb._task.warm" in argv:
        return "warm"
    if "tfnb._task.child" in joined:  # python -c "...import tfnb._task.child..." WORKDIR
        return TRAIN_FN
    if "pyspark.daemon" in argv or "pyspark.worker" in argv:
        return SPARK_PYTHON
    if os.path.basename(argv[0]).startswith("java") and "org.apache.spark" in joined:
        return SPARK_JVM
    if os.path.basename(argv[0]) == "rclone":
        return RCLONE
    if "moto.server" in argv:
        return MOTO
    if "mlflow" in (os.path.basename(a) for a in argv[:3]) or "mlflow.server" in joined:
        return MLFLOW
    if any(_TENSORBOARD.search(a) for a in argv[:3]):
        return TENSORBOARD
    return None


def _standby_state(argv: tuple[str, ...]) -> str:
    """warm / importing while the standby's socket is there (see tfnb/_task/warm.py), else starting or ending."""
    path = argv[argv.index("tfnb._task.warm") + 1]
    return "warm" if os.path.exists(path) else "importing" if os.path.exists(path + ".part") else "starting/ending"


def _carries_token(pid: int) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    prefix = OWNERS.encode() + b"="
    return any(e.startswith(prefix) and _TOKEN.encode() in e[len(prefix):].split(b",") for e in env)


def _table() -> dict[int, tuple[int, str, int]]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None and st[1] not in "ZX":
            out[int(name)] = st
    return out


def _ancestors(pid: int, table: dict) -> list[int]:
    chain = []
    while pid in table and pid > 1 and len(chain) < 256:
        pid = table[pid][0]
        chain.append(pid)
    return chain


# (pid, start) of the processes of a checked kind seen so far: (command line, kind, carries the token). Such a
# process never executes another program, so neither changes; reading them once per process, not once per test and
# process, halves the cost of a check.
_known: dict[tuple[int, int], tuple[tuple[str, ...], str, bool]] = {}


def _classify(pid: int, start: int, me: int) -> tuple[tuple[str, ...], str | None, bool]:
    if (seen := _known.get((pid, start))) is not None:
        return seen
    if pid == me:
        return (), None, False
    kind = _kind(argv := _argv(pid))
    if not kind:  # checked again next time: a process may still execute one of the checked kinds
        return argv, None, False
    _known[(pid, start)] = argv, kind, _carries_token(pid)
    return _known[(pid, start)]


def processes(table: dict | None = None) -> list[Proc]:
    """This test process's processes of the checked kinds, idle standbys included (:data:`STANDBY`); ``table``: a
    :func:`_table` just taken."""
    me, table = os.getpid(), _table() if table is None else table
    for gone in [k for k in _known if k[0] not in table or table[k[0]][2] != k[1]]:
        del _known[gone]
    found: dict[int, Proc] = {}
    for pid, (ppid, _state, start) in table.items():
        argv, kind, token = _classify(pid, start, me)
        if kind and (me in _ancestors(pid, table) or token):
            found[pid] = Proc(pid, ppid, start, argv, kind)
    for pid, p in list(found.items()):
        if p.kind == "warm":  # the standby, or a train_fn process it forked (which keeps its command line)
            forked = "tfnb._task.warm" in _argv(p.ppid) or _named_train_fn(pid)
            found[pid] = Proc(pid, p.ppid, p.start, p.argv, TRAIN_FN if forked else STANDBY,
                              "" if forked else _standby_state(p.argv))
    return list(found.values())


def _named_train_fn(pid: int) -> bool:
    """Whether the process named itself as a train_fn process forked from a standby (tfnb._task.warm's ``TRAIN_FN``
    in ``/proc/PID/comm``): it keeps the standby's command line, and its parent may be gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "tfnb-train_fn"
    except OSError:
        return False


def wait_gone(procs, timeout: float) -> list[Proc]:
    """Those of ``procs`` still running after up to ``timeout`` seconds; wakes as each one ends (pidfds)."""
    fds: dict[int, Proc] = {}
    for p in procs:
        try:
            fd = os.pidfd_open(p.pid)
        except ProcessLookupError:
            continue
        st = _stat(p.pid)
        if st is None or st[2] != p.start or st[1] in "ZX":  # ended, or the pid now names another process
            os.close(fd)
        else:
            fds[fd] = p
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)  # a pidfd turns readable when its process ends
    deadline = time.monotonic() + timeout
    try:
        while fds and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(left * 1000):
                poller.unregister(fd)
                os.close(fd)
                del fds[fd]
        return list(fds.values())
    finally:
        for fd in fds:
            os.close(fd)


def _kill(procs) -> None:
    for p in procs:
        st = _stat(p.pid)
        if st is not None and st[2] == p.start:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    wait_gone(procs, 10)


def report(what: str, procs) -> str:
    lines = "\n".join(f"  {p}" for p in sorted(procs, key=lambda p: (p.kind, p.pid)))
    return (f"{what} left {len(procs)} process(es) running (ended now with SIGKILL):\n{lines}\n"
            "Stop what a test starts before it ends, or start it in a module- or session-scoped fixture "
            "(tests/leakcheck.py).")


# ---------------------------------------------------------------- what may outlive a test

_by_fixture: dict[tuple[int, int], str] = {}  # (pid, start) of processes wider-scoped fixtures started
_standbys_seen: set[tuple[int, int]] = set()


def _spark() -> tuple[int | None, bool]:
    """The pyspark gateway JVM's pid, and whether a SparkContext is active."""
    if "pyspark" not in sys.modules:
        return None, False
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    return getattr(proc, "pid", None), SparkContext._active_spark_context is not None


def _allowed(p: Proc, table: dict, gateway: int | None, active: bool) -> bool:
    if p.kind == TRAIN_FN:
        return False
    if p.pid == gateway or (active and gateway in _ancestors(p.pid, table)):
        return True
    lineage = [p.pid, *_ancestors(p.pid, table)]
    return any((pid, table[pid][2]) in _by_fixture for pid in lineage if pid in table)


def pytest_configure(config):
    # In the hook, not at import: Spark's Python workers import this module too (through conftest.py)
    os.environ[OWNERS] = ",".join(filter(None, [os.environ.get(OWNERS), _TOKEN]))


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.scope == "function":
        return (yield)
    me, before = os.getpid(), set(_table())
    try:
        return (yield)
    finally:
        table = _table()
        for pid in set(table) - before:
            if me in _ancestors(pid, table):
                _by_fixture[(pid, table[pid][2])] = fixturedef.argname


@pytest.fixture(autouse=True)
def leak_check(request):
    """Fails the test (at teardown) when a process it started outlives it; see the module docstring."""
    before = {(p.pid, p.start) for p in processes()}
    yield
    table, (gateway, active) = _table(), _spark()
    now = processes(table)
    suspects = [p for p in now if (p.pid, p.start) not in before and p.kind != STANDBY
                and not _allowed(p, table, gateway, active)]
    if suspects:
        still = {p.pid for p in wait_gone(suspects, GRACE)}
        # judge what is left as it is now
        now = processes()
        suspects = [p for p in now if p.pid in still and p.kind != STANDBY]
    standbys = [p for p in now if p.kind == STANDBY and (p.pid, p.start) not in before]
    if standbys:
        _standbys_seen.update((p.pid, p.start) for p in standbys if "tfnb._task.warm" in p.argv)
        request.node.add_report_section("teardown", "leakcheck", "idle warm standbys left for the next run "
                                        "(by design; checked at the end of the session):\n"
                                        + "\n".join(f"  {p} [{p.state}]" for p in standbys))
    if suspects:
        _kill(suspects)
        pytest.fail(report(request.node.nodeid, suspects), pytrace=False)


_from_workers: list[dict] = []  # under pytest-xdist, in the controller: each worker's end of session


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    if out := getattr(node, "workeroutput", {}).get("leakcheck"):
        _from_workers.append(out)


def _session_end(worker: str | None) -> dict:
    """This test process's check at the end of the session: what is left is reported, then killed."""
    gateway, _ = _spark()
    wait_gone([p for p in processes() if p.pid != gateway], GRACE)
    left = [p for p in processes() if p.pid != gateway]
    lines = []
    if left:
        lines.append(report(f"the session (worker {worker})" if worker else "the session", left))
        lines += [f"  (pid {p.pid} was started while fixture {fixture!r} was set up)"
                  for p in left if (fixture := _by_fixture.get((p.pid, p.start)))]
        _kill(left)
    return {"standbys": len(_standbys_seen), "outlived": any(p.kind == STANDBY for p in left), "left": lines}


@pytest.hookimpl(trylast=True)  # after conftest.py's, which stops the shared Spark session
def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if config.pluginmanager.has_plugin("dsession"):
        ends = _from_workers  # the pytest-xdist controller runs no test: each worker checked its own
    else:
        # the worker's id from xdist, not PYTEST_XDIST_WORKER: a pytest started by a test inherits that
        ends = [_session_end(getattr(config, "workerinput", {}).get("workerid"))]
        if hasattr(config, "workeroutput"):  # a pytest-xdist worker: the controller reports and fails the run
            config.workeroutput["leakcheck"] = ends[0]
            return
    standbys, left = sum(e["standbys"] for e in ends), [line for e in ends for line in e["left"]]
    tr = config.pluginmanager.get_plugin("terminalreporter")
    write = tr.write_line if tr is not None else print
    if (standbys or left) and tr is not None:
        tr.write("\n")  # after the progress dots
    if standbys:
        write(f"leakcheck: {standbys} idle warm standby(s) were left between tests (by design); "
              + ("some outlived the session, see below" if any(e["outlived"] for e in ends)
                 else "all ended with the Spark session"))
    for line in left:
        write(line)
    if left:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
