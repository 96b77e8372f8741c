"""The launcher's verdicts: what a failure was, in one readable line, and whether a relaunch can help.

A task that raised is a bug; a dead process or executor, or a lost peer, is bad luck (relaunch). What fails alike
everywhere (tfnb or the executor's Python cannot start, a refused resource profile) is one error naming the fix.
"""
from __future__ import annotations

import errno
import importlib
import itertools
import json
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from traceback import format_exc
from typing import Any

from .._protocol import VERSION
from ..errors import STALLED, ClusterError, TaskFailure

# Spark's words for a task whose executor (_EXECUTOR_LOST: or Python worker) went away, as opposed to one that raised
_GONE = r"ExecutorLostFailure|executor \S+ (was )?lost|Executor heartbeat timed out|Remote RPC client disassociated"
_EXECUTOR_GONE = re.compile(_GONE, re.IGNORECASE)
_EXECUTOR_LOST = re.compile(_GONE + r"|Python worker exited unexpectedly|worker lost", re.IGNORECASE)


def _spark_failure(exc: BaseException, attempt: int) -> TaskFailure:
    """A TaskFailure for a job that failed without a task's report (a lost executor, a passing failure at start)."""
    text = str(exc).strip()
    first = next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
    info = _boot_info(text)
    if info and _passing(info):
        first = (f"the Spark task on executor {info.get('host') or '?'} could not start: {info['exc_type']}: "
                 f"{info.get('message') or _passing(info)[0]}")
    elif first.startswith("An error occurred while calling") and _TRACEBACK in text:  # Py4J's words: Python's say more
        said = _raised(text[text.find(_TRACEBACK):])
        first = f"Spark's Python worker raised {said}" if said else first
    return TaskFailure(job_name="spark", task_index=-1, exc_type="TaskLost",
                       message=first[:500], traceback="", attempt=attempt)


# ---------------------------------------------------------------- failures at start that repeat
# Out of memory, file handles or disk at start: a relaunch may well start. The same failure on two launches in a row
# (of the run on this thread) fails on every launch: the second stops the run. Each launch's _Outcome closes its record.
_PASSING = {  # errno -> (what it is, the fix)
    errno.ENOMEM: ("out of memory", "give the executors more memory, or fewer tasks per executor"),
    errno.EMFILE: ("too many open files", "raise the executors' open-files limit (ulimit -n; LimitNOFILE)"),
    errno.ENFILE: ("too many open files on the host", "raise the host's open-files limit (fs.file-max)"),
    errno.EIO: ("an I/O error", "check the executor's disk, or the file system its Python is installed on"),
    errno.ENOSPC: ("no space left on the device", "free space where the executor writes (spark.local.dir, /tmp)"),
    errno.EAGAIN: ("a resource temporarily unavailable", "raise the executors' process limit (ulimit -u)"),
}
_ERRNO = re.compile(r"^\[Errno (\d+)\]")
_REPEAT_WINDOW = 600.0  # seconds: an identical failure at start on the run's launch before this one


class _Repeats(threading.local):
    def __init__(self):
        self.now, self.before = set(), set()  # failures at start seen in the launch being decided, in the one before
        self.when = 0.0
        self.crashed = False  # Spark's Python worker crashed in the launch being decided


_repeats = _Repeats()


def _repeated(signature: tuple) -> bool:
    """Whether this failure at start ended the launch before this one too; remembers it for the next."""
    again = signature in _repeats.before and time.monotonic() - _repeats.when < _REPEAT_WINDOW
    _repeats.now.add(signature)
    return again


def _relaunch_once(source: str, info: dict) -> dict | None:
    """None for a passing failure at start met the first time (relaunch); else ``info``, marked ``repeated`` when
    it ended the launch before too (:func:`_repeated` of its errno and the start-up step it failed at)."""
    if not _passing(info):
        return info
    m = _ERRNO.match(str(info.get("message") or ""))
    frames = re.findall(r'File "[^"]*", line \d+,? in \S+', info.get("traceback") or "")  # where in the start-up
    again = _repeated((source, info.get("exc_type"), m.group(1) if m else "", frames[-1] if frames else ""))
    return {**info, "repeated": True} if again else None


