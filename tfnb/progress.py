"""Notebook layer for a run's events: live per-worker progress, log lines, failures.

``tfnb.run`` hands every :class:`tfnb.events.RunEvent` to a display on the driver's main
thread. :func:`auto_display` picks one:

* :class:`ProgressWidget` inside a Jupyter kernel: a table with one row per task (state,
  epoch/step, loss, examples/s), a status line (attempt, outcome) and the latest log lines;
* :class:`ConsoleDisplay` elsewhere: prefixed log lines plus a tqdm status line on a terminal,
  or a plain progress line at a modest rate when output goes to a file or CI log.

Both keep the run's state in a plain-data :class:`RunProgress` (one :class:`WorkerProgress` per
task), which is what they render and what tests inspect. The numbers come from
``ctx.report(...)`` or the Keras callback :func:`keras_callback` (``ctx.progress_callback()``),
which run in the train_fn processes and reach the driver over the run's authenticated channel.
"""
from __future__ import annotations

import html
import logging
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

from . import events
from ._config import setting
from .errors import ConfigError
from .events import RunEvent

log = logging.getLogger(__name__)

DISPLAY_MODES = ("auto", "widget", "console", "none")

# Progress fields with a column of their own; every other number is shown as a metric.
_CORE_FIELDS = frozenset({"epoch", "epochs", "step", "steps", "global_step", "steps_per_sec",
                          "examples_per_sec", "batch_size", "epoch_end", "loss", "time"})
_ROLE_ORDER = {"chief": 0, "worker": 1, "ps": 2, "evaluator": 3}
_MAX_LINE = 2000  # characters of one log line kept for display; a runaway line should not flood the page


# ---------------------------------------------------------------- plain-data model


@dataclass
class WorkerProgress:
    """What the display knows about one task of the current attempt.

    Attributes:
        job_name: ``"chief"``, ``"worker"`` or ``"ps"``.
        task_index: the task's index (the worker's rank).
        state: ``pending`` (no word yet), ``starting``, ``training``, ``serving``, ``done``,
            ``stopped`` or ``failed``.
        history: the states this task went through in this attempt, in order.
        epoch: the epoch being trained (1-based), as last reported.
        epochs: epochs the fit will run, when reported.
        step: batches done in the current epoch.
        steps: batches per epoch, when reported.
        loss: latest loss.
        examples_per_sec: latest throughput of this task, when the batch size is known.
        steps_per_sec: latest batches per second of this task.
        metrics: other numbers reported (accuracy, val_loss, ...).
        error: ``"ExcType: message"`` when the task failed.
    """

    job_name: str
    task_index: int
    state: str = "pending"
    history: list = field(default_factory=list)
    epoch: int | None = None
    epochs: int | None = None
    step: int | None = None
    steps: int | None = None
    loss: float | None = None
    examples_per_sec: float | None = None
    steps_per_sec: float | None = None
    metrics: dict = field(default_factory=dict)
    error: str | None = None

    @property
    def label(self) -> str:
        return f"{self.job_name} {self.task_index}"

    @property
    def progress(self) -> float | None:
        """Batches done over the whole fit (for a bar), or None before any step was reported."""
        if self.step is None:
            return None
        if self.steps and self.epoch:
            return (self.epoch - 1) * self.steps + self.step
        return float(self.step)

    @property
    def total(self) -> float | None:
        return self.epochs * self.steps if self.epochs and self.steps else None


def _sort_key(key: tuple) -> tuple:
    return (_ROLE_ORDER.get(key[0], 9), key[0], key[1])


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    n = _number(value)
    return int(n) if n is not None else None


