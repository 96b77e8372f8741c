"""The consoles: :class:`Console`, what a run's and a sweep's share, and the run's :class:`ConsoleDisplay`, what a
run shows outside a notebook widget (a script, a CI log, ``TFNB_DISPLAY=console``)."""
from __future__ import annotations

import sys
import time
from typing import TextIO

from .. import _protocol as events
from .._config import check_seconds
from .._protocol import RunEvent
from ..monitor.progress import (_CORE_FIELDS, SUMMARY_ABOVE, RunProgress, WorkerProgress, _last_segment, _of,
                                _short, gpu_list)


class Console:
    """Lines to ``stream`` (default: the current ``sys.stdout``); while ``_held`` is a list they gather there for one
    write, and above a tqdm bar they go through the bar."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream
        self._bar = None
        self._held: list | None = None

    def _out(self) -> TextIO:
        return self.stream or sys.stdout

    def _print(self, text: str) -> None:
        if self._held is not None:
            self._held.append(text)
        elif self._bar is not None:
            self._bar.write(text, file=self._out())
        else:
            print(text, file=self._out(), flush=True)

    def close(self) -> None:
        pass


class ConsoleDisplay(Console):
    """Console output of a run: ``[worker 1] ...`` log lines, epoch summaries and a progress line.

    On a terminal the progress is a tqdm bar below the log lines; elsewhere a progress line and each task's latest
    carriage-return line (a Keras ``verbose=1`` bar) at most every ``interval`` seconds (see docs/monitoring.md).

    Args:
        stream: where to write (default: the current ``sys.stdout``).
        num_workers, num_ps, max_attempts: chief + worker tasks, parameter-server tasks, launches (optional).
        interval: seconds between two plain progress lines (not on a terminal).
        tty: force the terminal (tqdm) or plain form; default: ``stream.isatty()``.

    Example:
        >>> from tfnb import ConsoleDisplay
        >>> tfnb.run(train_fn, num_workers=2, display=ConsoleDisplay(interval=60))
    """

    def __init__(self, stream: TextIO | None = None, *, num_workers: int | None = None, num_ps: int = 0,
                 max_attempts: int | None = None, interval: float = 30.0, tty: bool | None = None):
        super().__init__(stream)
        self.interval = check_seconds("interval", interval, zero=True)
        self._tty = tty
        self.run = RunProgress.for_run(num_workers, num_ps, max_attempts=max_attempts)
        self._last_line = self._last_live = self._last_bar = float("-inf")
        self._live_pending: dict = {}  # task label -> its WorkerProgress, whose carriage-return line is not printed

    def _is_tty(self) -> bool:
        if self._tty is None:
            try:
                self._tty = bool(self._out().isatty())
            except (AttributeError, ValueError):
                self._tty = False
        return self._tty

    def batch(self, events_: list) -> None:
        """Show a batch of events with one write: at scale a flush per line costs more than the line."""
        self._held = held = []
        try:
            for plain, event in self.run.fold(events_):
                if plain is None:
                    self(event)
                    continue
                # plain lines, most of what a large run sends: what __call__ does, without the detours
                held.extend(f"[{e.job_name} {e.task_index}] {e.data['line']}" for e in plain)
        finally:
            held, self._held = self._held, None
            if held:
                self._print("\n".join(held))

    def __call__(self, event: RunEvent) -> None:
        self.run.apply(event)
        data = event.data or {}
        if event.kind == events.LOG:
            self._on_log(event, data)
        elif event.kind == events.STATE:
            self._on_state(event, data)
        elif event.kind == events.FAILED:
            self._print(f"[{event.label}] FAILED {data.get('exc_type')}: {data.get('message')}")
        elif event.kind == events.ATTEMPT:
            self._close_bar()
            of = "" if data.get("resize") else f"/{data.get('max_attempts')}"  # a resize is no failed launch
            self._print(f"[tfnb] relaunching (attempt {data.get('attempt')}{of}) after: {data.get('reason')}")
        elif event.kind == events.PROGRESS:
            self._on_progress(event, data)

    def _on_log(self, event: RunEvent, data: dict) -> None:
        line = str(data.get("line", ""))
        if data.get("partial"):
            w = self.run.workers.get((event.job_name, event.task_index))
            if w is not None and w.live:
                self._live_pending[event.label] = w
            self._flush_live()
            return
        if "\r" in line:
            if self.run.large() and event.job_name != "chief":
                return  # a finished bar from each of hundreds of tasks: the summary speaks for them
            line = _last_segment(line)
        self._print(f"[{event.label}] {line}")

    def _flush_live(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self._live_pending or (not force and now - self._last_live < self.interval):
            return
        self._last_live = now
        # a line that ended since (w.live is None) was printed in full
        pending, self._live_pending = [(label, w.live) for label, w in self._live_pending.items() if w.live], {}
        if len(pending) > SUMMARY_ABOVE:
            self._print(f"[tfnb] {len(pending)} tasks updating; {self.run.status_text()}")
            return
        for label, text in pending:
            self._print(f"[{label}] {text}")

    def _on_state(self, event: RunEvent, data: dict) -> None:
        state = data.get("state")
        if event.job_name == "driver":
            self._close_bar()
            if data.get("log_file"):
                self._print(f"[tfnb] every line of this run: {data['log_file']}")
            if state in ("succeeded", "failed"):
                self._flush_live(force=True)
                self._print(f"[tfnb] {self.run.status_text()}")
        elif state == "stalled" or (state in ("training", "serving", "done") and not self.run.large()):
            # "starting" and "stopped" add little on a console: the first log line or the failure says more
            self._print(f"[{event.label}] {state}")
        elif state == "starting" and data.get("gpus") and not self.run.large():  # except which GPUs it was given
            gpus = gpu_list(self.run.workers[(event.job_name, event.task_index)].gpus)
            self._print(f"[{event.label}] starting on GPU{'s' if ',' in gpus else ''} {gpus}")

    def _on_progress(self, event: RunEvent, data: dict) -> None:
        w = self.run.workers.get((event.job_name, event.task_index))
        # a large run prints the chief's epoch summaries only; its summary line speaks for the rest
        epoch_line = data.get("epoch_end") and w is not None and (not self.run.large() or w.job_name == "chief")
        now, tty = time.monotonic(), self._is_tty()
        if tty and (now - self._last_bar >= 0.2 or data.get("epoch_end")):
            self._last_bar = now  # finding the slowest task is O(tasks): at most 5 bar updates a second
            self._update_bar()
        if epoch_line:
            self._print(f"[{event.label}] {self._epoch_summary(w)}")
        elif tty or now - self._last_line < self.interval:
            return
        elif not _CORE_FIELDS.intersection(data) - {"time"}:  # a custom ctx.report(...): show what was sent
            sent = (f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in data.items() if k != "time")
            self._print(f"[{event.label}] {' '.join(sent)}")
        elif data.get("step") is not None:
            self._print(f"[tfnb] {self._progress_line()}")
            for line in self.run.summary_lines() if self.run.large() else ():
                self._print(f"[tfnb] {line}")
        else:
            return
        self._last_line = now

    @staticmethod
    def _epoch_summary(w: WorkerProgress) -> str:
        rate = (f"{_short(w.examples_per_sec)} examples/s" if w.examples_per_sec is not None
                else f"{_short(w.steps_per_sec)} steps/s" if w.steps_per_sec is not None else "")
        metrics = (f"{k}={v:.4g}" for k, v in sorted(w.metrics.items()))
        return _join(f"epoch {_of(w.epoch, w.epochs)}", _loss(w), *metrics, rate)

    def _lead(self) -> tuple[WorkerProgress | None, str, str]:
        """The task that bounds the run's progress (the fewest batches done), the total examples/s, tasks training."""
        rate = self.run.examples_per_sec()
        return (next(iter(self.run.ranked()[0]), None), "" if rate is None else _short(rate),
                f"{self.run.counts().get('training', 0)}/{len(self.run.workers)} training")

    def _progress_line(self) -> str:
        (w, rate, training), counts = self._lead(), self.run.counts()
        lead = () if w is None else (f"epoch {_of(w.epoch, w.epochs)}" if w.epoch is not None else "",
                                     f"step {_of(w.step, w.steps)}", _loss(w))
        return _join(*lead, rate and f"{rate} examples/s", training,
                     *(f"{counts[s]} {s}" for s in ("stalled", "failed") if counts.get(s)))

    def _update_bar(self) -> None:
        w, rate, training = self._lead()
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
        bar.set_postfix_str(", ".join(p for p in (_loss(w), rate and f"{rate} ex/s", training) if p), refresh=False)
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
        self._flush_live(force=True)
        self._close_bar()


def _loss(w: WorkerProgress) -> str:
    return "" if w.loss is None else f"loss={w.loss:.4g}"


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)
