"""The few exception classes a tfnb user may want to catch; every one says the value, the rule and the fix."""
from __future__ import annotations

import re
from dataclasses import dataclass


class TfnbError(Exception):
    """Base class of every error tfnb raises on purpose."""


class ConfigError(TfnbError, ValueError):
    """A bad argument or setting; the message names the fix."""


class MissingDependencyError(TfnbError, ImportError):
    """An optional package is needed for this call; the message says what to install."""


class ClusterError(TfnbError):
    """The Spark cluster cannot host the requested TensorFlow cluster: too few slots, dynamic allocation,
    GPUs it cannot give, or executors where tfnb cannot start (not installed, another version)."""


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
        """Bad luck worth a relaunch: the process died (signal, lost executor), it stalled, or it failed
        because a peer disappeared. Any other Python exception in train_fn is a bug and is not retried."""
        return self.died or self.exc_type == STALLED or self.peer_lost

    @property
    def died(self) -> bool:
        """The task's process or its executor is gone (as opposed to raising an exception)."""
        return self.exc_type in _PROCESS_DEATHS

    @property
    def peer_lost(self) -> bool:
        """The error TensorFlow raises in a survivor when a peer of a collective or gRPC call is gone."""
        module, _, name = self.exc_type.rpartition(".")
        return (name in _PEER_ERRORS and module.startswith("tensorflow")) or bool(_PEER_MESSAGES.search(self.message))


_PROCESS_DEATHS = frozenset({"ProcessDied", "TaskLost", "ExecutorLost"})
STALLED = "Stalled"
# tf.errors raised in a survivor when a peer goes away mid-collective (CollectiveReduceV2, gRPC channels)
_PEER_ERRORS = frozenset({"UnavailableError", "CancelledError", "AbortedError", "DeadlineExceededError"})
_PEER_MESSAGES = re.compile(
    r"Collective ops is aborted|failed to connect to all addresses|Socket closed|Connection reset", re.IGNORECASE)


# Raised in train_fn by Keras 3's fit (tfnb._task.keras3) where it cannot train: first line, then the detail.
KERAS3_UNTESTED = ("Keras {version} ({backend}) is not supported under tf.distribute (tested: {low} to {high}); "
                   "install a tested Keras, or use tf.keras (tf-keras)\n"
                   "Keras 3's trainer fails under MultiWorkerMirroredStrategy (keras-team/keras#20585); tfnb corrects "
                   "it from Keras {low} on, with the TensorFlow backend (docs/keras3.md): pip install "
                   "'keras>={low},<={high}', or use tf.keras (tf-keras where installed) or `import tf_keras as keras`.")
KERAS3_PROBE = ("Keras {version}: tfnb could not check it for the defect '{name}'; install a tested Keras ({low} to "
                "{high}), or use tf.keras (tf-keras)\n"
                "The check runs Keras' own code on stand-ins and failed: {error}. A correction applied blindly could "
                "train wrong where Keras has no such defect, so tfnb stops (docs/keras3.md): pip install "
                "'keras>={low},<={high}'.")
KERAS3_SELFCHECK = ("{what} failed tfnb's self-check: {detail}; install a tested Keras ({low} to {high}), or use "
                    "tf.keras\n"
                    "{untested} newer than tfnb's tests, so at the first fit under {strategy} every worker trained a "
                    "linear model one SGD step and compared it with the same step in one process (docs/keras3.md, "
                    "'Newer versions'). {checks} pip install 'keras>={low},<={high}', or use tf.keras (tf-keras).")
KERAS3_DEVICES = ("Keras {version} cannot train on {devices} devices per worker; use one device per worker (e.g. "
                  "gpus_per_worker=1) or Keras >= 3.15, or tf.keras (tf-keras)\n"
                  "This Keras applies each device's gradient to that device's copy of the weights alone "
                  "(keras-team/keras#19308): tfnb corrects this across workers of one device each, not between the "
                  "devices of one process.")
KERAS3_PS = ("Keras 3's fit does not train under ParameterServerStrategy; use tf.keras (tf-keras) for a ps run, or "
             "num_ps=0\n"
             "Keras 3's trainer has no ClusterCoordinator support (tf-keras's fit has): build the model with tf.keras "
             "(legacy_keras=True) or `import tf_keras as keras`, or train with MultiWorkerMirroredStrategy (num_ps=0).")

FIRST_LINE = 200  # the most an error's first line holds: what failed and the fix, read at a glance


def summary(e: BaseException, limit: int = 240) -> str:
    """``e`` in one short line for an error that wraps it: a tfnb error's first line (its fix) with long asides
    such as ``(SignatureDoesNotMatch: <the server's sentence>)`` cut to their head; else ``Type: first line``."""
    text = (str(e).strip().splitlines() or [""])[0]
    if isinstance(e, TfnbError):
        return re.sub(r"\(([^():]{1,60}): [^()]{30,}\)", r"(\1)", text)
    text = f"{type(e).__name__}: {text}"
    return text if len(text) <= limit else text[:limit - 1] + "…"


