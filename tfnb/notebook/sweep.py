"""A sweep, shown: the live panel in a notebook (:class:`SweepPanel`) and the same as lines (:class:`SweepConsole`),
on the run's panel and console bases; both fold the sweep's :class:`tfnb.RunEvent` s into one :class:`SweepModel`."""
from __future__ import annotations

import html
import time
from collections import Counter, deque

from .._protocol import EventKind, RunEvent
from ..monitor.charts import figure, png
from ..monitor.progress import _num, _of
from ..tuning.outcomes import STATES, SweepResult, TrialResult, better, format_params
from .console import Console
from .progress import COLOURS, Panel, note, pre, state_cell, status_line, table, tr

LOG_LINES = 40       # lines of a trial's output its section shows
_KEEP_LINES = 200    # lines kept per trial


class SweepModel:
    """What a sweep display knows: the sweep's shape, every trial's latest row and output, the result."""

    def __init__(self, shape: dict | None = None):
        self.info: dict = dict(shape or {})  # what the display factory was told, until the sweep's BEGIN
        self.rows: dict[int, TrialResult] = {}
        self.lines: dict[int, deque] = {}
        self.result: SweepResult | None = None
        self.version = 0  # bumped on each change of a row (the chart's cue)

    def apply(self, event: RunEvent) -> TrialResult | None:
        """Fold one event in; returns the trial row it changed, if any."""
        if event.kind == EventKind.BEGIN:
            self.info.update(event.data)
        elif event.kind == EventKind.FINISH:
            self.result = event.result
        elif event.trial is not None:
            number = event.trial.number
            if event.kind == EventKind.LINES:
                self.lines.setdefault(number, deque(maxlen=_KEEP_LINES)).extend(event.lines)
                self.rows.setdefault(number, event.trial)
            else:
                self.rows[number] = event.trial
                self.version += 1
            return self.rows[number]
        return None

    @property
    def metric(self) -> str:
        return self.info.get("metric", "objective")

    @property
    def direction(self) -> str:
        return self.info.get("direction", "minimize")

    def best(self) -> TrialResult | None:
        done = [r for r in self.rows.values() if r.state == "complete" and better(r.value, None, self.direction)]
        return (min if self.direction == "minimize" else max)(done, key=lambda r: r.value, default=None)

    def status(self) -> str:
        counts = Counter(row.state for row in self.rows.values())
        parts = [f"{sum(counts[s] for s in STATES[3:])}/{self.info.get('n_trials', '?')} trials done"]
        if self.result is None:
            parts.append(f"{sum(counts[s] for s in STATES[:3])} running ({self.info.get('at_once', '?')} at a time, "
                         f"{self.info.get('slots_per_trial', '?')} task slot(s) each)")
        parts += [f"{counts[s]} {s}" for s in STATES[3:] if counts[s]]
        best = self.best()
        if best is not None:
            parts.append(f"best: trial {best.number} {self.metric}={best.value:.4g} ({format_params(best.params)})")
        if self.result is not None and self.result.stopped:
            parts.append(f"stopped: {self.result.stopped}")
        return "; ".join(parts)


class SweepConsole(Console):
    """A sweep as lines: each trial's start, epochs, end and log file, then a summary; never the trials' own output.

    Args:
        stream: where to write (default: the current ``sys.stdout``).

    Example:
        >>> tfnb.sweep(train_fn, space, n_trials=8, num_workers=1, display=SweepConsole())
    """

    def __init__(self, stream=None, **shape):
        super().__init__(stream)
        self.model = SweepModel(shape)
        self._said: dict[int, tuple] = {}  # trial -> (state, epoch, log file) last printed

    def __call__(self, event: RunEvent) -> None:
        row = self.model.apply(event)
        if event.kind == EventKind.BEGIN:
            d = event.data
            resumed = f", {d['done_before']} trials before" if d.get("done_before") else ""
            tracked = f"; MLflow run {d['mlflow_run_id']}" if d.get("mlflow_run_id") else ""
            self._print(f"[sweep] {d.get('n_trials')} trials, {d.get('at_once')} at a time "
                        f"({d.get('slots_per_trial')} task slot(s) each on {d.get('master') or 'Spark'}); "
                        f"{d.get('direction')} {d.get('metric')}; study {d.get('study')}{resumed}{tracked}")
        elif event.kind == EventKind.TRIAL and row is not None:
            self._trial(row)
        elif event.kind == EventKind.FINISH and event.result is not None:
            for line in summary_lines(event.result):
                self._print(f"[sweep] {line}")

    def _trial(self, row: TrialResult) -> None:
        state, epoch, log_file = self._said.get(row.number, (None, None, None))
        label, metric = f"[trial {row.number}]", self.model.metric
        if state is None:
            self._print(f"{label} started: {format_params(row.params)}")
        if row.log_file and row.log_file != log_file:
            self._print(f"{label} every line: {row.log_file}")
        if row.epoch is not None and row.epoch != epoch and not row.done:
            self._print(f"{label} epoch {_of(row.epoch, row.epochs)} {metric}={_num(row.value)}")
        if row.done and state != row.state:
            self._print(f"{label} {end_text(row, metric, self.model.best())}")
        self._said[row.number] = (row.state, row.epoch, row.log_file)