def _raised(traceback: str) -> str:
    """The exception line a Python traceback ends with (``OSError: [Errno 24] Too many open files``), or ''."""
    for line in traceback.splitlines()[1:]:
        if line and not line[0].isspace() and re.match(r"[\w.]+(: |$)", line):
            return line.strip()[:300]
    return ""


def _passing(info: dict) -> tuple[str, str] | None:
    """(what it is, the fix) for a failure at start a relaunch may not meet again; None otherwise."""
    kind = str(info.get("exc_type") or "").rpartition(".")[2]
    if kind == "MemoryError":
        return _PASSING[errno.ENOMEM]
    m = _ERRNO.match(str(info.get("message") or ""))
    return _PASSING.get(int(m.group(1))) if m and kind.endswith("Error") else None


_INSTALL_FIX = ("on Databricks %pip install it in the notebook (as the tfnb notebooks' tfnb_install() does) or add "
                "it as a cluster library; elsewhere install it into the Python the executors run (PYSPARK_PYTHON)")


def _boot_info(text: str) -> dict | None:
    """What tfnb._task.entry.task_entry reported of a task that could not start tfnb, from Spark's error."""
    from .._task.entry import BOOT_MARK

    m = re.search(f"<{BOOT_MARK}>(.*?)</{BOOT_MARK}>", text)
    try:
        return json.loads(m.group(1)) if m else None
    except ValueError:
        return None


def _boot_report(text: str) -> dict | None:
    """A task that could not start tfnb, or a Python that failed before it (the driver's or Spark's worker), from
    Spark's error; None for a passing reason the first time (relaunch)."""
    info = _boot_info(text)
    return (_driver_report(text) or _worker_report(text)) if info is None else _relaunch_once("boot", info)


def _boot_error(info: dict, max_attempts: int) -> ClusterError:
    """One error for an executor where tfnb cannot start: where, what, that it was not relaunched, the fix."""
    if _passing(info):  # out of memory, file handles, disk: what it is, not a missing install
        return _passing_error(info, max_attempts)
    if info.get("exc_type") and not info.get("module") and _imports(info.get("exc_type")):
        info = {**info, "module": _culprit(str(info.get("traceback") or ""))}  # raised inside another package
    if info.get("spark") or (info.get("exc_type") and (info.get("module") or "tfnb").split(".")[0] != "tfnb"):
        return _python_error(info, max_attempts)  # the executor's Python cannot run the task, whatever its tfnb
    where = (f"executor {info.get('host') or '?'} (Python {info.get('python_version', '?')} at "
             f"{info.get('python', '?')})")
    again = f"It would fail alike on every launch, so tfnb did not relaunch it (max_attempts={max_attempts})"
    if info.get("exc_type"):
        module = info.get("module") or "tfnb"
        who = "the train_fn process" if info.get("child") else "the Spark task"
        message, _, rest = str(info.get("message", "")).strip().partition("\n")
        text = (f"{who} on {where} cannot import {module}: {info['exc_type']}: {message}; install {module} where "
                f"that Python finds it\n{rest.strip() + chr(10) if rest.strip() else ''}{again}. To install it: "
                f"{_INSTALL_FIX}.")
    else:
        text = (f"tfnb {info.get('version')} on {where} but tfnb {VERSION} on this driver, so the run was "
                f"refused before any train_fn started; install tfnb {VERSION} there\n"
                f"{again}. Install tfnb {VERSION} on the executors too: {_INSTALL_FIX}.")
    return _with_traceback(text, info)


def _with_traceback(text: str, info: dict, every_launch: bool = True) -> ClusterError:
    """The error with the traceback's last lines below it; ``every_launch``: tfnb.sweep stops at it."""
    tail = "".join(str(info.get("traceback") or "").splitlines(True)[-12:]).rstrip()
    where = "the driver's" if info.get("driver") else "the executor's"
    error = ClusterError(text + (f"\n\nLast lines of {where} traceback:\n{tail}" if tail else ""))
    error.every_launch = every_launch
    return error


