"""The live progress panel of a run in a notebook (ipywidgets), fed the same RunEvents as the console.

``tfnb.notebook`` registers :meth:`ProgressWidget.for_run` as the ``widget`` display mode, which
``tfnb.run`` picks by default inside a Jupyter or Databricks kernel.
"""
from __future__ import annotations

import html
import logging
import threading
import time

from ..errors import ConfigError
from .._protocol import RunEvent
from ..monitor.charts import LiveChart, matplotlib_missing
from ..monitor.display import in_notebook
from ..monitor.progress import SUMMARY_ABOVE, RunProgress, _num, _of, _short, _sort_key, gpu_list
from .._protocol import number as _number

log = logging.getLogger(__name__)

PAGE_ROWS = SUMMARY_ABOVE  # rows of the table a large run shows at once
_LARGE_REFRESH = 1.0       # seconds between re-renders of a large run: its summary is O(tasks)
_LARGE_CHART = 5.0         # seconds between chart frames of a large run: a frame costs tens of ms of CPU

_STATE_COLOURS = {"pending": "#888", "starting": "#888", "training": "#1f6feb", "serving": "#1f6feb",
                  "stalled": "#8250df", "done": "#1a7f37", "stopped": "#bf8700", "failed": "#cf222e"}


_PAD = 'style="padding:2px 14px 2px 0;text-align:left;vertical-align:top"'
_HEAD = "<tr>" + "".join(f"<th {_PAD}>{name}</th>" for name in
                         ("task", "GPUs", "state", "epoch", "step", "loss", "examples/s", "metrics")) + "</tr>"


def _render_row(w) -> str:
    """One task's row as HTML (escaped; log text and error messages come from user code)."""
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
    cells = [html.escape(w.label), html.escape(gpu_list(w.gpus)), state, _of(w.epoch, w.epochs), _of(w.step, w.steps),
             _num(w.loss), speed, metrics]
    return "<tr>" + "".join(f"<td {_PAD}>{c}</td>" for c in cells) + "</tr>"


def _render_table(run: RunProgress, rows: list | None = None, cache: dict | None = None) -> str:
    """The per-task table as HTML; ``cache`` (task key -> row HTML) holds the rows that did not change."""
    body = []
    for w in run.rows() if rows is None else rows:
        key = (w.job_name, w.task_index)
        row = None if cache is None else cache.get(key)
        if row is None:
            row = _render_row(w)
            if cache is not None:
                cache[key] = row
        body.append(row)
    return '<table class="tfnb-progress" style="border-collapse:collapse">' + _HEAD + "".join(body) + "</table>"


