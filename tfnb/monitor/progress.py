"""What a run's events mean on the driver: :class:`RunProgress` (one :class:`WorkerProgress` per task) folds the
:class:`tfnb.RunEvent` s into the plain data every display (:mod:`tfnb.notebook`) renders."""
from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from .. import _protocol as events
from .._protocol import RunEvent
from .._protocol import number as _number


# Progress fields with a column of their own; every other number is shown as a metric.
_CORE_FIELDS = frozenset({"epoch", "epochs", "step", "steps", "global_step", "steps_per_sec",
                          "examples_per_sec", "batch_size", "epoch_end", "loss", "time"})
_ROLE_ORDER = {"chief": 0, "worker": 1, "ps": 2, "evaluator": 3}
_MAX_LINE = 2000  # characters of one log line kept for display; a runaway line should not flood the page
SUMMARY_ABOVE = 16  # tasks; more than this and displays show a summary with the rows paged or left out
CHART_TASKS = 16    # tasks with a curve (chief and workers 1..15): more lines than that read as noise
CHART_POINTS = 512  # points kept per curve; past that every other one goes, so a long fit keeps its shape
STATES = ("pending", "starting", "training", "serving", "stalled", "done", "stopped", "failed")


@dataclass
class WorkerProgress:
    """One task of the current attempt: its latest report (``epoch`` 1-based, ``step`` in the epoch, other numbers
    in ``metrics``), the ``history`` of its states, ``error`` when it failed, ``live``: its current carriage-return
    line (a Keras ``verbose=1`` bar), ``gpus``: what Spark gave it (None until it started)."""

    job_name: str
    task_index: int
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
    live: str | None = None
    gpus: list | None = None

    @property
    def state(self) -> str:
        """The latest of :data:`STATES` (``stalled``: alive but silent too long)."""
        return self.history[-1] if self.history else "pending"

    @property
    def label(self) -> str:
        return f"{self.job_name} {self.task_index}"

    @property
    def progress(self) -> float | None:
        """Batches done over the whole fit, or None before any step was reported."""
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


def _int(value: Any) -> int | None:
    n = _number(value)
    return int(n) if n is not None else None