def _passing_error(info: dict, max_attempts: int) -> ClusterError:
    what, fix = _passing(info)
    who = "the train_fn process" if info.get("child") else "Spark's Python worker" if info.get("spark") else \
        "the Spark task"
    where = f"executor {info.get('host') or '?'}"
    said = f"{info.get('exc_type')}: {' '.join(str(info.get('message') or '').split())}".rstrip(": ")
    failed = "failed" if info.get("spark") else "could not start"  # Spark's own worker: before or around tfnb's task
    if info.get("repeated"):
        first = f"{who} on {where} {failed}, {what} ({said[:80]}), on two launches in a row; {fix}"
        again = ("It failed the same way on the launch before, so tfnb stopped relaunching "
                 f"(max_attempts={max_attempts}).")
    else:
        first = f"{who} on {where} could not start, {what} ({said[:80]}); {fix}, then run again"
        again = f"tfnb did not relaunch it (max_attempts={max_attempts}); run again once the executor has recovered."
    said_by = f"{who} on {where} {failed}: {said}"
    return _with_traceback("\n".join([first, "", said_by, again]), info, every_launch=bool(info.get("repeated")))


# Spark's Python worker failed before tfnb's task ran: it raised loading the task (a traceback without tfnb's frames)
# or could not start ("Error from python worker:", its stderr). The same on every launch.
_TRACEBACK = "Traceback (most recent call last):"
_TRACEBACK_END = ("\tat ", " SQLSTATE", "PYTHONPATH was:", "org.apache.spark.", "JVM stacktrace")
_LOADING = re.compile(r", in (read_udfs|read_command|read_udtf|check_python_version)$", re.M)
_MISMATCH = re.compile(r"different version:? (\d+\.\d+) than that in driver:? (\d+\.\d+)")  # PYTHON_VERSION_MISMATCH
_MISSING = re.compile(r"No module named '([\w.]+)'|cannot import name '\w+' from '([\w.]+)'")
_LOST_TASK = re.compile(r"Lost task [\d.]+ in stage [\d.]+ \(TID \d+\) \((\S+) executor [^)]+\)")
_PROBE_WAIT = 20.0  # seconds the executors get to say which Python they run; the error goes without it after


def _imports(exc_type: Any) -> bool:
    return str(exc_type or "").rpartition(".")[2] in ("ImportError", "ModuleNotFoundError")


def _culprit(traceback: str) -> str | None:
    """The installed package (not pyspark or py4j) of a traceback's innermost frame, whatever its message says."""
    for path in reversed(re.findall(r'File "([^"]+)"', traceback)):
        m = re.search(r"[/\\](?:site|dist)-packages[/\\]([A-Za-z_]\w*)", path) or \
            re.search(r"([A-Za-z_]\w*)[/\\]__init__\.py$", path)
        if m and m.group(1) not in ("pyspark", "py4j", "importlib"):
            return m.group(1)
    return None


# pyspark's own check on the driver before an Arrow job: "[PACKAGE_NOT_INSTALLED] PyArrow >= 18.0.0 must be
# installed; however, it was not found." (also when it is installed but its import fails)
_DRIVER_PACKAGE = re.compile(r"\[PACKAGE_NOT_INSTALLED\] (\w+) >= ([\w.]+) must be installed")
# Spark's Python worker died (a segfault, the OOM killer), as opposed to its executor
_WORKER_CRASH = re.compile(r"Python worker exited unexpectedly \(crashed\)")
_CRASH_END = ("\tat ", "Caused by:", "JVM stacktrace", "\t...")  # what follows its message in Spark's text


def _driver_report(text: str) -> dict | None:
    """pyspark says the driver lacks a package it needs (pyarrow: even when its import fails): that import's error."""
    m = _DRIVER_PACKAGE.search(text)
    if not m or _TRACEBACK in text:
        return None
    module = m.group(1).lower()
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - what fails is the answer
        return {"spark": True, "driver": True, "exc_type": type(e).__name__, "message": str(e)[:1000],
                "module": module, "needed": f"{module} >= {m.group(2)}", "host": "the driver",
                "python": sys.executable, "python_version": sys.version.split()[0],
                "traceback": "".join(format_exc().splitlines(True)[-8:])}
    return None  # it imports here: pyspark's message was about something else


