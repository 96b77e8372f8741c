"""``tfnb.tensorboard(log_dir)``: the outcomes of :mod:`tfnb.monitor.tensorboard` as a :class:`TensorBoardPanel` in a
Jupyter or Databricks kernel, elsewhere as one line with the URL a browser opens."""
from __future__ import annotations

import datetime
import html
import logging
import os
import sys
import time
from typing import Any, Callable, Mapping

from .._deps import require
from ..errors import ConfigError
from ..monitor.display import in_notebook
from ..monitor.tensorboard import Failed, Launched, Outcome, Reused, TimedOut, ensure_tensorboard, instances, stop

log = logging.getLogger(__name__)

DEFAULT_HEIGHT = 800
_DATABRICKS_ORG = "spark.databricks.clusterUsageTags.clusterOwnerOrgId"
_DATABRICKS_CLUSTER = "spark.databricks.clusterUsageTags.clusterId"
_DATABRICKS_WORKSPACE = "spark.databricks.workspaceUrl"


def tensorboard(log_dir, *, host: str | None = None, port: int | None = None,
                reload_interval: float | None = None, timeout: float | None = None,
                height: int | None = None, proxy_url: str | None = None,
                display: bool | None = None):
    """Show TensorBoard for ``log_dir``, started on the driver or reused: inline in a notebook, as a URL elsewhere.

    TensorBoard has no login: keep ``host`` on loopback unless the network is trusted (docs/monitoring.md).

    Args:
        log_dir: directory holding event files (e.g. the ``log_dir`` given to ``tfnb.run``).
        host: address TensorBoard binds; default ``127.0.0.1`` (env ``TFNB_TENSORBOARD_HOST``).
        port: port to serve on; default a free one.
        reload_interval: seconds between log_dir scans; default 5.
        timeout: seconds to wait for a new TensorBoard to serve; default 90.
        height: iframe height in pixels; default 800.
        proxy_url: URL template for the browser with ``%PORT%``, overriding ``TENSORBOARD_PROXY_URL``.
        display: True for the widget panel, False for printed text; default: the panel in a notebook kernel.

    Returns:
        With the panel, the :class:`TensorBoardPanel` shown. Otherwise the outcome (``Launched``/``Reused``/
        ``Failed``/``TimedOut``) after printing the URL, or the error and its fix to stderr.

    Raises:
        ConfigError: an argument has the wrong type or range.
        MissingDependencyError: tensorboard (or, for the panel, ipywidgets) is not installed.

    Example:
        >>> import tfnb
        >>> tfnb.tensorboard("/tmp/run1/logs")   # in a notebook cell
    """
    height = check_height(height)
    options = dict(host=host, port=port, reload_interval=reload_interval, timeout=timeout)
    if display or (display is None and in_notebook()):
        from IPython.display import display as show

        panel = TensorBoardPanel(log_dir, height=height, proxy_url=proxy_url, start=False, **options)
        show(panel)  # first, so the cell shows "Starting..." during TensorBoard's slow start
        panel.reload()
        return panel
    outcome = ensure_tensorboard(log_dir, **options)
    if isinstance(outcome, (Launched, Reused)):
        url = browser_url(outcome, proxy_url=proxy_url)
        verb = "Reusing" if isinstance(outcome, Reused) else "Started"
        print(f"{verb} TensorBoard for {outcome.log_dir} at {url} (pid {outcome.pid})", flush=True)
        if outcome.warning:
            print(f"TensorBoard: {outcome.warning}", file=sys.stderr, flush=True)
    else:
        print(f"TensorBoard: {problem_text(outcome)}", file=sys.stderr, flush=True)
    return outcome


def browser_url(outcome, *, proxy_url: str | None = None, environ: Mapping[str, str] | None = None,
                spark_conf: Mapping[str, str] | None = None) -> str:
    """The URL a browser opens to reach a running TensorBoard: ``proxy_url`` or ``TENSORBOARD_PROXY_URL`` with
    ``%PORT%`` replaced (as ``%tensorboard`` does), on Databricks its driver proxy, under JupyterHub
    ``<prefix>proxy/<port>/`` (jupyter-server-proxy), else the driver's own URL."""
    env = os.environ if environ is None else environ
    port = outcome.port
    template = proxy_url if proxy_url is not None else env.get("TENSORBOARD_PROXY_URL")
    if template:
        return template.replace("%PORT%", str(port))
    if env.get("DATABRICKS_RUNTIME_VERSION"):
        if url := databricks_proxy_url(port, spark_conf if spark_conf is not None else _active_spark_conf()):
            return url
        log.warning("on Databricks but the cluster tags (%s, %s) are not readable; showing the driver's "
                    "own URL, which your browser may not reach: set TENSORBOARD_PROXY_URL",
                    _DATABRICKS_ORG, _DATABRICKS_CLUSTER)
    if prefix := env.get("JUPYTERHUB_SERVICE_PREFIX"):
        return f"{prefix.rstrip('/')}/proxy/{port}/"
    return outcome.url


def databricks_proxy_url(port: int, conf: Mapping[str, str]) -> str | None:
    """``https://<workspaceUrl>/driver-proxy/o/<orgId>/<clusterId>/<port>/``, the form Databricks documents for apps
    served from the driver; None without the cluster tags."""
    org, cluster = conf.get(_DATABRICKS_ORG), conf.get(_DATABRICKS_CLUSTER)
    if not org or not cluster:
        return None
    workspace = (conf.get(_DATABRICKS_WORKSPACE) or "").strip().rstrip("/")
    if workspace and "://" not in workspace:
        workspace = "https://" + workspace
    return f"{workspace}/driver-proxy/o/{org}/{cluster}/{port}/"