@dataclass
class RunProgress:
    """The state of a run as its events describe it: ``workers`` by ``(job_name, task_index)``, the ``attempt``,
    ``outcome`` (None while running, then ``succeeded``, ``failed`` or ``stopped``), the latest ``logs`` lines and
    ``curves``: ``(job_name, task_index) -> [(x, {"loss": .., ...}), ...]`` of the first :data:`CHART_TASKS` chief and
    worker tasks across relaunches, x the fractional epoch (``chart_unit``) or the step."""

    workers: dict = field(default_factory=dict)
    attempt: int = 1
    max_attempts: int | None = None
    outcome: str | None = None
    relaunch_reason: str | None = None
    log_file: str | None = None
    logs: deque = field(default_factory=lambda: deque(maxlen=100))
    started: float | None = None  # time of the first event
    finished: float | None = None
    shape: tuple = field(default=(None, 0), repr=False)  # (num_workers, num_ps): the rows to pre-fill
    curves: dict = field(default_factory=dict, repr=False)
    chart_unit: str = "epoch"
    chart_version: int = 0
    _live: set = field(default_factory=set, repr=False)  # keys of the tasks showing a carriage-return line

    @classmethod
    def for_run(cls, num_workers: int | None = None, num_ps: int = 0, *, max_attempts: int | None = None,
                log_lines: int = 100) -> "RunProgress":
        run = cls(max_attempts=max_attempts, logs=deque(maxlen=log_lines))
        run._prefill(num_workers, num_ps)
        return run

    def _prefill(self, num_workers: int | None, num_ps: int) -> None:
        self.shape = (num_workers, num_ps)
        if num_workers:
            keys = [("chief", 0), *(("worker", r) for r in range(1, num_workers)), *(("ps", i) for i in range(num_ps))]
            self.workers.update((key, WorkerProgress(*key)) for key in keys)

    def rows(self) -> list[WorkerProgress]:
        return [self.workers[k] for k in sorted(self.workers, key=_sort_key)]

    def worker(self, job_name: str, task_index: int) -> WorkerProgress:
        key = (job_name, task_index)
        return self.workers.get(key) or self.workers.setdefault(key, WorkerProgress(*key))

    def counts(self) -> dict:
        return dict(Counter(w.state for w in self.workers.values()))

    def large(self) -> bool:
        """True when displays should summarise rather than list every task."""
        return len(self.workers) > SUMMARY_ABOVE

    def ranked(self) -> tuple[list, list]:
        """``(training, stragglers)``: reporting training tasks slowest first, and those at least 10% (and one batch)
        behind the median task: they hold everybody's synchronous step back."""
        training = sorted((w for w in self.workers.values() if w.state == "training" and w.progress is not None),
                          key=lambda w: (w.progress, _sort_key((w.job_name, w.task_index))))
        if len(training) < 3:
            return training, []
        median = training[len(training) // 2].progress
        lag = max(0.1 * median, 1.0)
        return training, [w for w in training if w.progress <= median - lag]

    def notable(self) -> list:
        """The tasks a large run's display shows first: failed, stalled, stragglers, then the rest."""
        _, stragglers = self.ranked()
        slow = {id(w): i for i, w in enumerate(stragglers)}

        def key(w):
            first = {"failed": 0, "stalled": 1}.get(w.state, 2 if id(w) in slow else 3)
            return (first, slow.get(id(w), 0), _sort_key((w.job_name, w.task_index)))

        return sorted(self.workers.values(), key=key)

    def summary_lines(self, names: int = 5) -> list[str]:
        """The summary a large run shows: slowest/fastest task, stragglers (up to ``names`` named)."""
        training, stragglers = self.ranked()
        lines = []
        if training:
            rate = self.examples_per_sec()
            total = f" · {_short(rate)} examples/s in total" if rate is not None else ""
            fastest = max(training, key=lambda w: w.progress)  # the lowest rank among equals
            lines.append(f"slowest {_where(training[0])} · fastest {_where(fastest)}{total}")
        if stragglers:
            named = ", ".join(w.label for w in stragglers[:names])
            more = f" (+{len(stragglers) - names} more)" if len(stragglers) > names else ""
            lines.append(f"{len(stragglers)} straggler{'s' if len(stragglers) > 1 else ''}: {named}{more}")
        stalled = [w.label for w in self.workers.values() if w.state == "stalled"]
        if stalled:
            more = f" (+{len(stalled) - names} more)" if len(stalled) > names else ""
            lines.append(f"stalled: {', '.join(stalled[:names])}{more}")
        return lines

    def examples_per_sec(self) -> float | None:
        rates = [w.examples_per_sec for w in self.workers.values()
                 if w.state == "training" and w.examples_per_sec is not None]
        return sum(rates) if rates else None

    def apply_batch(self, batch) -> tuple[bool, bool, set | None]:
        """Fold events in order, as :meth:`apply` does each: ``(changed, lines, tasks)``, whether anything visible
        changed, whether log lines arrived, the keys of the rows that changed (None: every row, after a relaunch)."""
        changed = lines = False
        tasks: set | None = set()
        for plain, event in self.fold(batch):
            if plain is not None:
                changed = lines = True
            elif self.apply(event):
                changed = True
                if event.kind == events.LOG:
                    lines = True
                elif event.job_name == "driver":
                    tasks = None if event.kind == events.ATTEMPT else tasks
                elif tasks is not None:
                    tasks.add((event.job_name, event.task_index))
        return changed, lines, tasks

    def fold(self, batch):
        """Fold ``batch``'s runs of plain log lines (:func:`_runs`; nearly all of a large run's events) as
        :meth:`apply` would, formatting only the newest kept: yields ``(lines, None)`` or ``(None, event)`` to apply."""
        shown: list = []  # the lines not in logs yet: added before any line that comes another way, and at the end
        try:
            for plain, event in _runs(batch, self.workers):
                if plain is None:
                    if shown and event.kind == events.LOG:
                        self._keep(shown)
                    yield None, event
                    continue
                if self.started is None:
                    self.started = plain[0].time
                for e in plain if self._live else ():
                    key = (e.job_name, e.task_index)
                    if key in self._live:
                        self._live.discard(key)
                        self.workers[key].live = None  # the bar's line ended
                shown += plain
                yield plain, None
        finally:
            self._keep(shown)

    def _keep(self, shown: list) -> None:
        keep = self.logs.maxlen
        self.logs.extend(f"[{e.job_name} {e.task_index}] {e.data['line'][:_MAX_LINE]}"
                         for e in (shown if keep is None else shown[-keep:]))
        shown.clear()

    def apply(self, event: RunEvent) -> bool:
        """Fold one event into the state; True when something visible changed."""
        data = event.data or {}
        if self.started is None:
            self.started = event.time
        if event.job_name == "driver":
            return self._apply_driver(event.kind, data)
        key = (event.job_name, event.task_index)
        w = self.worker(*key)
        if event.kind == events.LOG:  # the hot path: thousands of lines a second in a large run
            line = str(data.get("line", ""))
            if data.get("partial") or "\r" in line:  # carriage-return output (progress bars): one line per task
                line = _last_segment(line)
            if data.get("partial"):
                w.live = line[:_MAX_LINE]
                self._live.add(key)
                return True
            w.live = None  # the bar's line ended (tasks send its final state as the line): keep it in the log
            self._live.discard(key)
            self.logs.append(f"[{event.job_name} {event.task_index}] {line[:_MAX_LINE]}")
            return True
        if event.kind == events.STATE:
            state = str(data.get("state", ""))
            if not state or w.state == "failed":
                # the failure is the news; a later "stopped" from the same task would hide it
                return False
            w.history.append(state)
            if isinstance(data.get("gpus"), (list, tuple)):
                w.gpus = [str(g) for g in data["gpus"]]
            return True
        if event.kind == events.FAILED:
            w.history.append("failed")
            w.error = f"{data.get('exc_type', 'Error')}: {data.get('message', '')}".rstrip(": ")
            return True
        if event.kind == events.PROGRESS:
            self._apply_progress(w, data)
            if event.task_index < CHART_TASKS and event.job_name in ("chief", "worker"):
                self._add_point(w, data)
            return True
        return False

    def _add_point(self, w: WorkerProgress, data: dict) -> None:
        values = {k: n for k, v in data.items()
                  if (k == "loss" or k not in _CORE_FIELDS) and (n := _number(v)) is not None}
        if not values:
            return
        if w.epoch is not None and w.steps:
            x = w.epoch - 1 + (w.step or 0) / w.steps
        elif w.epoch is not None and data.get("epoch_end"):
            x = float(w.epoch)  # steps per epoch unknown: the epoch ends are the curve
        elif w.epoch is None and w.step is not None:
            x, self.chart_unit = float(w.step), "step"
        else:
            return
        curve = self.curves.setdefault((w.job_name, w.task_index), [])
        curve.append((x, values))
        if len(curve) > CHART_POINTS:
            del curve[1:-1:2]
        self.chart_version += 1

    def _apply_driver(self, kind: str, data: dict) -> bool:
        if "max_attempts" in data:
            self.max_attempts = _int(data["max_attempts"]) or self.max_attempts
        if kind == events.ATTEMPT:
            self.attempt = _int(data.get("attempt")) or self.attempt + 1
            self.relaunch_reason = str(data.get("reason", "")) or None
            self.workers.clear()
            self._live.clear()
            # an elastic run's relaunch may have another size: one row per task of the new launch
            self._prefill(_int(data.get("workers")) or self.shape[0], self.shape[1])
            return True
        if kind == events.STATE and data.get("log_file"):
            self.log_file = str(data["log_file"])
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
        loss, steps_rate, ex_rate, batch = (_number(data.get(k)) for k in
                                            ("loss", "steps_per_sec", "examples_per_sec", "batch_size"))
        if ex_rate is None and steps_rate is not None and batch:
            ex_rate = steps_rate * batch
        w.loss = w.loss if loss is None else loss
        w.steps_per_sec = w.steps_per_sec if steps_rate is None else steps_rate
        w.examples_per_sec = w.examples_per_sec if ex_rate is None else ex_rate
        for key, value in data.items():
            if key not in _CORE_FIELDS and _number(value) is not None:
                w.metrics[key] = _number(value)
        if not w.history:  # a report means the task trains, even if its state change was not seen
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
        counts, total = self.counts(), len(self.workers)
        parts = [f"Running ({attempt}), {elapsed}", *(f"{counts[s]}/{total} {s}" for s in STATES[1:] if counts.get(s))]
        rate = self.examples_per_sec()
        if rate is not None:
            parts.append(f"{_short(rate)} examples/s")
        if self.attempt > 1 and self.relaunch_reason:
            parts.append(f"relaunched after {self.relaunch_reason}")
        return " · ".join(parts)


def _runs(batch, workers: dict):
    """``batch`` in order: runs of plain log lines of tasks in ``workers`` ``(lines, None)``, others ``(None, e)``."""
    plain, log_kind = [], events.LOG
    for event in batch:
        if event.kind == log_kind:
            data = event.data
            line = data.get("line")
            if type(line) is str and "\r" not in line and not data.get("partial") and \
                    (event.job_name, event.task_index) in workers:
                plain.append(event)
                continue
        if plain:
            yield plain, None
            plain = []
        yield None, event
    if plain:
        yield plain, None


def _last_segment(line: str) -> str:
    """What a terminal shows for a line with carriage returns: the text after the last one."""
    parts = [p for p in line.split("\r") if p.strip()]
    return parts[-1] if parts else ""


def _where(w: WorkerProgress) -> str:
    at = f"epoch {_of(w.epoch, w.epochs)} step {_of(w.step, w.steps)}" if w.epoch else f"step {_of(w.step, w.steps)}"
    rate = f", {_short(w.examples_per_sec)} examples/s" if w.examples_per_sec is not None else ""
    return f"{w.label} ({at}{rate})"


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
    return "" if value is None else f"{value}/{total}" if total else str(value)


def gpu_list(gpus: list | None) -> str:
    """A task's GPU addresses as shown: ``"0,1"``, ``"none"``, or ``""`` before the task said."""
    return "" if gpus is None else ",".join(gpus) or "none"
