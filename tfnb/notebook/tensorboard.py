"""The TensorBoard panel in a notebook: status, link, Reload / Stop buttons, TensorBoard in an iframe.

``tfnb.tensorboard(logdir)`` shows it inside a Jupyter or Databricks kernel (see :mod:`tfnb.tensorboard`
for the URL rules and the process handling it builds on).
"""
from __future__ import annotations

import datetime
import html
import logging
import time
from typing import Any, Callable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .._deps import require
from ..tensorboard import (DEFAULT_HEIGHT, Launched, Outcome, Reused, browser_url, check_height,
                           ensure_tensorboard, problem_text, stop)

log = logging.getLogger(__name__)


def show_panel(logdir, **options: Any) -> "TensorBoardPanel":
    """Show a :class:`TensorBoardPanel` for ``logdir`` (``options`` as for it) in the running cell and return it."""
    from IPython.display import display

    panel = TensorBoardPanel(logdir, start=False, **options)
    display(panel)  # first, so the cell shows "Starting..." during TensorBoard's slow start
    panel.reload()
    return panel


def _with_query(url: str, **params: Any) -> str:
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True) + [(k, str(v)) for k, v in params.items()]
    return urlunsplit(parts._replace(query=urlencode(query)))


def status_html(outcome: Outcome) -> str:
    """One status paragraph for an outcome (escaped HTML)."""
    e = html.escape
    warning = getattr(outcome, "warning", "")
    warning = f" <b style='color:#b45309'>{e(warning)}</b>" if warning else ""
    if isinstance(outcome, Reused):
        age = datetime.timedelta(seconds=max(0, int(time.time() - outcome.instance.start_time)))
        return (f"Reusing the TensorBoard serving <code>{e(outcome.logdir)}</code> (pid {outcome.pid}, "
                f"port {outcome.port}, started {age} ago).{warning}")
    if isinstance(outcome, Launched):
        return (f"TensorBoard started for <code>{e(outcome.logdir)}</code> (pid {outcome.pid}, "
                f"port {outcome.port}).{warning}")
    text = f"<b>TensorBoard {e(problem_text(outcome))}</b>"
    if outcome.output:
        text += f"<pre style='max-height:12em;overflow:auto'>{e(outcome.output)}</pre>"
    return text


def frame_html(url: str, height: int) -> str:
    """The iframe showing TensorBoard at ``url``."""
    return (f'<iframe src="{html.escape(url)}" title="TensorBoard" width="100%" '
            f'height="{height}" style="border:1px solid #ddd" loading="eager"></iframe>')


def link_html(url: str) -> str:
    e = html.escape(url)
    return f'<a href="{e}" target="_blank" rel="noopener">{e}</a>'


class TensorBoardPanel:
    """The widget panel for one logdir: status line, link, Reload / Stop, TensorBoard iframe.

    Reload re-checks the instance (starting a new one if it died or was stopped) and reloads the
    iframe; Stop stops the TensorBoard process. ``start=False`` builds the panel without looking
    for TensorBoard until :meth:`reload`; ``options`` go to ``ensure_tensorboard``.

    Attributes:
        outcome: the latest ``Launched``/``Reused``/``Failed``/``TimedOut`` (None after Stop).
        url: the browser URL of TensorBoard, or None when it is not running.
        widget: the ipywidgets ``VBox``.

    Example:
        >>> panel = TensorBoardPanel("/tmp/run1/logs")
        >>> panel            # shown when it is a cell's value
        >>> panel.stop()
    """

    def __init__(self, logdir, *, height: int = DEFAULT_HEIGHT, proxy_url: str | None = None,
                 start: bool = True, **options: Any):
        widgets = require("ipywidgets", "the TensorBoard panel")
        self.logdir = logdir
        self.height = check_height(height)
        self.proxy_url = proxy_url
        self.outcome: Outcome | None = None
        self.url: str | None = None
        self._options = options
        self._reloads = 0
        self._shown_in: object = None
        self._status = widgets.HTML()
        self._link = widgets.HTML()
        self._reload_button = widgets.Button(description="Reload", icon="refresh",
                                             tooltip="Re-check TensorBoard (restart it if needed) and reload the view")
        self._stop_button = widgets.Button(description="Stop", icon="stop", button_style="warning",
                                           tooltip="Stop this TensorBoard process")
        self._frame = widgets.HTML(layout=widgets.Layout(width="100%"))
        self._reload_button.on_click(lambda _b: self._guard(self.reload))
        self._stop_button.on_click(lambda _b: self._guard(self.stop))
        self.widget = widgets.VBox(
            [self._status, widgets.HBox([self._reload_button, self._stop_button, self._link]), self._frame],
            layout=widgets.Layout(width="100%"))
        self.widget.add_class("tfnb-tensorboard")
        if start:
            self.reload()

    def reload(self) -> Outcome:
        """Find or start TensorBoard again and reload the iframe."""
        self._status.value = f"Starting TensorBoard for <code>{html.escape(str(self.logdir))}</code>..."
        try:
            self.outcome = ensure_tensorboard(self.logdir, **self._options)
        except Exception as e:
            self._status.value = f"<b>{html.escape(f'{type(e).__name__}: {e}')}</b>"
            raise
        self._render()
        return self.outcome

    def stop(self) -> bool:
        """Stop the TensorBoard process shown (even one another kernel started); True if it ran."""
        outcome = self.outcome
        running = isinstance(outcome, (Launched, Reused))
        stopped = running and stop(outcome)
        self.outcome = None
        self._clear()
        pid = f" (pid {outcome.pid})" if running else ""
        self._status.value = f"TensorBoard{pid} stopped. Reload starts it again."
        return stopped

    def _render(self) -> None:
        outcome = self.outcome
        self._status.value = status_html(outcome)
        if not isinstance(outcome, (Launched, Reused)):
            self._clear()
            return
        self.url = browser_url(outcome, proxy_url=self.proxy_url)
        self._link.value = link_html(self.url)
        self._reloads += 1
        # a changed src is what makes the browser fetch the page again
        src = self.url if self._reloads == 1 else _with_query(self.url, tfnb_reload=self._reloads)
        self._frame.value = frame_html(src, self.height)
        self._stop_button.disabled = False

    def _clear(self) -> None:
        self.url = None
        self._link.value = ""
        self._frame.value = ""
        self._stop_button.disabled = True

    def _guard(self, action: Callable[[], Any]) -> None:
        # Button callbacks run in the kernel, where an exception would vanish into its log.
        try:
            action()
        except Exception as e:
            log.exception("TensorBoard panel action failed")
            self._status.value = f"<b>Error: {html.escape(f'{type(e).__name__}: {e}')}</b>"

    def _ipython_display_(self) -> None:
        from IPython import get_ipython
        from IPython.display import display

        count = getattr(get_ipython(), "execution_count", None)
        # tensorboard() shows the panel itself and also returns it; when that call is the cell's
        # last line, the returned value would show a second copy of the same panel.
        if count is not None and count == self._shown_in:
            return
        self._shown_in = count
        display(self.widget)

    def __repr__(self) -> str:
        return f"TensorBoardPanel({str(self.logdir)!r}, {self.url or 'not running'})"


__all__ = ["TensorBoardPanel", "show_panel", "status_html", "frame_html", "link_html"]