def _render_summary(run: RunProgress, page: int, pages: int) -> str:
    """A large run's summary: counts by state, slowest/fastest task, stragglers, which rows are shown."""
    counts = run.counts()
    chips = " ".join(
        f'<span style="color:{_STATE_COLOURS.get(s, "#888")};font-weight:600">{n} {html.escape(s)}</span>'
        for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    lines = [f"{len(run.workers)} tasks: {chips}"]
    lines += [html.escape(line) for line in run.summary_lines()]
    lines.append(f"<i>tasks of note first (failed, stalled, stragglers); page {page + 1}/{pages}</i>")
    return '<div class="tfnb-summary">' + "<br>".join(lines) + "</div>"


def _render_live(run: RunProgress, rows: list | None = None) -> str:
    """One line per task with a running carriage-return bar, as a terminal would show it."""
    lines = [f"[{w.label}] {w.live}" for w in (run.rows() if rows is None else rows) if w.live]
    if not lines:
        return ""
    text = html.escape("\n".join(lines))
    return f'<pre class="tfnb-live" style="margin:2px 0;white-space:pre-wrap">{text}</pre>'


def _render_status(run: RunProgress) -> str:
    colour = {"succeeded": "#1a7f37", "failed": "#cf222e", "stopped": "#bf8700"}.get(run.outcome or "", "inherit")
    log = (f'<div style="font-size:smaller;opacity:.7">every line of this run: <code>{html.escape(run.log_file)}'
           '</code></div>') if run.log_file else ""
    return f'<div style="color:{colour};font-weight:600">tfnb: {html.escape(run.status_text())}</div>{log}'


class ProgressWidget:
    """Live ipywidgets panel of a run: status line, loss chart, per-task table and the latest log lines.

    Pass it as ``tfnb.run(..., display=widget)`` (``tfnb.run`` builds one by itself in a notebook).
    Events update :attr:`run` at once; the widgets re-render at most every ``refresh_interval`` seconds
    (at least 1 s for a large run), only the rows whose task changed and the log area when lines arrived,
    and once more when the run ends. The chart (loss and one metric by epoch, a line per task for the first
    :data:`tfnb.monitor.progress.CHART_TASKS` tasks) is a matplotlib PNG drawn at most every
    ``chart_interval`` seconds (5 s for a large run) once a task reported; without matplotlib the panel
    says how to get it. A Keras ``verbose=1`` bar shows as one updating line per task. Above
    :data:`tfnb.monitor.progress.SUMMARY_ABOVE` tasks it shows a summary (counts by state, slowest/fastest
    task, stragglers, total examples/s) and pages of :data:`PAGE_ROWS` tasks, those of note first.

    Args:
        num_workers: chief + worker tasks, to show their rows before they report (optional).
        num_ps: parameter-server tasks.
        max_attempts: launches the run may make, for the status line (optional).
        log_lines: how many of the latest log lines to show; older ones scroll out.
        refresh_interval: minimum seconds between two re-renders.
        metric: the metric charted next to the loss; ``"auto"`` takes ``accuracy`` when reported,
            else the first other metric; None charts the loss alone.
        chart_interval: minimum seconds between two chart frames.

    Attributes:
        run: the :class:`RunProgress` rendered; ``widget.workers[("worker", 1)].step`` reads it.
        status, summary, table, live: ``ipywidgets.HTML`` with the status line, a large run's
            summary, the per-task table and the tasks' carriage-return lines.
        chart: ``ipywidgets.Image`` with the latest chart frame (PNG), or None without matplotlib.
        page: the page of the table shown (large runs).
        logs: ``ipywidgets.Output`` with the latest log lines, each prefixed by its task.
        box: the ``ipywidgets.VBox`` holding them (what the notebook shows).
        renders: how many times the widgets were re-rendered; ``frames``: chart frames drawn.

    Example:
        >>> widget = tfnb.ProgressWidget(num_workers=2, metric="accuracy")
        >>> widget                       # shows the panel in this cell
        >>> tfnb.run(train_fn, num_workers=2, display=widget)
        >>> widget.workers[("worker", 1)].loss
        0.213
    """

    def __init__(self, num_workers: int | None = None, num_ps: int = 0, *, max_attempts: int | None = None,
                 log_lines: int = 30, refresh_interval: float = 0.5, metric: str | None = "auto",
                 chart_interval: float = 1.0):
        if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 1):
            raise ConfigError(f"num_workers={num_workers!r} must be an int >= 1 or None")
        if not isinstance(log_lines, int) or log_lines < 1:
            raise ConfigError(f"log_lines={log_lines!r} must be an int >= 1 (lines of log kept on screen)")
        for name, value in (("refresh_interval", refresh_interval), ("chart_interval", chart_interval)):
            if _number(value) is None or value < 0:
                raise ConfigError(f"{name}={value!r} must be a number of seconds >= 0")
        if metric is not None and not isinstance(metric, str):
            raise ConfigError(f"metric={metric!r} must be a metric name such as 'accuracy', 'auto' or None")
        from .._deps import require

        widgets = require("ipywidgets", "the tfnb progress widget")
        self._shape = dict(num_workers=num_workers, num_ps=num_ps, max_attempts=max_attempts,
                           log_lines=log_lines)
        self.run = RunProgress.for_run(**self._shape)
        self.refresh_interval = float(refresh_interval)
        self.chart_interval = float(chart_interval)
        self.metric = metric
        self.status = widgets.HTML()
        self.summary = widgets.HTML()
        self.table = widgets.HTML()
        self.live = widgets.HTML()
        missing = matplotlib_missing()
        self.chart = None if missing else widgets.Image(format="png", layout=widgets.Layout(display="none"))
        chart_box = widgets.HTML(f'<div class="tfnb-chart-missing" style="font-size:smaller;opacity:.7">'
                                 f'{html.escape(missing)}</div>') if missing else self.chart
        if self.chart is not None:
            self.chart.add_class("tfnb-chart")
        self._chart = None  # the LiveChart, made at the first frame
        self._drawn = (0, float("-inf"))  # (run.chart_version, time) of the last frame
        self._frame: threading.Timer | None = None  # the frame being drawn or waiting for its time
        self.frames = 0
        self.page = 0
        self._prev = widgets.Button(description="◀", tooltip="previous tasks", layout=widgets.Layout(width="3em"))
        self._next = widgets.Button(description="▶", tooltip="next tasks", layout=widgets.Layout(width="3em"))
        self._prev.on_click(lambda _b: self.show_page(self.page - 1))
        self._next.on_click(lambda _b: self.show_page(self.page + 1))
        self._pager = widgets.HBox([self._prev, self._next], layout=widgets.Layout(display="none"))
        # No scroll box: a scrolled area would open at its oldest line (measured in JupyterLab 4),
        # so the newest lines would be hidden; log_lines bounds the height instead.
        self.logs = widgets.Output(layout=widgets.Layout(border="1px solid #ddd"))
        self.box = widgets.VBox([self.status, chart_box, self.summary, self._pager, self.table, self.live,
                                 self.logs])
        self.box.add_class("tfnb-panel")
        self.renders = 0
        self._rows: dict = {}  # task key -> its row's HTML while the task did not change
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._last_render = float("-inf")
        self._dirty = self._logs_dirty = self._closed = self._shown = False
        self._notebook: bool | None = None  # in_notebook(), asked once: it is not free per event
        self._render()

    @classmethod
    def for_run(cls, num_workers: int | None = None, num_ps: int = 0, max_attempts: int | None = None,
                **kwargs) -> "ProgressWidget":
        """The ``widget`` display mode: a new panel, shown in the running cell when in a notebook."""
        widget = cls(num_workers=num_workers, num_ps=num_ps, max_attempts=max_attempts, **kwargs)
        if in_notebook():
            from IPython.display import display

            display(widget)
        return widget

    def show_page(self, page: int) -> None:
        """Show page ``page`` (0-based) of a large run's task table."""
        with self._lock:
            self.page = page
            self._render()

    @property
    def workers(self) -> dict:
        """``(job_name, task_index) -> WorkerProgress`` of the current attempt."""
        return self.run.workers

    def _repr_mimebundle_(self, **kwargs):
        self._shown = True
        return self.box._repr_mimebundle_(**kwargs)

    def __call__(self, event: RunEvent) -> None:
        self.batch((event,))

    def batch(self, batch) -> None:
        """Fold a batch of events (in order) into the panel; renders at most once for all of them."""
        if not self._shown:
            if self._notebook is None:
                self._notebook = in_notebook()
            if self._notebook:
                # passed as display= without being shown first: show it in the running cell
                from IPython.display import display

                display(self)
        with self._lock:
            if self._closed:
                # the same widget reused for another run starts clean
                self._closed = False
                self.run = RunProgress.for_run(**self._shape)
                self._rows.clear()
                self._drawn, self._chart = (0, float("-inf")), None
                self._logs_dirty = True
            changed, lines, tasks = self.run.apply_batch(batch)  # only the rows that changed are redrawn
            if not changed:
                return
            if tasks is None:
                self._rows.clear()
            for key in tasks or ():
                self._rows.pop(key, None)
            self._logs_dirty = self._logs_dirty or lines
            self._dirty = True
            interval = max(self.refresh_interval, _LARGE_REFRESH) if self.run.large() else self.refresh_interval
            wait = self._last_render + interval - time.monotonic()
            if wait <= 0 and self._timer is None:
                self._render()
            else:
                self._later(wait)

    def _later(self, wait: float) -> None:
        # render the latest state a little later even if no further event arrives
        if self._timer is None:
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
        if self.run.large():
            rows = self.run.notable()
            pages = -(-len(rows) // PAGE_ROWS)
            self.page = min(max(self.page, 0), pages - 1)
            shown = rows[self.page * PAGE_ROWS:(self.page + 1) * PAGE_ROWS]
            self.summary.value = _render_summary(self.run, self.page, pages)
            self._pager.layout.display = "flex"
            self.table.value = _render_table(self.run, shown, self._rows)
            self.live.value = _render_live(self.run, shown)
        else:
            self.summary.value = ""
            self._pager.layout.display = "none"
            self.table.value = _render_table(self.run, None, self._rows)
            self.live.value = _render_live(self.run)
        if self._logs_dirty:
            text = "\n".join(self.run.logs) + "\n"
            self.logs.outputs = ({"output_type": "stream", "name": "stdout", "text": text},)
        self._dirty = self._logs_dirty = False
        self._last_render = time.monotonic()
        self.renders += 1
        self._draw_chart()

    def _chosen_metric(self) -> str | None:
        if self.metric != "auto":
            return self.metric
        names = {k for points in self.run.curves.values() for _, values in points[-3:] for k in values} - {"loss"}
        if "accuracy" in names:
            return "accuracy"
        plain = sorted(n for n in names if not n.startswith("val_"))
        return plain[0] if plain else min(names, default=None)

    def _draw_chart(self) -> None:
        """Start a frame when a task reported since the last one, at most every chart_interval seconds. The frame is
        drawn on a thread of its own and outside the lock, so the driver's main thread goes on folding events while
        matplotlib draws (tens of milliseconds; the first frame also imports matplotlib)."""
        version, drawn_at = self._drawn
        if (self.chart is None or self._frame is not None or self._closed or self.run.chart_version == version
                or not self.run.curves):
            return
        # a large run's frames are spaced further: its curves are a few of hundreds of tasks, and the
        # driver's main thread shares the interpreter with the channel thread reading those tasks
        interval = max(self.chart_interval, _LARGE_CHART) if self.run.large() else self.chart_interval
        self._frame = threading.Timer(max(drawn_at + interval - time.monotonic(), 0.0), self._draw_frame)
        self._frame.daemon = True
        self._frame.start()

    def _draw_frame(self) -> None:
        with self._lock:
            if self.chart is None:
                return
            # copies: tasks keep reporting while the frame is drawn
            curves = {f"{job} {index}": list(points) for (job, index), points in
                      sorted(self.run.curves.items(), key=lambda kv: _sort_key(kv[0]))}
            metric, unit, version = self._chosen_metric(), self.run.chart_unit, self.run.chart_version
        try:
            if self._chart is None:
                self._chart = LiveChart()
            png = self._chart.png(curves, metric, unit)
        except Exception as e:  # noqa: BLE001 - the chart is a view; the panel must go on without it
            log.warning("tfnb progress panel: the chart failed and is turned off: %s: %s", type(e).__name__, e)
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
                self._draw_chart()  # reports that came while it drew get the next frame

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
            self._closed = True
            self._render()
            frame, self._frame = self._frame, None
        if frame is not None:  # a frame waiting for its turn is drawn now, whatever chart_interval says
            frame.cancel()
            frame.join()
        if self.chart is not None and self.run.curves and self.run.chart_version != self._drawn[0]:
            self._draw_frame()