@dataclass
class RunProgress:
    """The state of a run as its events describe it; displays render this.

    Attributes:
        workers: ``(job_name, task_index) -> WorkerProgress``, pre-filled from the run's shape.
        attempt: the current launch (1 first, 2.. after a relaunch).
        max_attempts: launches tfnb will make at most, when known.
        outcome: None while running, then ``"succeeded"`` or ``"failed"``; ``"stopped"`` when the
            run ended without either (interrupted, timed out).
        relaunch_reason: why the last relaunch happened.
        logs: the latest log lines, ``"[worker 1] text"``.
    """

    workers: dict = field(default_factory=dict)
    attempt: int = 1
    max_attempts: int | None = None
    outcome: str | None = None
    relaunch_reason: str | None = None
    logs: deque = field(default_factory=lambda: deque(maxlen=100))
    started: float | None = None  # time of the first event
    finished: float | None = None
    shape: tuple = field(default=(None, 0), repr=False)  # (num_workers, num_ps): the rows to pre-fill

    @classmethod
    def for_run(cls, num_workers: int | None = None, num_ps: int = 0, *, max_attempts: int | None = None,
                log_lines: int = 100) -> "RunProgress":
        run = cls(max_attempts=max_attempts, logs=deque(maxlen=log_lines))
        run._prefill(num_workers, num_ps)
        return run

    def _prefill(self, num_workers: int | None, num_ps: int) -> None:
        self.shape = (num_workers, num_ps)
        for rank in range(num_workers or 0):
            key = ("chief", 0) if rank == 0 else ("worker", rank)
            self.workers[key] = WorkerProgress(*key)
        for i in range(num_ps if num_workers else 0):
            self.workers[("ps", i)] = WorkerProgress("ps", i)

    def rows(self) -> list[WorkerProgress]:
        return [self.workers[k] for k in sorted(self.workers, key=_sort_key)]

    def worker(self, job_name: str, task_index: int) -> WorkerProgress:
        key = (job_name, task_index)
        if key not in self.workers:
            self.workers[key] = WorkerProgress(job_name, task_index)
        return self.workers[key]

    def count(self, state: str) -> int:
        return sum(1 for w in self.workers.values() if w.state == state)

    def examples_per_sec(self) -> float | None:
        rates = [w.examples_per_sec for w in self.workers.values()
                 if w.state == "training" and w.examples_per_sec is not None]
        return sum(rates) if rates else None

    def apply(self, event: RunEvent) -> bool:
        """Fold one event into the state; True when something visible changed."""
        data = event.data or {}
        if self.started is None:
            self.started = event.time
        if event.job_name == "driver":
            return self._apply_driver(event.kind, data)
        if event.kind == events.LOG:
            line = str(data.get("line", ""))
            self.logs.append(f"[{event.label}] {line[:_MAX_LINE]}")
            return True
        w = self.worker(event.job_name, event.task_index)
        if event.kind == events.STATE:
            state = str(data.get("state", ""))
            if not state or w.state == "failed":
                # the failure is the news; a later "stopped" from the same task would hide it
                return False
            w.state = state
            w.history.append(state)
            return True
        if event.kind == events.FAILED:
            w.state = "failed"
            w.history.append("failed")
            w.error = f"{data.get('exc_type', 'Error')}: {data.get('message', '')}".rstrip(": ")
            return True
        if event.kind == events.PROGRESS:
            self._apply_progress(w, data)
            return True
        return False

    def _apply_driver(self, kind: str, data: dict) -> bool:
        if "max_attempts" in data:
            self.max_attempts = _int(data["max_attempts"]) or self.max_attempts
        if kind == events.ATTEMPT:
            self.attempt = _int(data.get("attempt")) or self.attempt + 1
            self.relaunch_reason = str(data.get("reason", "")) or None
            self.workers.clear()
            self._prefill(*self.shape)
            return True
        if kind == events.STATE and data.get("state") in ("succeeded", "failed"):
            self.outcome = str(data["state"])
            self.attempt = _int(data.get("attempt")) or self.attempt
            self.finished = time.time()
            return True
        return False

    @staticmethod
    def _apply_progress(w: WorkerProgress, data: dict) -> None:
        for name in ("epoch", "epochs", "step", "steps"):
            if data.get(name) is not None:
                setattr(w, name, _int(data[name]))
        if _number(data.get("loss")) is not None:
            w.loss = _number(data["loss"])
        steps_rate = _number(data.get("steps_per_sec"))
        if steps_rate is not None:
            w.steps_per_sec = steps_rate
        ex_rate = _number(data.get("examples_per_sec"))
        if ex_rate is None and steps_rate is not None and _number(data.get("batch_size")):
            ex_rate = steps_rate * _number(data["batch_size"])
        if ex_rate is not None:
            w.examples_per_sec = ex_rate
        for key, value in data.items():
            if key not in _CORE_FIELDS and _number(value) is not None:
                w.metrics[key] = _number(value)
        if w.state == "pending":
            # a report means the task trains, even if its state change was not seen
            w.state = "training"
            w.history.append("training")

    def end(self) -> None:
        """The run is over; without a reported outcome it was interrupted or timed out."""
        if self.outcome is None:
            self.outcome = "stopped"
        if self.finished is None:
            self.finished = time.time()

    def status_text(self) -> str:
        """One line: outcome or what is running, attempt, elapsed time, total throughput."""
        attempt = f"attempt {self.attempt}" + (f"/{self.max_attempts}" if self.max_attempts else "")
        now = self.finished or time.time()
        elapsed = _duration(now - (self.started or now))
        if self.outcome == "succeeded":
            return f"Succeeded ({attempt}) in {elapsed}"
        if self.outcome == "failed":
            failed = [w for w in self.rows() if w.state == "failed"]
            why = f": {failed[0].label} {failed[0].error}" if failed else ""
            return f"Failed ({attempt}) after {elapsed}{why}"
        if self.outcome == "stopped":
            return f"Stopped ({attempt}) after {elapsed}: interrupted or timed out"
        total = len(self.workers)
        parts = [f"Running ({attempt}), {elapsed}"]
        for state in ("starting", "training", "serving", "done", "stopped", "failed"):
            n = self.count(state)
            if n:
                parts.append(f"{n}/{total} {state}")
        rate = self.examples_per_sec()
        if rate is not None:
            parts.append(f"{_short(rate)} examples/s")
        if self.attempt > 1 and self.relaunch_reason:
            parts.append(f"relaunched after {self.relaunch_reason}")
        return " · ".join(parts)


