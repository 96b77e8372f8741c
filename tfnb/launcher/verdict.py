"""The launcher's verdicts: what a failure was, in one readable line, and whether a relaunch can help.

A task that raised is a bug (no relaunch); a task whose process or executor died, or that lost a peer,
is bad luck (relaunch); a task that could not even start tfnb, or a resource profile Spark refused, will
fail alike everywhere (no relaunch, one error naming the host or the profile, and the fix). Also here: what
an attempt ends with (``_Outcome``) and what it last heard from each task (``_Life``).
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
_PER_REPLICA = re.compile(r"Attempt to convert a value \(PerReplica")  # Keras 3 under tf.distribute


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

    where = (f"executor {info.get('host') or '?'} (Python {info.get('python_version', '?')} at "
             f"{info.get('python', '?')})")
    again = f"it would fail alike on every launch, so tfnb did not relaunch it (max_attempts={max_attempts})"
    if info.get("exc_type"):
        module = info.get("module") or "tfnb"
        who = "the train_fn process" if info.get("child") else "the Spark task"
        text = (f"{who} on {where} cannot import {module}: {info['exc_type']}: {info.get('message', '')}; "
                f"{again}. Install {module} where that Python finds it: {_INSTALL_FIX}")
    else:
        text = (f"tfnb {info.get('version')} on {where} but tfnb {__version__} on this driver: the run was refused "
                f"before any train_fn started; {again}. Install tfnb {__version__} on the executors too: "
                f"{_INSTALL_FIX}")
    tail = "".join(str(info.get("traceback") or "").splitlines(True)[-12:]).rstrip()
    return ClusterError(text + (f"\n\nLast lines of the executor's traceback:\n{tail}" if tail else ""))


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
