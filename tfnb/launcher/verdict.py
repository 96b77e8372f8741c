"""The launcher's verdicts: what a failure was, in one readable line, and whether a relaunch can help.

A task that raised is a bug (no relaunch); a task whose process or executor died, or that lost a peer,
is bad luck (relaunch); a task that could not even start tfnb, an executor Python that cannot run the task at
all (Spark's Python worker failed before tfnb's code ran: a missing pyarrow, another minor Python version, a
broken pyspark), or a resource profile Spark refused, will fail alike everywhere (no relaunch, one error naming
the host, the Python or the profile, and the fix). Also here: what an attempt ends with (``_Outcome``) and
what it last heard from each task (``_Life``).
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import STALLED, ClusterError, TaskFailure

# Spark's words for a task whose executor (or its Python worker) went away, as opposed to a task that raised.
_EXECUTOR_LOST = re.compile(r"ExecutorLostFailure|executor \S+ (was )?lost|Executor heartbeat timed out|"
                            r"Remote RPC client disassociated|Python worker exited unexpectedly|worker lost",
                            re.IGNORECASE)


def _last_line(msg: dict) -> str:
    """The last line a log message carries (one line, or a run of ``lines``)."""
    lines = msg.get("lines")
    return str(lines[-1] if lines else "") if isinstance(lines, list) else str(msg.get("line", ""))


def _spark_failure(exc: BaseException, attempt: int) -> TaskFailure:
    """A TaskFailure for a job that failed without any task reporting why (a lost executor, say)."""
    text = str(exc).strip()
    first = next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
    return TaskFailure(job_name="spark", task_index=-1, exc_type="TaskLost",
                       message=first[:500], traceback="", attempt=attempt)


_INSTALL_FIX = ("on Databricks %pip install it in the notebook (as the tfnb notebooks' tfnb_install() does) or add "
                "it as a cluster library; elsewhere install it into the Python the executors run (PYSPARK_PYTHON)")


def _boot_report(text: str) -> dict | None:
    """What tfnb._task.entry.task_entry reported from a task that could not start tfnb, found in Spark's error."""
    from .._task.entry import BOOT_MARK

    m = re.search(f"<{BOOT_MARK}>(.*?)</{BOOT_MARK}>", text)
    try:
        return json.loads(m.group(1)) if m else None
    except ValueError:
        return None


def _boot_error(info: dict, max_attempts: int) -> ClusterError:
    """One error for an executor where tfnb cannot start: where, what, that it was not relaunched, the fix."""
    from .._protocol import VERSION as __version__

    if info.get("spark") or (info.get("exc_type") and _top(info.get("module") or "tfnb") != "tfnb"):
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
        text = (f"tfnb {info.get('version')} on {where} but tfnb {__version__} on this driver, so the run was "
                f"refused before any train_fn started; install tfnb {__version__} there\n"
                f"{again}. Install tfnb {__version__} on the executors too: {_INSTALL_FIX}.")
    return _with_traceback(text, info)


def _with_traceback(text: str, info: dict) -> ClusterError:
    """The error, with the last lines of the executor's traceback below it."""
    tail = "".join(str(info.get("traceback") or "").splitlines(True)[-12:]).rstrip()
    return ClusterError(text + (f"\n\nLast lines of the executor's traceback:\n{tail}" if tail else ""))


# Spark's Python worker failed before tfnb's task function ran: it raised while loading the task (a Python
# traceback in the job's error text, without tfnb's frames), or it could not start at all ("Error from python
# worker:", its stderr). The same on every launch: the executors' Python cannot run the task.
_TRACEBACK = "Traceback (most recent call last):"
_TRACEBACK_END = ("\tat ", " SQLSTATE", "PYTHONPATH was:", "org.apache.spark.", "JVM stacktrace")
_LOADING = re.compile(r", in (read_udfs|read_command|read_udtf|check_python_version)$", re.M)
_MISMATCH = re.compile(r"different version:? (\d+\.\d+) than that in driver:? (\d+\.\d+)")  # PYTHON_VERSION_MISMATCH
_MISSING = re.compile(r"No module named '([\w.]+)'|cannot import name '\w+' from '([\w.]+)'")
_LOST_TASK = re.compile(r"Lost task [\d.]+ in stage [\d.]+ \(TID \d+\) \((\S+) executor [^)]+\)")
_PROBE_WAIT = 20.0  # seconds the executors get to say which Python they run; the error goes without it after