def _duration(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


def _short(x: float) -> str:
    """1234.5 -> '1.23k': throughput at a glance."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.4g}"


def _of(value: int | None, total: int | None) -> str:
    if value is None:
        return ""
    return f"{value}/{total}" if total else str(value)


def format_metrics(data: dict) -> str:
    """``key=value`` pairs of a progress event, numbers to 4 significant digits."""
    parts = []
    for key, value in data.items():
        if key in ("time", "epoch_end"):
            continue
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return " ".join(parts)


# ---------------------------------------------------------------- notebook widget

_STATE_COLOURS = {"pending": "#888", "starting": "#888", "training": "#1f6feb", "serving": "#1f6feb",
                  "done": "#1a7f37", "stopped": "#bf8700", "failed": "#cf222e"}


def _render_table(run: RunProgress) -> str:
    """The per-task table as HTML (escaped; log text and error messages come from user code)."""
    pad = 'style="padding:2px 14px 2px 0;text-align:left;vertical-align:top"'
    head = "<tr>" + "".join(f"<th {pad}>{name}</th>" for name in
                            ("task", "state", "epoch", "step", "loss", "examples/s", "metrics")) + "</tr>"
    body = []
    for w in run.rows():
        colour = _STATE_COLOURS.get(w.state, "#888")
        state = f'<span style="color:{colour};font-weight:600">{html.escape(w.state)}</span>'
        if w.error:
            state += f'<br><span style="color:#cf222e">{html.escape(w.error[:300])}</span>'
        if w.examples_per_sec is not None:
            speed = _short(w.examples_per_sec)
        elif w.steps_per_sec is not None:
            speed = f"({_short(w.steps_per_sec)} steps/s)"
        else:
            speed = ""
        metrics = " ".join(f"{html.escape(k)}={v:.4g}" for k, v in sorted(w.metrics.items()))
        cells = [html.escape(w.label), state, _of(w.epoch, w.epochs), _of(w.step, w.steps), _num(w.loss),
                 speed, metrics]
        body.append("<tr>" + "".join(f"<td {pad}>{c}</td>" for c in cells) + "</tr>")
    return ('<table class="tfnb-progress" style="border-collapse:collapse">'
            + head + "".join(body) + "</table>")


def _render_status(run: RunProgress) -> str:
    colour = {"succeeded": "#1a7f37", "failed": "#cf222e", "stopped": "#bf8700"}.get(run.outcome or "", "inherit")
    return f'<div style="color:{colour};font-weight:600">tfnb: {html.escape(run.status_text())}</div>'


class ProgressWidget:
    """Live ipywidgets panel of a run: per-task table, status line and the latest log lines.

    Pass it as ``tfnb.run(..., display=widget)`` (``tfnb.run`` builds one by itself in a notebook).
    Events update :attr:`run` at once; the widgets re-render at most every ``refresh_interval``
    seconds, so a chatty TensorFlow does not flood the front end, and once more when the run ends.

    Args:
        num_workers: chief + worker tasks, to show their rows before they report (optional).
        num_ps: parameter-server tasks.
        max_attempts: launches the run may make, for the status line (optional).
        log_lines: how many of the latest log lines to show; older ones scroll out.
        refresh_interval: minimum seconds between two re-renders.

    Attributes:
        run: the :class:`RunProgress` rendered; ``widget.workers[("worker", 1)].step`` reads it.
        status, table: ``ipywidgets.HTML`` with the status line and the per-task table.
        logs: ``ipywidgets.Output`` with the latest log lines, each prefixed by its task.
        box: the ``ipywidgets.VBox`` holding them (what the notebook shows).
        renders: how many times the widgets were re-rendered.

    Example:
        >>> from tfnb.progress import ProgressWidget
        >>> widget = ProgressWidget(num_workers=2)
        >>> widget                       # shows the panel in this cell
        >>> tfnb.run(train_fn, num_workers=2, display=widget)
        >>> widget.workers[("worker", 1)].loss
        0.213
    """

    def __init__(self, num_workers: int | None = None, num_ps: int = 0, *, max_attempts: int | None = None,
                 log_lines: int = 30, refresh_interval: float = 0.1):
        if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 1):
            raise ConfigError(f"num_workers={num_workers!r} must be an int >= 1 or None")
        if not isinstance(log_lines, int) or log_lines < 1:
            raise ConfigError(f"log_lines={log_lines!r} must be an int >= 1 (lines of log kept on screen)")
        if _number(refresh_interval) is None or refresh_interval < 0:
            raise ConfigError(f"refresh_interval={refresh_interval!r} must be a number of seconds >= 0")
        from ._deps import require

        widgets = require("ipywidgets", "the tfnb progress widget")
        self._shape = dict(num_workers=num_workers, num_ps=num_ps, max_attempts=max_attempts,
                           log_lines=log_lines)
        self.run = RunProgress.for_run(**self._shape)
        self.refresh_interval = float(refresh_interval)
        self.status = widgets.HTML()
        self.table = widgets.HTML()
        # No scroll box: a scrolled area would open at its oldest line (measured in JupyterLab 4),
        # so the newest lines would be hidden; log_lines bounds the height instead.
        self.logs = widgets.Output(layout=widgets.Layout(border="1px solid #ddd"))
        self.box = widgets.VBox([self.status, self.table, self.logs])
        self.renders = 0
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._last_render = float("-inf")
        self._dirty = False
        self._logs_dirty = False
        self._closed = False
        self._shown = False
        self._render()

    @property
    def workers(self) -> dict:
        """``(job_name, task_index) -> WorkerProgress`` of the current attempt."""
        return self.run.workers

    def _repr_mimebundle_(self, **kwargs):
        self._shown = True
        return self.box._repr_mimebundle_(**kwargs)

    def __call__(self, event: RunEvent) -> None:
        if not self._shown and in_notebook():
            # passed as display= without being shown first: show it in the running cell
            from IPython.display import display

            display(self)
        with self._lock:
            if self._closed:
                # the same widget reused for another run starts clean
                self._closed = False
                self.run = RunProgress.for_run(**self._shape)
                self._logs_dirty = True
            if not self.run.apply(event):
                return
            self._dirty = True
            self._logs_dirty = self._logs_dirty or event.kind == events.LOG
            wait = self._last_render + self.refresh_interval - time.monotonic()
            if wait <= 0 and self._timer is None:
                self._render()
            elif self._timer is None:
                # render the latest state a little later even if no further event arrives
                self._timer = threading.Timer(max(wait, 0.0), self._flush)
                self._timer.daemon = True
                self._timer.start()

    def _flush(self) -> None:
        with self._lock:
            self._timer = None
            if self._dirty and not self._closed:
                self._render()

    def _render(self) -> None:
        self.status.value = _render_status(self.run)
        self.table.value = _render_table(self.run)
        if self._logs_dirty:
            text = "\n".join(self.run.logs) + "\n"
            self.logs.outputs = ({"output_type": "stream", "name": "stdout", "text": text},)
        self._dirty = self._logs_dirty = False
        self._last_render = time.monotonic()
        self.renders += 1

    def log_text(self) -> str:
        """The log lines the widget shows, as text."""
        return "".join(o.get("text", "") for o in self.logs.outputs)

    def close(self) -> None:
        """Render the final state; called by ``tfnb.run`` when the run ends."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self.run.end()
            self._render()
            self._closed = True


# ---------------------------------------------------------------- console


class ConsoleDisplay:
    """Console output of a run: ``[worker 1] ...`` log lines and a progress line.

    On a terminal the progress is a tqdm bar kept below the log lines. Otherwise (a file, a CI
    log, a notebook cell with TFNB_DISPLAY=console) it prints each task's epoch summary and, at
    most every ``interval`` seconds, one line with the run's progress.

    Args:
        stream: where to write (default: the current ``sys.stdout``).
        num_workers: chief + worker tasks, for the counts in the progress line (optional).
        num_ps: parameter-server tasks.
        interval: seconds between two plain progress lines (not on a terminal).
        tty: force the terminal (tqdm) or plain form; default: ``stream.isatty()``.

    Example:
        >>> from tfnb.progress import ConsoleDisplay
        >>> tfnb.run(train_fn, num_workers=2, display=ConsoleDisplay(interval=60))
    """

    def __init__(self, stream: TextIO | None = None, *, num_workers: int | None = None, num_ps: int = 0,
                 interval: float = 30.0, tty: bool | None = None):
        if _number(interval) is None or interval < 0:
            raise ConfigError(f"interval={interval!r} must be a number of seconds >= 0")
        self.stream = stream
        self.interval = float(interval)
        self._tty = tty
        self.run = RunProgress.for_run(num_workers, num_ps)
        self._bar = None
        self._last_line = float("-inf")

    def _out(self) -> TextIO:
        return self.stream or sys.stdout

    def _is_tty(self) -> bool:
        if self._tty is None:
            try:
                self._tty = bool(self._out().isatty())
            except (AttributeError, ValueError):
                self._tty = False
        return self._tty

    def _print(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=self._out())
        else:
            print(text, file=self._out(), flush=True)

    def __call__(self, event: RunEvent) -> None:
        self.run.apply(event)
        data = event.data or {}
        if event.kind == events.LOG:
            self._print(f"[{event.label}] {data.get('line', '')}")
        elif event.kind == events.STATE:
            self._on_state(event, data)
        elif event.kind == events.FAILED:
            self._print(f"[{event.label}] FAILED {data.get('exc_type')}: {data.get('message')}")
        elif event.kind == events.ATTEMPT:
            self._close_bar()
            self._print(f"[tfnb] relaunching (attempt {data.get('attempt')}/{data.get('max_attempts')}) "
                        f"after: {data.get('reason')}")
        elif event.kind == events.PROGRESS:
            self._on_progress(event, data)

    def _on_state(self, event: RunEvent, data: dict) -> None:
        state = data.get("state")
        if event.job_name == "driver":
            self._close_bar()
            if state in ("succeeded", "failed"):
                self._print(f"[tfnb] {self.run.status_text()}")
        elif state in ("training", "serving", "done"):
            # "starting" and "stopped" add little on a console: the first log line or the failure says more
            self._print(f"[{event.label}] {state}")

    def _on_progress(self, event: RunEvent, data: dict) -> None:
        w = self.run.workers.get((event.job_name, event.task_index))
        if self._is_tty():
            self._update_bar()
            if data.get("epoch_end") and w is not None:
                self._print(f"[{event.label}] {self._epoch_summary(w)}")
            return
        now = time.monotonic()
        if data.get("epoch_end") and w is not None:
            self._print(f"[{event.label}] {self._epoch_summary(w)}")
            self._last_line = now
        elif not _CORE_FIELDS.intersection(data) - {"time"}:
            # a custom ctx.report(...) without the usual fields: show what was sent
            if now - self._last_line >= self.interval:
                self._print(f"[{event.label}] {format_metrics(dict(data))}")
                self._last_line = now
        elif now - self._last_line >= self.interval and data.get("step") is not None:
            self._print(f"[tfnb] {self._progress_line()}")
            self._last_line = now

    @staticmethod
    def _epoch_summary(w: WorkerProgress) -> str:
        parts = [f"epoch {_of(w.epoch, w.epochs)}"]
        if w.loss is not None:
            parts.append(f"loss={w.loss:.4g}")
        parts += [f"{k}={v:.4g}" for k, v in sorted(w.metrics.items())]
        if w.examples_per_sec is not None:
            parts.append(f"{_short(w.examples_per_sec)} examples/s")
        elif w.steps_per_sec is not None:
            parts.append(f"{_short(w.steps_per_sec)} steps/s")
        return " ".join(parts)

    def _lead(self) -> WorkerProgress | None:
        """The task that bounds the run's progress: the one with the fewest batches done."""
        reporting = [w for w in self.run.rows() if w.progress is not None and w.state == "training"]
        return min(reporting, key=lambda w: w.progress) if reporting else None

    def _progress_line(self) -> str:
        w = self._lead()
        parts = []
        if w is not None:
            if w.epoch is not None:
                parts.append(f"epoch {_of(w.epoch, w.epochs)}")
            parts.append(f"step {_of(w.step, w.steps)}")
            if w.loss is not None:
                parts.append(f"loss={w.loss:.4g}")
        rate = self.run.examples_per_sec()
        if rate is not None:
            parts.append(f"{_short(rate)} examples/s")
        n = len(self.run.workers)
        parts.append(f"{self.run.count('training')}/{n} training")
        return " ".join(parts)

    def _update_bar(self) -> None:
        w = self._lead()
        if w is None:
            return
        if self._bar is None:
            try:
                from tqdm import tqdm
            except ImportError:  # the bar is a nicety; plain lines still say everything
                self._tty = False
                return
            self._bar = tqdm(total=w.total, file=self._out(), unit="step", mininterval=0.2,
                             dynamic_ncols=True, leave=True)
        bar = self._bar
        if w.total and bar.total != w.total:
            bar.total = w.total
        if w.epoch is not None:
            bar.set_description(f"epoch {_of(w.epoch, w.epochs)}", refresh=False)
        postfix = [f"loss={w.loss:.4g}"] if w.loss is not None else []
        rate = self.run.examples_per_sec()
        if rate is not None:
            postfix.append(f"{_short(rate)} ex/s")
        postfix.append(f"{self.run.count('training')}/{len(self.run.workers)} training")
        bar.set_postfix_str(", ".join(postfix), refresh=False)
        delta = int(w.progress or 0) - bar.n
        if delta > 0:
            bar.update(delta)
        elif delta < 0:  # resumed from a checkpoint at an earlier step: restart the count
            bar.n = int(w.progress or 0)
            bar.refresh()

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def close(self) -> None:
        self._close_bar()


class _NoDisplay:
    """TFNB_DISPLAY=none: events are dropped (failures still raise from ``tfnb.run``)."""

    def __call__(self, event: RunEvent) -> None:
        pass

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- choosing a display


def in_notebook() -> bool:
    """True inside a Jupyter (ipykernel) or Databricks notebook kernel."""
    ip = sys.modules.get("IPython")
    if ip is None:
        return False
    shell = ip.get_ipython() if hasattr(ip, "get_ipython") else None
    if shell is None:
        return False
    return any(c.__name__ in ("ZMQInteractiveShell", "DatabricksShell") for c in type(shell).__mro__)


def auto_display(num_workers: int, num_ps: int = 0, *, mode: str | None = None,
                 max_attempts: int | None = None) -> Callable[[RunEvent], None]:
    """The display ``tfnb.run`` uses when none is given: a live widget in notebooks, console otherwise.

    Args:
        num_workers: chief + worker tasks of the run.
        num_ps: parameter-server tasks of the run.
        mode: ``"auto"``, ``"widget"``, ``"console"`` or ``"none"``. Env: TFNB_DISPLAY. Default auto.
        max_attempts: launches the run may make (shown as "attempt n/N").

    Returns:
        A callable taking each RunEvent, with a ``close()`` to call when the run ends.

    Raises:
        ConfigError: an unknown mode.

    Example:
        >>> import os
        >>> os.environ["TFNB_DISPLAY"] = "console"     # plain output even in a notebook
        >>> tfnb.run(train_fn, num_workers=2)
    """
    chosen = setting("display", mode, "auto", str).strip().lower()
    if chosen not in DISPLAY_MODES:
        raise ConfigError(
            f"display mode {chosen!r} (TFNB_DISPLAY or mode=) is not one of {', '.join(DISPLAY_MODES)}; "
            "set TFNB_DISPLAY=widget, console or none, or unset it")
    if chosen == "auto":
        chosen = "widget" if in_notebook() else "console"
    if chosen == "none":
        return _NoDisplay()
    if chosen == "console":
        return ConsoleDisplay(num_workers=num_workers, num_ps=num_ps)
    widget = ProgressWidget(num_workers=num_workers, num_ps=num_ps, max_attempts=max_attempts)
    if in_notebook():
        from IPython.display import display

        display(widget)
    else:
        log.debug("TFNB_DISPLAY=widget outside a notebook kernel: the widget is kept but not shown")
    return widget


# ---------------------------------------------------------------- inside train_fn


def keras_callback(ctx: Any = None, *, batch_size: int | None = None, interval: float = 0.5,
                   every_n_steps: int | None = None):
    """A Keras callback that reports epoch, step, loss, metrics and throughput to the driver's display.

    Add it to ``model.fit(callbacks=[...])`` on every worker (``ctx.progress_callback()`` builds
    it), so each task has its own row. It sends at most one update per ``interval`` seconds (or
    every ``every_n_steps`` batches) plus one at each epoch end; logs are converted to numbers
    only when sent, so the training loop is not synchronised every batch.

    Args:
        ctx: the WorkerContext (optional; reports go to the run this process belongs to).
        batch_size: examples one training step consumes on this worker (usually the batch size of
            the dataset given to ``fit``); the display then shows examples/s = steps/s x batch_size.
            Keras does not tell callbacks the batch size, so without it only steps/s is shown.
        interval: minimum seconds between two step updates.
        every_n_steps: report every N batches instead of by time.

    Returns:
        A ``tf.keras.callbacks.Callback``.

    Raises:
        ConfigError: a bad batch_size, interval or every_n_steps.

    Example:
        >>> def train_fn(ctx):
        ...     ...
        ...     model.fit(ds, epochs=3, callbacks=[ctx.progress_callback(batch_size=64)])
    """
    if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                                   or batch_size < 1):
        raise ConfigError(f"batch_size={batch_size!r} must be an int >= 1 (examples per step on this worker)")
    if _number(interval) is None or interval < 0:
        raise ConfigError(f"interval={interval!r} must be a number of seconds >= 0")
    if every_n_steps is not None and (not isinstance(every_n_steps, int) or every_n_steps < 1):
        raise ConfigError(f"every_n_steps={every_n_steps!r} must be an int >= 1, or None to report by time")
    from ._deps import require

    tf = require("tensorflow", "the tfnb Keras progress callback")

    class TfnbProgress(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            # tf-keras then hands us tensors and skips its per-batch device sync; we convert only what we send
            self._supports_tf_logs = True
            self.epoch = 0
            self.epochs = None
            self.steps = None
            self._batches = 0        # batches done in this epoch
            self._done = 0           # batches done in this fit
            self._mark = (time.monotonic(), 0)  # (time, _done) at the last rate measurement
            self._epoch_start = (time.monotonic(), 0)
            self._last_batch_time = time.monotonic()

        def _send(self, logs, **fields):
            data = {"epoch": self.epoch + 1, "epochs": self.epochs, "step": self._batches, "steps": self.steps}
            data.update(fields)
            if batch_size is not None:
                data["batch_size"] = batch_size
                if data.get("steps_per_sec") is not None:
                    data["examples_per_sec"] = data["steps_per_sec"] * batch_size
            for key, value in (logs or {}).items():
                if key in ("batch", "size") or key in data:
                    continue
                num = _tensor_number(value)
                if num is not None:
                    data[key] = num
            events.emit(events.PROGRESS, **{k: v for k, v in data.items() if v is not None})

        def on_train_begin(self, logs=None):
            params = self.params or {}
            self.epochs = params.get("epochs")
            self.steps = params.get("steps")
            events.emit(events.PROGRESS, **{k: v for k, v in
                                            {"epochs": self.epochs, "steps": self.steps,
                                             "batch_size": batch_size}.items() if v is not None})

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            self._batches = 0
            now = time.monotonic()
            self._mark = self._epoch_start = (now, self._done)

        def on_train_batch_end(self, batch, logs=None):
            # batch is the index within the epoch; with steps_per_execution > 1 some indices are skipped
            done = batch + 1
            self._done += max(done - self._batches, 0)
            self._batches = done
            now = self._last_batch_time = time.monotonic()
            t0, n0 = self._mark
            if every_n_steps is not None:
                if self._done - n0 < every_n_steps:
                    return
            elif now - t0 < interval:
                return
            self._mark = (now, self._done)
            self._send(logs, steps_per_sec=(self._done - n0) / (now - t0) if now > t0 else None)

        def on_epoch_end(self, epoch, logs=None):
            t0, n0 = self._epoch_start
            # the epoch's rate up to its last batch, leaving validation time out
            dt = self._last_batch_time - t0
            rate = (self._done - n0) / dt if dt > 0 and self._done > n0 else None
            self._send(logs, epoch_end=True, steps_per_sec=rate)

    return TfnbProgress()


def _tensor_number(value: Any) -> float | None:
    """A scalar tensor / numpy value / number as float; None for anything else."""
    try:
        if hasattr(value, "numpy"):
            value = value.numpy()
        if getattr(value, "size", 1) != 1:
            return None
        if hasattr(value, "item"):
            value = value.item()
    except Exception:  # noqa: BLE001 - a symbolic or odd value is simply not reported
        return None
    return _number(value)
