"""Line charts: :class:`LiveChart` frames for the progress panel, :func:`metrics_figure` for ``Evaluator.plot``.
matplotlib is optional, imported when a chart is drawn, and draws on the Agg canvas (never pyplot), leaving the
notebook's own backend and figure list alone."""
from __future__ import annotations

import importlib.util
import io
from typing import Any, Mapping, Sequence

INSTALL_HINT = "pip install matplotlib"


def matplotlib_missing() -> str | None:
    """None when matplotlib is installed (found without the ~0.5 s import), else the line shown instead."""
    found = importlib.util.find_spec("matplotlib") is not None
    return None if found else f"live loss curve: `{INSTALL_HINT}` (then rerun) to see it"


def figure(width: float, height: float, dpi: int = 96):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    class _Shown(Figure):
        # a Figure shows as a PNG in any IPython front end (Jupyter, Databricks), pyplot or not
        def _repr_png_(self) -> bytes:
            return png(self)

    fig = _Shown(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def png(fig) -> bytes:
    buf = io.BytesIO()
    fig.canvas.print_png(buf)
    return buf.getvalue()


class LiveChart:
    """Loss and one metric by epoch, one line per task. Lines and axes are kept between frames and only their data
    changes, so a frame costs one Agg draw (tens of milliseconds), not a new figure."""

    def __init__(self, width: float = 8.0, height: float = 2.4):
        self.fig = figure(width, height)
        self.loss_ax, self.metric_ax = self.fig.subplots(1, 2)
        self.fig.subplots_adjust(left=0.07, right=0.99, bottom=0.2, top=0.88, wspace=0.22)
        for ax in (self.loss_ax, self.metric_ax):
            ax.tick_params(labelsize=7)
            ax.locator_params(nbins=5)  # ticks are most of a frame's cost: few of them
        self.loss_ax.set_title("loss", fontsize=9)
        self._lines: dict = {}  # (axis index, label) -> Line2D
        self._labels: tuple = (None, None)  # (metric, unit) the titles show

    def png(self, curves: Mapping[str, Sequence[tuple[float, Mapping[str, float]]]], metric: str | None,
            unit: str = "epoch") -> bytes:
        """One frame: ``curves`` maps a task label to its ``(x, values)`` points."""
        if self._labels != (metric, unit):
            self._labels = (metric, unit)
            self.metric_ax.set_title(metric or "", fontsize=9)
            for ax in (self.loss_ax, self.metric_ax):
                ax.set_xlabel(unit, fontsize=8)
            for key in [k for k in self._lines if k[0] == 1]:  # another metric: its lines start over
                self._lines.pop(key).remove()
        self.metric_ax.set_visible(metric is not None)
        new = False
        for i, (ax, name) in enumerate(((self.loss_ax, "loss"), (self.metric_ax, metric))):
            if name is None:
                continue
            for label, points in curves.items():
                xs = [x for x, v in points if name in v]
                ys = [v[name] for x, v in points if name in v]
                line = self._lines.get((i, label))
                if line is None:
                    line, = ax.plot(xs, ys, linewidth=1.2, label=label)
                    self._lines[(i, label)] = line
                    new = True
                else:
                    line.set_data(xs, ys)
                line.set_marker("." if len(xs) < 20 else "")  # a new curve's first points show as dots
            ax.relim()
            ax.autoscale_view()
        if new and len(curves) <= 8:
            self.loss_ax.legend(fontsize=7, loc="upper right", frameon=False)
        return png(self.fig)


def metrics_figure(evaluated: Mapping[str, Sequence[tuple[float, float]]],
                   trained: Mapping[str, Sequence[tuple[float, float]]], *, unit: str = "epoch",
                   title: str | None = None) -> Any:
    """A Figure with one panel per metric: ``evaluated`` points against the ``trained`` curve of the same name (each
    maps a metric to its ``(x, value)`` points; ``trained`` may lack some)."""
    names = list(evaluated) or list(trained)
    fig = figure(min(4.2 * max(len(names), 1), 12.6), 3.0)
    axes = fig.subplots(1, max(len(names), 1), squeeze=False)[0]
    for ax, name in zip(axes, names):
        for points, style in ((trained.get(name), {"color": "#1f6feb", "label": "training"}),
                              (evaluated.get(name), {"color": "#cf222e", "label": "evaluation", "marker": "o"})):
            if points:
                ax.plot(*zip(*points), linewidth=1.4, **style)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(unit, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