def _crash_report(text: str) -> dict | None:
    """Spark's Python worker crashed (not its executor): None the first time (relaunch), a boot report the second."""
    m = _WORKER_CRASH.search(text)
    if not m or _EXECUTOR_GONE.search(text):
        return None
    said = "\n".join(itertools.takewhile(lambda line: not line.startswith(_CRASH_END) and " SQLSTATE" not in line,
                                         text[m.start():].splitlines())).strip()
    signature = ("crash", re.sub(r"0x[0-9a-fA-F]+", "0x", re.sub(r" Consider setting .*", "", said)))
    _repeats.crashed = True
    if not _repeated(signature):
        return None
    return {"spark": True, "crash": True, "exc_type": "crash", "message": said.splitlines()[0][:300],
            "traceback": said.partition("\n")[2].strip()}


def _worker_report(text: str) -> dict | None:
    """Why Spark's Python worker failed before tfnb's task ran, as a boot report with ``spark``: True; None when
    tfnb's code ran or no Python failure is in the text."""
    if _WORKER_CRASH.search(text):
        return _crash_report(text)
    start = text.find(_TRACEBACK)
    if start < 0 or _EXECUTOR_LOST.search(text):
        return None
    starting = "Error from python worker:" in text[:start]  # its stderr, each line indented by two spaces
    ended = itertools.takewhile(lambda line: not line.startswith(_TRACEBACK_END), text[start:].splitlines())
    lines = [line[2:] if starting and line.startswith("  ") else line for line in ended]
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    if not frames or any(line.endswith(", in tfnb_task") for line in lines):
        return None  # tfnb's task ran: it reported over the channel, or in its <tfnb-boot> mark
    after = lines[frames[-1] + 1:]
    head = next((i for i, line in enumerate(after) if line and not line[0].isspace()), None)
    if head is None:
        return None
    exc_type, _, first = after[head].partition(": ")
    message = "\n".join([first, *after[head + 1:]]).strip()
    mismatch, missing = _MISMATCH.search(message), _MISSING.search(message)
    # an ImportError before tfnb's task ran: Spark's worker loading what the task needs (pyarrow, say)
    imported = _imports(exc_type)
    passing = _passing({"exc_type": exc_type, "message": message})  # out of memory, file handles, disk
    if not (starting or mismatch or missing or imported or passing or _LOADING.search("\n".join(lines))):
        return None  # raised while the task ran (Spark's side of the Arrow stream, say): not the executor's Python
    module = (missing.group(1) or missing.group(2)) if missing else _culprit("\n".join(lines)) if imported else None
    info = {"spark": True, "exc_type": exc_type, "message": message[:1000],
            "traceback": "\n".join(lines[-12:]), "module": module}
    if mismatch:
        info.update(python_version=mismatch.group(1), driver_version=mismatch.group(2))
    if found := re.findall(r'File "(.*?/pyspark)/', "\n".join(lines)):
        info["pyspark"] = found[-1]
    if lost := _LOST_TASK.search(text):
        info["host"] = lost.group(1)
    return _relaunch_once("worker", info)