def _top(module: str) -> str:
    return module.split(".")[0]


def _worker_report(text: str) -> dict | None:
    """Why Spark's Python worker failed before tfnb's task ran, read from the job's error text, in the shape
    of a boot report (``spark``: True); None when tfnb's own code ran, or the text holds no Python failure
    (a lost executor, say)."""
    start = text.find(_TRACEBACK)
    if start < 0 or _EXECUTOR_LOST.search(text):
        return None
    starting = "Error from python worker:" in text[:start]  # its stderr, each line indented by two spaces
    lines = []
    for line in text[start:].splitlines():
        if line.startswith(_TRACEBACK_END):
            break
        lines.append(line[2:] if starting and line.startswith("  ") else line)
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
    if not (starting or mismatch or missing or _LOADING.search("\n".join(lines))):
        return None  # raised while the task ran (Spark's side of the Arrow stream, say): not the executor's Python
    info = {"spark": True, "exc_type": exc_type, "message": message[:1000],
            "traceback": "\n".join(lines[-12:]), "module": (missing.group(1) or missing.group(2)) if missing else None}
    if mismatch:
        info.update(python_version=mismatch.group(1), driver_version=mismatch.group(2))
    found = re.findall(r'File "(.*?/pyspark)/', "\n".join(lines))
    if found:
        info["pyspark"] = found[-1]
    lost = _LOST_TASK.search(text)
    if lost:
        info["host"] = lost.group(1)
    return info


def _locate(spark, info: dict | None, tasks: int) -> dict | None:
    """``info`` of a Spark Python worker failure with its executor's host and Python filled in. A small job of
    ``tasks`` plain Python tasks asks the executors (at most ``_PROBE_WAIT`` s): where the worker runs at all, each
    says its host, Python and whether it imports the missing module (PYSPARK_PYTHON may be a bare ``python3``, found
    on each executor's PATH). Where it cannot (another minor version, a broken pyspark), that job fails too: the
    host is the one Spark's error names, else the executors' hosts, and the Python is the one the driver tells the
    executors to run (PYSPARK_PYTHON)."""
    if not info or not info.get("spark") or info.get("python"):
        return info
    import threading
    import uuid

    from .spark import _is_connect, interrupt_jobs, job_tag

    connect = _is_connect(spark)
    info = {**info, "spark_version": getattr(spark, "version", None)}
    module = info["module"] if info.get("module") and _top(info["module"]) not in ("pyspark", "py4j") else None
    got, tag = {}, f"tfnb-probe-{uuid.uuid4().hex[:8]}"

    def ask(_):  # plain imports, shipped by value: runs on any Python a Spark worker starts on (no pyarrow, no tfnb)
        import importlib
        import socket
        import sys

        lacks = ""
        try:
            if module:
                importlib.import_module(module)
        except BaseException as e:  # noqa: BLE001 - what fails is the answer
            lacks = f"{type(e).__name__}: {e}"
        try:  # the host as Spark names it, as tfnb's task reports it
            from pyspark import BarrierTaskContext

            ctx = BarrierTaskContext.get()
            host = ctx.getTaskInfos()[ctx.partitionId()].address.rsplit(":", 1)[0]
        except Exception:  # noqa: BLE001 - not a barrier task (Spark Connect)
            host = socket.gethostname()
        return [host, sys.executable, sys.version.split()[0], lacks]

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
        host, python, version, _ = next((r for r in rows if r[3]), rows[0])
        return {**info, "host": host, "python": python, "python_version": version}
    lost = _LOST_TASK.search(got.get("error", ""))
    if lost and not info.get("host"):
        info["host"] = lost.group(1)
    if not connect:  # the executors Spark knows (the driver too, the one executor of a local master)
        info["python"] = spark.sparkContext.pythonExec
        hosts = {e.host() for e in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()}
        others = sorted(hosts - {spark.conf.get("spark.driver.host", None)}) or sorted(hosts)
        if others and not info.get("host"):
            info["host"] = ", ".join(others[:3]) + (f" (and {len(others) - 3} more)" if len(others) > 3 else "")
    return info


