"""The few exception classes a tfnb user may want to catch.

Every error tfnb raises for bad input says the value, the rule, and the knob
that fixes it. Errors raised inside a worker reach the driver as one
:class:`WorkerError` carrying the task's role, index, exception type, message
and traceback.
"""
from __future__ import annotations

from dataclasses import dataclass


class TfnbError(Exception):
    """Base class of every error tfnb raises on purpose."""


class ConfigError(TfnbError, ValueError):
    """A bad argument or setting; the message names the fix."""


class MissingDependencyError(TfnbError, ImportError):
    """An optional package is needed for this call; the message says what to install."""


class ClusterError(TfnbError):
    """The Spark cluster cannot host the requested TensorFlow cluster (slots, dynamic allocation)."""


class RunTimeoutError(TfnbError, TimeoutError):
    """``tfnb.run(timeout=...)`` ran out; the job was cancelled and its processes stopped."""


class UnsafePathError(TfnbError, PermissionError):
    """A folder tfnb keeps private state in is not private (another owner, group/other writable)."""


class RunCancelledError(TfnbError, KeyboardInterrupt):
    """The run was interrupted (notebook stop button / Ctrl-C); its processes were stopped."""


@dataclass(frozen=True)
class TaskFailure:
    """What one barrier task reported when it failed."""

    job_name: str
    task_index: int
    exc_type: str
    message: str
    traceback: str = ""
    exit_code: int | None = None
    attempt: int = 1
    host: str = ""

    @property
    def label(self) -> str:
        return f"{self.job_name} {self.task_index}"

    @property
    def retryable(self) -> bool:
        """A crash of the process (signal, lost executor) is worth a relaunch; a Python exception is not."""
        return self.exc_type in _PROCESS_DEATHS


_PROCESS_DEATHS = frozenset({"ProcessDied", "TaskLost"})


class WorkerError(TfnbError):
    """``train_fn`` (or the task running it) failed on a worker.

    Attributes:
        failure: the first :class:`TaskFailure` reported; ``failure.traceback`` is the worker's traceback.
        others: failures reported by other tasks of the same attempt.
    """

    def __init__(self, failure: TaskFailure, others: tuple[TaskFailure, ...] = ()):
        self.failure = failure
        self.others = others
        head = f"{failure.label} failed (attempt {failure.attempt}): {failure.exc_type}: {failure.message}"
        if failure.host:
            head += f" [on {failure.host}]"
        body = failure.traceback.rstrip()
        super().__init__(head + ("\n\nWorker traceback:\n" + body if body else ""))

    @property
    def task_index(self) -> int:
        return self.failure.task_index

    @property
    def job_name(self) -> str:
        return self.failure.job_name

    @property
    def exc_type(self) -> str:
        return self.failure.exc_type

    @property
    def worker_traceback(self) -> str:
        return self.failure.traceback


class StorageError(TfnbError):
    """Reading or writing storage failed; the message names the URL, what failed and the fix."""


# Older names of StorageError, kept so that existing ``except`` clauses still catch every storage failure.
StagingError = SyncError = StorageError


class DbcFormatError(TfnbError, ValueError):
    """A DBC archive is malformed (not a zip, missing fields, unknown language)."""


class EvaluatorError(TfnbError):
    """The driver-side evaluator cannot run (bad model_fn / dataset_fn / directories)."""