def _locate(spark, info: dict | None, tasks: int) -> dict | None:
    """``info`` of a Spark Python worker failure with its host and Python filled in by a small job of plain Python
    tasks (at most ``_PROBE_WAIT`` s); where it fails too, the host Spark's error names, and PYSPARK_PYTHON."""
    if not info or not info.get("spark") or info.get("python"):
        return info
    from .spark import is_connect, interrupt_jobs, job_tag

    connect = is_connect(spark)
    info = {**info, "spark_version": getattr(spark, "version", None)}
    module = info["module"] if info.get("module") and info["module"].split(".")[0] not in ("pyspark", "py4j") else None
    got, tag = {}, f"tfnb-probe-{uuid.uuid4().hex[:8]}"

    def ask(_):  # plain imports, shipped by value: runs on any Python a Spark worker starts on (no pyarrow, no tfnb)
        import contextlib
        import importlib.metadata
        import socket
        import sys

        lacks = version = ""
        try:
            if module:
                importlib.import_module(module)
        except BaseException as e:  # noqa: BLE001 - what fails is the answer
            lacks = f"{type(e).__name__}: {e}"
            with contextlib.suppress(Exception):  # the installed distribution's version (none: not installed)
                version = importlib.metadata.version(module)
        try:  # the host as Spark names it, as tfnb's task reports it
            from pyspark import BarrierTaskContext

            ctx = BarrierTaskContext.get()
            host = ctx.getTaskInfos()[ctx.partitionId()].address.rsplit(":", 1)[0]
        except Exception:  # noqa: BLE001 - not a barrier task (Spark Connect)
            host = socket.gethostname()
        return [host, sys.executable, sys.version.split()[0], lacks, version]

    def probe():
        try:
            with job_tag(spark, tag):
                if connect:  # no RDDs: a plain (pickled, not Arrow) Python UDF
                    from pyspark.sql.functions import udf

                    column = udf(ask, "array<string>", useArrow=False)("id")
                    got["rows"] = [r[0] for r in spark.range(0, tasks, 1, tasks).select(column).collect()]
                else:
                    rdd = spark.sparkContext.parallelize(range(tasks), tasks).barrier()
                    got["rows"] = rdd.mapPartitions(lambda _: [ask(None)]).collect()
        except Exception as e:  # noqa: BLE001 - its failure text still names the host
            # pyspark raises the Python worker's part alone; Spark's own text (the host) is its context
            got["error"] = "\n".join(str(x) for x in (e, e.__context__) if x is not None)

    thread = threading.Thread(target=probe, name="tfnb-probe", daemon=True)
    thread.start()
    thread.join(_PROBE_WAIT)
    if thread.is_alive():
        interrupt_jobs(spark, tag)
    rows = got.get("rows")
    if rows:  # the executor that lacks the module, else any
        host, python, version, _, installed = next((r for r in rows if r[3]), rows[0])
        return {**info, "host": host, "python": python, "python_version": version,
                **({"installed": installed} if installed else {})}
    if (lost := _LOST_TASK.search(got.get("error", ""))) and not info.get("host"):
        info["host"] = lost.group(1)
    if not connect:  # the executors Spark knows (the driver too, the one executor of a local master)
        info["python"] = spark.sparkContext.pythonExec
        hosts = {e.host() for e in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()}
        others = sorted(hosts - {spark.conf.get("spark.driver.host", None)}) or sorted(hosts)
        if others and not info.get("host"):
            info["host"] = ", ".join(others[:3]) + (f" (and {len(others) - 3} more)" if len(others) > 3 else "")
    return info