def end_text(row: TrialResult, metric: str, best: TrialResult | None = None) -> str:
    """How a finished trial went, in one line."""
    took = f"in {row.seconds:.1f} s"
    if row.state == "complete":
        lead = "; best so far" if best is not None and best.number == row.number else ""
        return f"complete: {metric}={_num(row.value)} {took}{lead}"
    if row.state == "pruned":
        return f"pruned at epoch {row.epoch} ({metric}={_num(row.value)}) {took}"
    where = f" (every line: {row.log_file})" if row.log_file and row.state == "failed" else ""
    return f"{row.state} {took}: {row.error}{where}"


def summary_lines(result: SweepResult) -> list[str]:
    """The result as a small table, for the console and a cell's text."""
    names = sorted({k for t in result.trials for k in t.params})
    rows = [_head(names, result.metric)] + [_cells(t, names) for t in result.trials]
    widths = [max(map(len, column)) for column in zip(*rows)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return [f"{result.summary()} in {result.seconds:.1f} s"] + ["  " + line for line in lines]


def _head(names: list, metric: str) -> list[str]:
    return ["trial", "state", *names, "epoch", metric, f"best {metric}", "seconds"]


def _cells(row: TrialResult, names: list) -> list[str]:
    """A trial's row of the tables, as text."""
    seconds = row.seconds if row.done else time.time() - row.started
    params = ("" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v) for v in map(row.params.get, names))
    return [str(row.number), row.state, *params, _of(row.epoch, row.epochs), _num(row.value), _num(row.best),
            f"{seconds:.1f}"]


class SweepChart:
    """The panel's chart: each trial's objective with the best so far (left), each trial's metric by epoch (right)."""

    def __init__(self, width: float = 8.0, height: float = 2.6):
        self.fig = figure(width, height)
        self.trials_ax, self.epochs_ax = self.fig.subplots(1, 2)
        self.fig.subplots_adjust(left=0.08, right=0.99, bottom=0.2, top=0.88, wspace=0.22)

    def png(self, rows: list, metric: str, direction: str) -> bytes:
        from matplotlib.ticker import MaxNLocator

        ax, curves = self.trials_ax, self.epochs_ax
        for a, title, x in ((ax, f"{metric} by trial ({'lower' if direction == 'minimize' else 'higher'} is better)",
                             "trial"), (curves, f"{metric} by epoch", "epoch")):
            a.clear()
            a.tick_params(labelsize=7)
            a.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))  # trials and epochs are counted
            a.set_title(title, fontsize=9)
            a.set_xlabel(x, fontsize=8)
        for state, style in (("complete", dict(marker="o")), ("pruned", dict(marker="x")),
                             ("running", dict(marker="o", mfc="none"))):
            points = [(r.number, r.value) for r in rows if r.value is not None
                      and (r.state == state or (state == "running" and not r.done))]
            if points:
                ax.plot(*zip(*points), linestyle="none", markersize=5, label=state, color=COLOURS[state], **style)
        best, steps = None, []  # the best complete objective up to each complete trial
        for r in (r for r in rows if r.state == "complete"):
            best = r.value if better(r.value, best, direction) else best
            steps += [] if best is None else [(r.number, best)]
        if steps:
            ax.step(*zip(*steps), where="post", color="#222", linewidth=1, label="best so far")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, frameon=False)
        for row in rows:
            if row.curve:
                xs, ys = zip(*row.curve)
                curves.plot(xs, ys, linewidth=1.0, marker="." if len(xs) < 20 else "",
                            color=COLOURS.get(row.state, "#888"), linestyle="--" if row.state == "pruned" else "-")
        return png(self.fig)


