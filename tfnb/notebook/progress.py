"""The live panels in a notebook (ipywidgets): :class:`Panel`, what a run's and a sweep's share, and the run's
:class:`ProgressWidget` (the ``widget`` display mode), fed the same RunEvents as the console."""
from __future__ import annotations

import html
import logging
import threading
import time

from .._config import check_seconds
from ..errors import ConfigError
from ..monitor.charts import LiveChart, matplotlib_missing
from ..monitor.display import in_notebook
from ..monitor.progress import SUMMARY_ABOVE as PAGE_ROWS  # rows of the table a large run shows at once
from ..monitor.progress import RunProgress, _num, _of, _short, _sort_key, gpu_list

log = logging.getLogger(__name__)

_LARGE_REFRESH = 1.0       # seconds between re-renders of a large run: its summary is O(tasks)
_LARGE_CHART = 5.0         # seconds between chart frames of a large run: a frame costs tens of ms of CPU

COLOURS = {"pending": "#888", "starting": "#888", "training": "#1f6feb", "serving": "#1f6feb", "running": "#1f6feb",
           "stalled": "#8250df", "done": "#1a7f37", "complete": "#1a7f37", "succeeded": "#1a7f37", "failed": "#cf222e",
           "stopped": "#bf8700", "pruning": "#bf8700", "pruned": "#bf8700", "cancelled": "#888"}  # tasks, trials, runs
_PAD = 'style="padding:2px 14px 2px 0;text-align:left;vertical-align:top"'


def tr(cells, tag: str = "td") -> str:
    return "<tr>" + "".join(f"<{tag} {_PAD}>{c}</{tag}>" for c in cells) + "</tr>"


def table(css: str, head, body) -> str:
    return f'<table class="{css}" style="border-collapse:collapse">' + tr(head, "th") + "".join(body) + "</table>"


def chip(state: str, text: str | None = None) -> str:
    """A state in its colour (``text`` instead of its name, e.g. a count)."""
    return f'<span style="color:{COLOURS.get(state, "#888")};font-weight:600">{html.escape(text or state)}</span>'


def state_cell(state: str, error: str | None, limit: int) -> str:
    """A state, and the error under it (escaped: error messages come from user code)."""
    return chip(state) + (f'<br><span style="color:#cf222e">{html.escape(error[:limit])}</span>' if error else "")


def note(text: str, css: str | None = None) -> str:
    css = f' class="{css}"' if css else ""
    return f'<div{css} style="font-size:smaller;opacity:.7">{text}</div>'


def status_line(colour: str, text: str, log_file: str | None = None) -> str:
    line = f'<div style="color:{colour};font-weight:600">{html.escape(text)}</div>'
    return line + (note(f"every line of this run: <code>{html.escape(log_file)}</code>") if log_file else "")


def _render_row(w) -> str:
    """One task's row as HTML (escaped; log text and error messages come from user code)."""
    speed = (_short(w.examples_per_sec) if w.examples_per_sec is not None
             else f"({_short(w.steps_per_sec)} steps/s)" if w.steps_per_sec is not None else "")
    metrics = " ".join(f"{html.escape(k)}={v:.4g}" for k, v in sorted(w.metrics.items()))
    return tr([html.escape(w.label), html.escape(gpu_list(w.gpus)), state_cell(w.state, w.error, 300),
               _of(w.epoch, w.epochs), _of(w.step, w.steps), _num(w.loss), speed, metrics])


def _render_table(rows: list, cache: dict) -> str:
    """The per-task table as HTML; ``cache`` (task key -> row HTML) holds the rows that did not change."""
    for w in rows:
        if (w.job_name, w.task_index) not in cache:
            cache[w.job_name, w.task_index] = _render_row(w)
    body = [cache[w.job_name, w.task_index] for w in rows]
    return table("tfnb-progress", ("task", "GPUs", "state", "epoch", "step", "loss", "examples/s", "metrics"), body)