def _python_error(info: dict, max_attempts: int) -> ClusterError:
    """One error for an executor Python that cannot run tfnb's task (or a driver's that cannot submit it)."""
    host, version, python = info.get("host"), info.get("python_version"), info.get("python")
    where = "the driver" if info.get("driver") else \
        f"executor{'s' if ',' in (host or '') else ''} {host}" if host else "an executor"
    its = f"{where}'s Python{' ' + version if version else ''}"
    driver = info.get("driver_version") or "%d.%d" % sys.version_info[:2]
    exc, message = info.get("exc_type") or "Error", str(info.get("message", "")).strip()
    said = f"{exc.rpartition('.')[2]}: {' '.join(message.split())}"
    module = (info.get("module") or "").split(".")[0]
    absent = bool(module) and re.search(rf"No module named '{re.escape(module)}[.']", message) is not None
    pyspark = f"pyspark {info['spark_version']}" if info.get("spark_version") else "the cluster's pyspark"
    ready = f"a Python {driver} with pyarrow, cloudpickle and tfnb"
    again = f"It would fail alike on every launch, so tfnb did not relaunch it (max_attempts={max_attempts})."
    if info.get("crash"):
        first = (f"Spark's Python worker on {where} crashed the same way on two launches in a row; a crash that "
                 "repeats is no lost executor: check the native libraries that Python loads")
        fix = ("A crash is the process dying (a segfault in a native library, the kernel's OOM killer), not an "
               "exception: set spark.python.worker.faulthandler.enabled and "
               "spark.sql.execution.pyspark.udf.faulthandler.enabled to true in the cluster's Spark conf to see where "
               "it crashes, and check what that Python imports (a pyarrow, NumPy or TensorFlow built for another "
               "NumPy or CPU).")
        again = ("It crashed the same way on the launch before, so tfnb stopped relaunching "
                 f"(max_attempts={max_attempts}).")
    elif info.get("driver_version"):
        first = (f"{where} runs Python {version} but the driver {driver}, and PySpark refuses to mix minor versions; "
                 f"set PYSPARK_PYTHON / spark.pyspark.python to a Python {driver}")
        fix = (f"cloudpickle, which carries train_fn to the executors and its result back, cannot cross minor "
               f"versions either. Point PYSPARK_PYTHON (in the driver's environment, before the session starts) or "
               f"spark.pyspark.python (the cluster's Spark conf) at {ready} on every executor, or run the driver "
               f"on Python {version}.")
    elif module and module not in ("pyspark", "py4j") and not absent:  # installed, but its import fails
        numpy = re.search(r"NumPy ([\d.]+) or newer, found ([\d.]+)", message)
        installed = f" {info['installed']}" if info.get("installed") else ""
        if numpy:
            need, found = numpy.groups()
            earlier = (f"pip install '{module}<{info['installed'].split('.')[0]}'" if info.get("installed") else
                       f"an earlier {module}")
            first = f"{its} cannot import {module} ({said[:100]}); install NumPy >= {need} there, or {earlier}"
            fix = (f"{module}{installed} there needs NumPy {need} or newer and that Python has NumPy {found}"
                   + (" (pyarrow does not list NumPy among its dependencies, so pip leaves the two apart: "
                      "pip install tensorflow==2.16 pins NumPy below 2 and keeps a newer pyarrow)"
                      if module == "pyarrow" else "") +
                   f". Install NumPy >= {need} where nothing pins it lower, or a {module} that supports NumPy {found} "
                   f"({earlier}).")
        else:
            first = (f"{its} cannot import {module} ({said[:100]}); reinstall {module} there, or fix what its error "
                     "names")
            fix = (f"{module}{installed} is installed there but its import fails with the error above: fix what it "
                   f"names, or reinstall it (pip install --force-reinstall {module}).")
        fix += (" This is the driver's own Python (the one this notebook runs); the executors need the same fix if "
                "they run it too (PYSPARK_PYTHON)." if info.get("driver") else
                f" To install: {_INSTALL_FIX}; or point PYSPARK_PYTHON / spark.pyspark.python at {ready} on every "
                "executor.")
    elif module and module not in ("pyspark", "py4j"):
        need = f" ({info['needed']})" if info.get("needed") else ""
        first = (f"{its} lacks {module}, which tfnb's task needs{need}; install it there, or set PYSPARK_PYTHON / "
                 "spark.pyspark.python to a Python that has it") if not info.get("driver") else \
            (f"{its} lacks {module}, which pyspark needs to submit tfnb's job{need}; install it into the Python this "
             "notebook runs")
        fix = (f"Install {module} where that Python finds it: {_INSTALL_FIX}; or point PYSPARK_PYTHON / "
               f"spark.pyspark.python at {ready} on every executor.")
    elif module or info.get("pyspark"):
        first = (f"{its} has a broken pyspark ({said[:90]}); reinstall {pyspark} there, or remove the pyspark that "
                 "shadows Spark's own")
        fix = (f"Spark's Python worker imports pyspark{' from ' + info['pyspark'] if info.get('pyspark') else ''}. "
               "Spark puts its own (SPARK_HOME/python/lib/pyspark.zip) first on the worker's PYTHONPATH: a pyspark "
               "found before it (a .pth file or sitecustomize that prepends a folder), or a damaged install, breaks "
               f"every task. Remove it, or reinstall {pyspark} into the Python the executors run; on Databricks do "
               "not %pip install pyspark (the runtime brings its own).")
    else:
        first = (f"Spark's Python worker on {where} failed before tfnb's task started ({said[:90]}); check the "
                 "Python the executors run (PYSPARK_PYTHON / spark.pyspark.python)")
        fix = f"The executors need {ready} and {pyspark}: point PYSPARK_PYTHON / spark.pyspark.python at one."
    said_by = (f"Spark's Python worker on {where} crashed:" if info.get("crash") else
               f"pyspark checks {info.get('needed') or module} on the driver before it submits tfnb's job, and there "
               f"`import {module}` fails:" if info.get("driver") else
               f"Spark's Python worker on {where} failed before tfnb's task started:" if info.get("spark") else
               f"tfnb's task on {where} could not start:")
    lines = [first, "", said_by, message if info.get("crash") else f"{exc}: {message}"]
    if python:
        lines.append(f"The {'driver' if info.get('driver') else 'executors'}' Python: {python}"
                     f"{f' (Python {version})' if version else ''}.".replace("driver' ", "driver's "))
    lines += [again, fix]
    return _with_traceback("\n".join(lines), info)