def suggest(unknown, known) -> str:
    """`` (did you mean num_workers?)`` for names in ``unknown`` close to one of ``known``; "" if none is."""
    import difflib

    near = sorted({m for u in unknown for m in difflib.get_close_matches(u, known, n=1)})
    return f" (did you mean {', '.join(near)}?)" if near else ""


def below(e: BaseException) -> str:
    """The rest of ``e``'s message after its first line, newline first ("" if none): below ``summary(e)``."""
    rest = str(e).strip().partition("\n")[2]
    return f"\n{rest}" if rest.strip() else ""


class WorkerError(TfnbError):
    """``train_fn`` (or the task running it) failed on a worker.

    Attributes:
        failure: the :class:`TaskFailure` that decided the outcome; ``failure.traceback`` is the worker's
            traceback.
        others: failures reported by other tasks of the same attempt.
        attempts: one dict per launch of the run, in order (``attempt``, ``outcome``, ``cause``,
            ``retryable``, ``epoch``, ``seconds``), the same history tfnb writes to the run status file.
    """

    def __init__(self, failure: TaskFailure, others: tuple[TaskFailure, ...] = (), attempts: tuple = ()):
        self.failure = failure
        self.others = others
        self.attempts = tuple(attempts)
        super().__init__(self._text())

    def _text(self) -> str:
        failure = self.failure
        # The first line ends with the worker's own (a tfnb error's ends with its fix): tfnb's types by their short
        # name, the host below; another library's long first line is cut there and given whole below.
        first, _, rest = failure.message.strip().partition("\n")
        kind = failure.exc_type.rpartition(".")[2] if failure.exc_type.startswith("tfnb.") else failure.exc_type
        head = f"{failure.label} failed (attempt {failure.attempt}): {kind}: "
        if len(head) + len(first) > FIRST_LINE:
            head, rest = head + first[:FIRST_LINE - len(head) - 1] + "…", f"{first}\n{rest}"
        else:
            head += first
        lines = [head, rest.strip()] + [f"Host: {failure.host}"] * bool(failure.host)
        earlier = [a for a in self.attempts[:-1] if a.get("cause")]
        if earlier:
            lines.append("Earlier attempts: " + "; ".join(f"{a['attempt']}: {a['cause']}" for a in earlier))
        body = failure.traceback.rstrip()
        return "\n".join(line for line in lines if line) + ("\n\nWorker traceback:\n" + body if body else "")

    # The deciding failure's fields, for ``except WorkerError as e: ... e.task_index``.
    task_index = property(lambda self: self.failure.task_index)
    job_name = property(lambda self: self.failure.job_name)
    exc_type = property(lambda self: self.failure.exc_type)
    worker_traceback = property(lambda self: self.failure.traceback)


class WorkerStalledError(WorkerError):
    """A train_fn process stayed alive but silent (no progress event, no output line) for ``stall_timeout``
    seconds on the last attempt.

    Attributes:
        seconds: how long the stalled task had been silent when tfnb stopped the run.
        last_step: the task's last progress report (epoch, step...), empty if it never sent one.
        last_line: the last output line the task printed ("" if none).
        stacks: ``{"worker 1": "<Python stack of every thread>", ...}`` for every train_fn process.
    """

    def __init__(self, failure: TaskFailure, others: tuple[TaskFailure, ...] = (), attempts: tuple = (), *,
                 seconds: float = 0.0, last_step: dict | None = None, last_line: str = "",
                 stacks: dict | None = None):
        self.seconds = seconds
        self.last_step = dict(last_step or {})
        self.last_line = last_line
        self.stacks = dict(stacks or {})
        super().__init__(failure, others, attempts)

    def _text(self) -> str:
        f = self.failure
        step = ", ".join(f"{k} {v}" for k, v in self.last_step.items()) or "none reported"
        text = (f"{f.label} stalled (attempt {f.attempt}): no progress event and no output line for "
                f"{self.seconds:.0f} s, so the run was cancelled; raise stall_timeout= if train_fn is silent that "
                "long on purpose\n"
                f"Its train_fn process was alive{f' on {f.host}' if f.host else ''}; last step: {step}; last line: "
                f"{self.last_line!r}.\nWatchdog: {f.message}.\nstall_timeout= (or TFNB_STALL_TIMEOUT) is in "
                "seconds; stall_timeout=None turns the watchdog off.")
        for label in sorted(self.stacks, key=lambda label: label != f.label):  # the stalled task's first
            if self.stacks[label]:
                text += f"\n\nStack of {label}{' (all threads)' * (label == f.label)}:\n{self.stacks[label].rstrip()}"
        return text


class StorageError(TfnbError):
    """Reading or writing storage failed; the message names the URL, what failed and the fix."""


class DbcFormatError(TfnbError, ValueError):
    """A DBC archive is malformed (not a zip, missing fields, unknown language)."""


class EvaluatorError(TfnbError):
    """The driver-side evaluator cannot run (bad model_fn / dataset_fn / directories)."""