def render_table(model: SweepModel) -> str:
    """The trials as an HTML table (escaped: params and errors come from user code)."""
    names, best, body = sorted({k for r in model.rows.values() for k in r.params}), model.best(), []
    for number in sorted(model.rows):
        row = model.rows[number]
        cells = [html.escape(c) for c in _cells(row, names)]
        cells[0] = f"<b>{number}</b>" if best is not None and best.number == number else cells[0]
        cells[1] = state_cell(row.state, row.error if row.state != "pruned" else None, 200)
        body.append(tr(cells))
    return table("tfnb-sweep", map(html.escape, _head(names, model.metric)), body)


class SweepPanel(Panel):
    """The live panel of a sweep in a notebook (ipywidgets): status, chart, table of trials, each trial's latest
    output in a collapsed section (see docs/sweeps.md); ``refresh_interval`` and ``chart_interval`` as for a run's.

    Attributes:
        model: the :class:`SweepModel` rendered. ``status``, ``table``: ``ipywidgets.HTML``; ``chart``:
            ``ipywidgets.Image`` (None without matplotlib); ``logs``: the Accordion; ``box``: the whole panel.

    Example:
        >>> result = tfnb.sweep(train_fn, space, n_trials=20, num_workers=1, display=tfnb.notebook.SweepPanel())
    """

    _what = "sweep panel"

    def __init__(self, *, refresh_interval: float = 0.5, chart_interval: float = 1.0, **shape):
        super().__init__(refresh_interval, chart_interval)
        self.model = SweepModel(shape)
        self.logs = self._widgets.Accordion(children=[], selected_index=None)
        self._log_views: dict[int, object] = {}  # trial -> its HTML in the accordion
        self._dirty_logs: set[int] = set()
        self._build("tfnb-sweep-panel", self.table, self.logs)

    def _fold(self, batch) -> bool:
        for event in batch:
            row = self.model.apply(event)
            if event.kind == EventKind.LINES and row is not None:
                self._dirty_logs.add(row.number)
        return True

    def _render_parts(self) -> None:
        colour = "#cf222e" if self.model.result is not None and self.model.result.stopped else "inherit"
        self.status.value = status_line(colour, f"tfnb sweep: {self.model.status()}")
        self.table.value = render_table(self.model)
        new = [n for n in sorted(self.model.rows) if n not in self._log_views]
        for number in new:
            self._log_views[number] = self._widgets.HTML()
            self._dirty_logs.add(number)
        if new:
            self.logs.children = [self._log_views[n] for n in sorted(self._log_views)]
        for i, number in enumerate(sorted(self._log_views)):
            row = self.model.rows[number]
            title = f"trial {number}: {row.state}" + (f", epoch {_of(row.epoch, row.epochs)}" if row.epoch else "")
            if self.logs.get_title(i) != title:  # ipywidgets 7 (Databricks Runtime 15.4) sends every set_title
                self.logs.set_title(i, title)
            if number in self._dirty_logs:
                lines = "\n".join(list(self.model.lines.get(number, ()))[-LOG_LINES:]) or "(no output yet)"
                where = note(f"every line: <code>{html.escape(row.log_file)}</code>") if row.log_file else ""
                self._log_views[number].value = pre("tfnb-trial-log", lines) + where
        self._dirty_logs.clear()

    def _version(self) -> int:
        return self.model.version

    def _frame_args(self) -> tuple:
        return [self.model.rows[n] for n in sorted(self.model.rows)], self.model.metric, self.model.direction

    _new_chart = SweepChart

    def log_text(self, number: int) -> str:
        """Trial ``number``'s output as its section shows it."""
        return html.unescape(self._log_views[number].value) if number in self._log_views else ""