def _cause(failure: TaskFailure, retryable: bool, epoch: int | None) -> str:
    """One line for the progress panel, the status file and the error: who, what, when."""
    label = failure.label
    if failure.exc_type == "ExecutorLost" and _repeats.crashed:  # the task's Python worker, not its executor
        who = f"{label}'s" if failure.task_index >= 0 else "a task's"
        text = f"{who} Spark Python worker crashed (Python worker exited unexpectedly)"
    elif failure.exc_type == "ExecutorLost":
        text = f"{label}'s executor lost" if failure.task_index >= 0 else f"executor lost ({failure.message})"
    elif failure.exc_type == "ProcessDied":
        # "the train_fn process ...", "the TensorFlow server process ...", "the ps process on the driver ..."
        m = re.match(r"the (?:ps )?((?:train_fn |TensorFlow server )?process(?: on the driver)?) (.*)", failure.message,
                     re.S)
        who, rest = (m.group(1), m.group(2)) if m else ("train_fn process", failure.message)
        text = f"{label}'s {who} {re.split(r' without | [(]| before ', rest)[0]}"
    elif failure.exc_type == STALLED:
        text = f"{label} stalled, {failure.message.split(' (')[0]}"
    elif failure.exc_type == "TaskLost":
        text = f"the Spark job failed ({failure.message})"
    else:
        short = failure.exc_type.rpartition(".")[2]
        first = (failure.message.strip().splitlines() or [""])[0][:200]
        text = f"{label} lost a peer ({short}: {first})" if retryable else f"{label} raised {short}: {first}"
    return text + (f" at epoch {epoch}" if epoch is not None else "")


def _refusal_error(said: str, worker_profile: bool) -> ClusterError:
    """Spark refused the run's task resource profile at submission (Spark Connect: tfnb cannot ask before); every run
    asking for it meets the same refusal."""
    fix = ("leave gpus_per_worker and cpus_per_worker out and set spark.task.resource.gpu.amount and "
           "spark.task.cpus in the cluster's Spark conf instead" if worker_profile else
           "pass ps_placement='driver' to run the ps tasks on the driver")
    return _with_traceback(f"Spark refused the run's task resource profile ({said}); {fix} (docs/resources.md)", {})


@dataclass(frozen=True)
class _Outcome:
    value: Any = None
    failure: TaskFailure | None = None
    others: tuple = ()
    retryable: bool = False
    cause: str = ""          # one readable line: who failed how, and at which epoch
    epoch: int | None = None  # the epoch the run had reached when it failed
    resumed_epoch: int | None = None  # the first epoch this attempt trained
    stall: dict | None = None  # WorkerStalledError's fields when a task stalled
    error: Exception | None = None  # raised as it is (tfnb could not start on an executor)
    resize: bool = False  # the tasks stopped at an epoch boundary on purpose, for the run to widen

    def __post_init__(self):  # one outcome per launch: the end of its record of failures at start
        _repeats.before = set() if self.failure is None else _repeats.now
        _repeats.now, _repeats.when, _repeats.crashed = set(), time.monotonic(), False


@dataclass
class _Life:
    """What the driver last heard from one task (for the stall watchdog and relaunch reasons)."""

    job_name: str
    task_index: int
    host: str = ""
    seen: float = field(default_factory=time.monotonic)  # last message of any kind
    state: str = "starting"
    final: bool = False      # reported done, stopped or failed: its end is explained
    step: dict = field(default_factory=dict)  # last progress report's epoch/step
    first_epoch: int | None = None
    line: str = ""
    stack: str | None = None

    @property
    def label(self) -> str:
        return f"{self.job_name} {self.task_index}"

    def failure(self, exc_type: str, message: str, attempt: int, **more) -> TaskFailure:
        return TaskFailure(job_name=self.job_name, task_index=self.task_index, exc_type=exc_type, message=message,
                           attempt=attempt, host=self.host, **more)