def _python_error(info: dict, max_attempts: int) -> ClusterError:
    """One error for an executor whose Python cannot run tfnb's task: a first line with what, where and the
    fix; below it what the executor said, the fix in full and the executor's traceback."""
    import sys

    host, version, python = info.get("host"), info.get("python_version"), info.get("python")
    where = f"executor{'s' if ',' in (host or '') else ''} {host}" if host else "an executor"
    its = f"{where}'s Python{' ' + version if version else ''}"
    driver = info.get("driver_version") or "%d.%d" % sys.version_info[:2]
    exc, message = info.get("exc_type") or "Error", str(info.get("message", "")).strip()
    said = f"{exc.rpartition('.')[2]}: {' '.join(message.split())}"
    module = _top(info.get("module") or "")
    pyspark = f"pyspark {info['spark_version']}" if info.get("spark_version") else "the cluster's pyspark"
    ready = f"a Python {driver} with pyarrow, cloudpickle and tfnb"
    if info.get("driver_version"):
        first = (f"{where} runs Python {version} but the driver {driver}, and PySpark refuses to mix minor versions; "
                 f"set PYSPARK_PYTHON / spark.pyspark.python to a Python {driver}")
        fix = (f"cloudpickle, which carries train_fn to the executors and its result back, cannot cross minor "
               f"versions either. Point PYSPARK_PYTHON (in the driver's environment, before the session starts) or "
               f"spark.pyspark.python (the cluster's Spark conf) at {ready} on every executor, or run the driver "
               f"on Python {version}.")
    elif module and module not in ("pyspark", "py4j"):
        first = (f"{its} lacks {module}, which tfnb's task needs; install it there, or set PYSPARK_PYTHON / "
                 "spark.pyspark.python to a Python that has it")
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
    who = "Spark's Python worker" if info.get("spark") else "tfnb's task"
    lines = [first, "", f"{who} on {where} failed before tfnb's task started:" if info.get("spark") else
             f"{who} on {where} could not start:", f"{exc}: {message}"]
    if python:
        lines.append(f"The executors' Python: {python}{f' (Python {version})' if version else ''}.")
    lines += [f"It would fail alike on every launch, so tfnb did not relaunch it (max_attempts={max_attempts}).", fix]
    return _with_traceback("\n".join(lines), info)


def _cause(failure: TaskFailure, retryable: bool, epoch: int | None) -> str:
    """One readable line for the progress panel, the status file and the error: who, what, when."""
    label = failure.label
    if failure.exc_type == "ExecutorLost":
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
    """Spark refused a run's task resource profile when the job was submitted (Spark Connect, where tfnb
    cannot ask before launch): the same refusal, with the fix."""
    fix = ("leave gpus_per_worker and cpus_per_worker out and set spark.task.resource.gpu.amount and "
           "spark.task.cpus in the cluster's Spark conf instead" if worker_profile else
           "pass ps_placement='driver' to run the ps tasks on the driver")
    return ClusterError(f"Spark refused the run's task resource profile ({said}); {fix} (docs/resources.md)")


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


@dataclass
class _Life:
    """What the driver last heard from one task: input of the stall watchdog and of relaunch reasons."""

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