def _active_spark_conf() -> dict:
    try:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        keys = (_DATABRICKS_ORG, _DATABRICKS_CLUSTER, _DATABRICKS_WORKSPACE)
        return {k: spark.conf.get(k, None) for k in keys} if spark is not None else {}
    except Exception as e:  # any Spark/Py4J trouble just means "no proxy tags"
        log.debug("could not read the Databricks cluster tags: %s", e)
        return {}


def check_height(height) -> int:
    if height is None:
        return DEFAULT_HEIGHT
    if isinstance(height, bool) or not isinstance(height, int) or height < 100:
        raise ConfigError(f"height={height!r} must be a whole number of pixels >= 100 (default {DEFAULT_HEIGHT})")
    return height


def problem_text(outcome: Failed | TimedOut) -> str:
    if isinstance(outcome, Failed):
        return f"could not start: {outcome.error}. Fix: {outcome.fix}"
    return f"did not start within {outcome.timeout:g} s (pid {outcome.pid} was stopped). Fix: {outcome.fix}"


tensorboard.instances = instances  # tfnb.tensorboard.instances() / .stop(): the running ones
tensorboard.stop = stop


def status_html(outcome: Outcome) -> str:
    e = html.escape
    warning = getattr(outcome, "warning", "")
    warning = f" <b style='color:#b45309'>{e(warning)}</b>" if warning else ""
    if isinstance(outcome, Reused):
        age = datetime.timedelta(seconds=max(0, int(time.time() - outcome.instance.start_time)))
        return (f"Reusing the TensorBoard serving <code>{e(outcome.log_dir)}</code> (pid {outcome.pid}, "
                f"port {outcome.port}, started {age} ago).{warning}")
    if isinstance(outcome, Launched):
        return (f"TensorBoard started for <code>{e(outcome.log_dir)}</code> (pid {outcome.pid}, "
                f"port {outcome.port}).{warning}")
    text = f"<b>TensorBoard {e(problem_text(outcome))}</b>"
    if outcome.output:
        text += f"<pre style='max-height:12em;overflow:auto'>{e(outcome.output)}</pre>"
    return text


class TensorBoardPanel:
    """The widget panel for one log_dir: status, link, Reload (restarts a TensorBoard that died or was stopped) and
    Stop buttons, TensorBoard's iframe. ``start=False`` waits for :meth:`reload`; ``options`` as for tfnb.tensorboard.

    Attributes:
        outcome: the latest ``Launched``/``Reused``/``Failed``/``TimedOut`` (None after Stop).
        url: the browser URL of TensorBoard, or None when it is not running.
        widget: the ipywidgets ``VBox``.

    Example:
        >>> panel = TensorBoardPanel("/tmp/run1/logs")
        >>> panel            # shown when it is a cell's value
        >>> panel.stop()
    """

    def __init__(self, log_dir, *, height: int = DEFAULT_HEIGHT, proxy_url: str | None = None,
                 start: bool = True, **options: Any):
        widgets = require("ipywidgets", "the TensorBoard panel")
        self.log_dir = log_dir
        self.height = check_height(height)
        self.proxy_url = proxy_url
        self.outcome: Outcome | None = None
        self.url: str | None = None
        self._options = options
        self._reloads = 0
        self._shown_in: object = None
        self._status, self._link = widgets.HTML(), widgets.HTML()
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
        self._status.value = f"Starting TensorBoard for <code>{html.escape(str(self.log_dir))}</code>..."
        try:
            self.outcome = ensure_tensorboard(self.log_dir, **self._options)
        except Exception as e:
            self._status.value = f"<b>{html.escape(f'{type(e).__name__}: {e}')}</b>"
            raise
        self._show(status_html(self.outcome))
        return self.outcome

    def stop(self) -> bool:
        """Stop the TensorBoard process shown (even one another kernel started); True if it ran."""
        outcome = self.outcome
        running = isinstance(outcome, (Launched, Reused))
        stopped = running and stop(outcome)
        self.outcome = None
        self._show(f"TensorBoard{f' (pid {outcome.pid})' if running else ''} stopped. Reload starts it again.")
        return stopped

    def _show(self, status: str) -> None:
        running = isinstance(self.outcome, (Launched, Reused))
        self._status.value = status
        self.url = browser_url(self.outcome, proxy_url=self.proxy_url) if running else None
        self._reloads += running
        e = html.escape(self.url or "")
        self._link.value = f'<a href="{e}" target="_blank" rel="noopener">{e}</a>' if running else ""
        # a changed src is what makes the browser fetch the page again
        src = self.url if self._reloads <= 1 else f"{self.url}{'&' if '?' in e else '?'}tfnb_reload={self._reloads}"
        self._frame.value = (f'<iframe src="{html.escape(src)}" title="TensorBoard" width="100%" height="{self.height}"'
                             f' style="border:1px solid #ddd" loading="eager"></iframe>') if running else ""
        self._stop_button.disabled = not running

    def _guard(self, action: Callable[[], Any]) -> None:
        # a button callback's exception would vanish into the kernel's log
        try:
            action()
        except Exception as e:
            log.exception("TensorBoard panel action failed")
            self._status.value = f"<b>Error: {html.escape(f'{type(e).__name__}: {e}')}</b>"

    def _ipython_display_(self) -> None:
        from IPython import get_ipython
        from IPython.display import display

        count = getattr(get_ipython(), "execution_count", None)
        # tensorboard() shows the panel and returns it: as a cell's last line it would show a second copy
        if count is not None and count == self._shown_in:
            return
        self._shown_in = count
        display(self.widget)

    def __repr__(self) -> str:
        return f"TensorBoardPanel({str(self.log_dir)!r}, {self.url or 'not running'})"


__all__ = ["tensorboard", "browser_url", "databricks_proxy_url", "status_html", "TensorBoardPanel"]