def _render_summary(run: RunProgress, page: int, pages: int) -> str:
    """A large run's summary: counts by state, slowest/fastest task, stragglers, which rows are shown."""
    chips = " ".join(chip(s, f"{n} {s}") for s, n in sorted(run.counts().items(), key=lambda kv: -kv[1]))
    lines = [f"{len(run.workers)} tasks: {chips}", *map(html.escape, run.summary_lines()),
             f"<i>tasks of note first (failed, stalled, stragglers); page {page + 1}/{pages}</i>"]
    return '<div class="tfnb-summary">' + "<br>".join(lines) + "</div>"


def pre(css: str, text: str) -> str:
    """``text`` (escaped: it comes from user code) as lines a terminal would show."""
    return f'<pre class="{css}" style="margin:2px 0;white-space:pre-wrap">{html.escape(text)}</pre>'


def _later(wait: float, fn) -> threading.Timer:
    timer = threading.Timer(max(wait, 0.0), fn)
    timer.daemon = True
    timer.start()
    return timer


class Panel:
    """A live widget in one ``box``, re-rendered under a lock at most every ``refresh_interval`` seconds (a timer
    renders the latest state when no further event comes) and at :meth:`close`. Subclasses fold events (``_fold``),
    render (``_render_parts``) and say what the chart draws (``_version``, ``_frame_args``, ``_new_chart``)."""

    _what = "panel"

    def __init__(self, refresh_interval: float, chart_interval: float):
        self.refresh_interval = check_seconds("refresh_interval", refresh_interval, zero=True)
        self.chart_interval = check_seconds("chart_interval", chart_interval, zero=True)
        from .._deps import require

        self._widgets = widgets = require("ipywidgets", f"the tfnb {self._what}")
        self.status, self.table = widgets.HTML(), widgets.HTML()
        missing = matplotlib_missing()
        self.chart = None if missing else widgets.Image(format="png", layout=widgets.Layout(display="none")).add_class(
            "tfnb-chart")
        self._chart_box = widgets.HTML(note(html.escape(missing), "tfnb-chart-missing")) if missing else self.chart
        self._chart = None  # made at the first frame
        self._drawn = (0, float("-inf"))  # (chart version, time) of the last frame
        self._frame: threading.Timer | None = None  # the frame being drawn or waiting for its time
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._last_render = float("-inf")
        self.renders = self.frames = 0
        self._dirty = self._closed = self._shown = False

    def _build(self, css: str, *parts) -> None:
        self.box = self._widgets.VBox([self.status, self._chart_box, *parts])
        self.box.add_class(css)
        self._render()

    @classmethod
    def shown(cls, **kwargs):
        """The ``widget`` display mode: a new panel, shown in the running cell when in a notebook."""
        panel = cls(**kwargs)
        panel._show()
        return panel

    def _show(self) -> None:
        """Show the panel in the running cell, once, when in a notebook (in_notebook() is not free per event)."""
        if not self._shown:
            self._shown = True
            if in_notebook():
                from IPython.display import display

                display(self)

    def _repr_mimebundle_(self, **kwargs):
        self._shown = True
        return self.box._repr_mimebundle_(**kwargs)

    def __call__(self, event) -> None:
        self.batch((event,))

    def batch(self, batch) -> None:
        """Fold a batch of events (in order) into the panel; renders at most once for all of them."""
        self._show()  # passed as display= without being shown first
        with self._lock:
            if self._closed:
                self._closed = False
                self._reopen()
            if not self._fold(batch):
                return
            self._dirty = True
            if self._timer is not None:
                return
            wait = self._last_render + self._interval(self.refresh_interval, _LARGE_REFRESH) - time.monotonic()
            if wait <= 0:
                self._render()
            else:  # render the latest state a little later even if no further event arrives
                self._timer = _later(wait, self._flush)

    def _interval(self, interval: float, large: float) -> float:
        return max(interval, large) if self._large() else interval

    def _large(self) -> bool:
        return False

    def _reopen(self) -> None:  # events after close(): the same panel reused
        pass

    def _flush(self) -> None:
        with self._lock:
            self._timer = None
            if self._dirty and not self._closed:
                self._render()

    def _render(self) -> None:
        self._render_parts()
        self._dirty = False
        self._last_render = time.monotonic()
        self.renders += 1
        self._draw_chart()

    def _draw_chart(self) -> None:
        """Start a frame when the chart's data changed, at most every chart_interval seconds (a large run's further
        apart: the driver's main thread shares the interpreter with the channel thread). The frame is drawn on a
        thread of its own, outside the lock: events go on folding while matplotlib draws (tens of milliseconds)."""
        version, drawn_at = self._drawn
        if self.chart is None or self._frame is not None or self._closed or self._version() == version:
            return
        self._frame = _later(drawn_at + self._interval(self.chart_interval, _LARGE_CHART) - time.monotonic(),
                             self._draw_frame)

    def _draw_frame(self) -> None:
        with self._lock:
            if self.chart is None:
                return
            args, version = self._frame_args(), self._version()  # copies: events go on while the frame is drawn
        try:
            if self._chart is None:
                self._chart = self._new_chart()
            png = self._chart.png(*args)
        except Exception as e:  # noqa: BLE001 - the chart is a view; the panel must go on without it
            log.warning("tfnb %s: the chart failed and is turned off: %s: %s", self._what, type(e).__name__, e)
            with self._lock:
                self.chart.layout.display = "none"
                self.chart = self._frame = None
            return
        with self._lock:
            self.chart.value = png
            self.chart.layout.display = ""
            self._drawn = (version, time.monotonic())
            self.frames += 1
            if threading.current_thread() is self._frame:
                self._frame = None
                self._draw_chart()  # changes that came while it drew get the next frame

    def close(self) -> None:
        """Render the final state; called by ``tfnb.run`` or ``tfnb.sweep`` when it ends."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._end()
            self._closed = True
            self._render()
            frame, self._frame = self._frame, None
        if frame is not None:  # a frame waiting for its turn is drawn now, whatever chart_interval says
            frame.cancel()
            frame.join()
        if self.chart is not None and self._version() != self._drawn[0]:
            self._draw_frame()

    def _end(self) -> None:
        pass


class ProgressWidget(Panel):
    """Live ipywidgets panel of a run: status line, loss chart, per-task table and the latest log lines; ``tfnb.run``
    builds one by itself in a notebook. Events update :attr:`run` at once (see docs/monitoring.md).

    Args:
        num_workers: chief + worker tasks, to show their rows before they report (optional).
        num_ps: parameter-server tasks.
        max_attempts: launches the run may make, for the status line (optional).
        log_lines: how many of the latest log lines to show; older ones scroll out.
        refresh_interval: minimum seconds between two re-renders (1 s at least for a large run).
        metric: the metric charted next to the loss; ``"auto"`` takes ``accuracy`` when reported,
            else the first other metric; None charts the loss alone.
        chart_interval: minimum seconds between two chart frames (5 s at least for a large run).

    Attributes:
        run: the :class:`RunProgress` rendered; ``widget.workers[("worker", 1)].step`` reads it.
        box: the ``ipywidgets.VBox`` of ``status``, ``chart`` (None without matplotlib), ``table``, ``logs``...
        page: the page of a large run's table shown.
        renders: how many times the widgets were re-rendered; ``frames``: chart frames drawn.

    Example:
        >>> widget = tfnb.ProgressWidget(num_workers=2, metric="accuracy")
        >>> widget                       # shows the panel in this cell
        >>> tfnb.run(train_fn, num_workers=2, display=widget)
        >>> widget.workers[("worker", 1)].loss
        0.213
    """

    _what = "progress panel"

    def __init__(self, num_workers: int | None = None, num_ps: int = 0, *, max_attempts: int | None = None,
                 log_lines: int = 30, refresh_interval: float = 0.5, metric: str | None = "auto",
                 chart_interval: float = 1.0):
        if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 1):
            raise ConfigError(f"num_workers={num_workers!r} must be an int >= 1 or None")
        if not isinstance(log_lines, int) or log_lines < 1:
            raise ConfigError(f"log_lines={log_lines!r} must be an int >= 1 (lines of log kept on screen)")
        if metric is not None and not isinstance(metric, str):
            raise ConfigError(f"metric={metric!r} must be a metric name such as 'accuracy', 'auto' or None")
        super().__init__(refresh_interval, chart_interval)
        widgets = self._widgets
        self._shape = dict(num_workers=num_workers, num_ps=num_ps, max_attempts=max_attempts, log_lines=log_lines)
        self.run = RunProgress.for_run(**self._shape)
        self.metric = metric
        self.summary, self.live = widgets.HTML(), widgets.HTML()
        self.page = 0
        self._prev = widgets.Button(description="◀", tooltip="previous tasks", layout=widgets.Layout(width="3em"))
        self._next = widgets.Button(description="▶", tooltip="next tasks", layout=widgets.Layout(width="3em"))
        self._prev.on_click(lambda _b: self.show_page(self.page - 1))
        self._next.on_click(lambda _b: self.show_page(self.page + 1))
        self._pager = widgets.HBox([self._prev, self._next], layout=widgets.Layout(display="none"))
        # No scroll box: a scrolled area would open at its oldest line (measured in JupyterLab 4),
        # so the newest lines would be hidden; log_lines bounds the height instead.
        self.logs = widgets.Output(layout=widgets.Layout(border="1px solid #ddd"))
        self._rows: dict = {}  # task key -> its row's HTML while the task did not change
        self._logs_dirty = False
        self._build("tfnb-panel", self.summary, self._pager, self.table, self.live, self.logs)

    def show_page(self, page: int) -> None:
        """Show page ``page`` (0-based) of a large run's task table."""
        with self._lock:
            self.page = page
            self._render()

    @property
    def workers(self) -> dict:
        """``(job_name, task_index) -> WorkerProgress`` of the current attempt."""
        return self.run.workers

    def _large(self) -> bool:
        return self.run.large()

    def _reopen(self) -> None:  # the same widget reused for another run starts clean
        self.run = RunProgress.for_run(**self._shape)
        self._rows.clear()
        self._drawn, self._chart = (0, float("-inf")), None
        self._logs_dirty = True

    def _fold(self, batch) -> bool:
        changed, lines, tasks = self.run.apply_batch(batch)  # only the rows that changed are redrawn
        if tasks is None:
            self._rows.clear()
        for key in tasks or ():
            self._rows.pop(key, None)
        self._logs_dirty = self._logs_dirty or lines
        return changed

    def _render_parts(self) -> None:
        colour = COLOURS.get(self.run.outcome, "inherit")  # of the outcome; none while running
        self.status.value = status_line(colour, f"tfnb: {self.run.status_text()}", self.run.log_file)
        large = self.run.large()
        rows = self.run.notable() if large else self.run.rows()
        pages = -(-len(rows) // PAGE_ROWS)
        if large:
            self.page = min(max(self.page, 0), pages - 1)
            rows = rows[self.page * PAGE_ROWS:(self.page + 1) * PAGE_ROWS]
        self.summary.value = _render_summary(self.run, self.page, pages) if large else ""
        self._pager.layout.display = "flex" if large else "none"
        self.table.value = _render_table(rows, self._rows)
        live = "\n".join(f"[{w.label}] {w.live}" for w in rows if w.live)  # running carriage-return bars
        self.live.value = pre("tfnb-live", live) if live else ""
        if self._logs_dirty:
            text = "\n".join(self.run.logs) + "\n"
            self.logs.outputs = ({"output_type": "stream", "name": "stdout", "text": text},)
            self._logs_dirty = False

    def _chosen_metric(self) -> str | None:
        if self.metric != "auto":
            return self.metric
        names = {k for points in self.run.curves.values() for _, values in points[-3:] for k in values} - {"loss"}
        plain = {n for n in names if not n.startswith("val_")}
        return "accuracy" if "accuracy" in names else min(plain or names, default=None)

    def _version(self) -> int:
        return self.run.chart_version

    def _frame_args(self) -> tuple:
        curves = {f"{job} {index}": list(points) for (job, index), points in
                  sorted(self.run.curves.items(), key=lambda kv: _sort_key(kv[0]))}
        return curves, self._chosen_metric(), self.run.chart_unit

    _new_chart = LiveChart

    def log_text(self) -> str:
        """The log lines the widget shows, as text."""
        return "".join(o.get("text", "") for o in self.logs.outputs)

    def _end(self) -> None:
        self.run.end()
