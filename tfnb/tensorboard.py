"""Notebook layer for TensorBoard: an inline panel in a notebook, a printed URL elsewhere.

``tfnb.tensorboard(logdir)`` asks :mod:`tfnb._tb_process` for a TensorBoard serving ``logdir``
(reusing a running one) and renders the outcome: in a Jupyter or Databricks kernel an ipywidgets
panel (status, link, Reload and Stop buttons, TensorBoard in an iframe); in a script or a terminal
IPython, one line with the URL.

The iframe URL is the one the *browser* can open, which is not always the driver's
``http://127.0.0.1:PORT/``:

* ``TENSORBOARD_PROXY_URL`` (or ``proxy_url=``) set: that URL with ``%PORT%`` replaced, the same
  convention as TensorBoard's own ``%tensorboard``; e.g. ``/user/alice/proxy/%PORT%/``.
* Databricks (``DATABRICKS_RUNTIME_VERSION`` set): the driver proxy,
  ``https://<workspaceUrl>/driver-proxy/o/<orgId>/<clusterId>/<port>/``, from the
  ``spark.databricks.*`` conf of the active session. Built from documented conventions; it is
  unit-tested but has not been run on a live Databricks workspace.
* JupyterHub (``JUPYTERHUB_SERVICE_PREFIX`` set): ``<prefix>proxy/<port>/``, served by
  jupyter-server-proxy, which must be installed in the single-user server.
* Otherwise: ``http://127.0.0.1:PORT/`` (the browser runs on the same machine as the kernel).

This module is itself callable: ``tfnb.tensorboard(logdir)`` is :func:`tensorboard` whether
``tfnb.tensorboard`` names the function or this module.
"""
from __future__ import annotations

import datetime
import html
import logging
import os
import sys
import time
import types
from typing import Any, Callable, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ._tb_process import Failed, Launched, Outcome, Reused, TimedOut, ensure_tensorboard, stop
from .errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_HEIGHT = 800

_DATABRICKS_ORG = "spark.databricks.clusterUsageTags.clusterOwnerOrgId"
_DATABRICKS_CLUSTER = "spark.databricks.clusterUsageTags.clusterId"
_DATABRICKS_WORKSPACE = "spark.databricks.workspaceUrl"


def tensorboard(logdir, *, host: str | None = None, port: int | None = None,
                reload_interval: float | None = None, timeout: float | None = None,
                height: int | None = None, proxy_url: str | None = None,
                display: bool | None = None):
    """Show TensorBoard for ``logdir``: inline in a notebook, as a URL elsewhere.

    Starts TensorBoard on the driver, bound to 127.0.0.1, or reuses the one already serving
    ``logdir``. TensorBoard has no login: keep ``host`` on loopback unless the network is trusted.

    Args:
        logdir: directory holding event files (e.g. the ``log_dir`` given to ``tfnb.run``).
        host: address TensorBoard binds; default ``127.0.0.1`` (env ``TFNB_TENSORBOARD_HOST``).
        port: port to serve on; default a free one.
        reload_interval: seconds between logdir scans; default 5.
        timeout: seconds to wait for a new TensorBoard to serve; default 90.
        height: iframe height in pixels; default 800.
        proxy_url: URL template for the browser with ``%PORT%``, overriding ``TENSORBOARD_PROXY_URL``.
        display: True for the widget panel, False for printed text; default: the panel inside a
            Jupyter/Databricks kernel.

    Returns:
        With the panel, the :class:`TensorBoardPanel` shown (``.outcome``, ``.url``, ``.stop()``,
        ``.reload()``). Otherwise the outcome (``Launched``/``Reused``/``Failed``/``TimedOut``) after
        printing the URL, or the error and its fix to stderr.

    Raises:
        ConfigError: an argument has the wrong type or range.
        MissingDependencyError: tensorboard (or, for the panel, ipywidgets) is not installed.

    Example:
        >>> import tfnb
        >>> tfnb.tensorboard("/tmp/run1/logs")   # in a notebook cell
    """
    height = _check_height(height)
    options = dict(host=host, port=port, reload_interval=reload_interval, timeout=timeout)
    if display is None:
        from .progress import in_notebook

        display = in_notebook()
    if display:
        panel = TensorBoardPanel(logdir, height=height, proxy_url=proxy_url, start=False, **options)
        from IPython.display import display as show

        show(panel)  # first, so the cell shows "Starting..." during TensorBoard's slow start
        panel.reload()
        return panel
    outcome = ensure_tensorboard(logdir, **options)
    if isinstance(outcome, (Launched, Reused)):
        url = browser_url(outcome, proxy_url=proxy_url)
        verb = "Reusing" if isinstance(outcome, Reused) else "Started"
        print(f"{verb} TensorBoard for {outcome.logdir} at {url} (pid {outcome.pid})", flush=True)
    else:
        print(f"TensorBoard: {_problem_text(outcome)}", file=sys.stderr, flush=True)
    return outcome


# ---------------------------------------------------------------- URLs


def browser_url(outcome, *, proxy_url: str | None = None, environ: Mapping[str, str] | None = None,
                spark_conf: Mapping[str, str] | None = None) -> str:
    """The URL a notebook user's browser opens to reach a running TensorBoard.

    Args:
        outcome: a ``Launched``/``Reused`` outcome (or anything with ``.port`` and ``.url``).
        proxy_url: template with ``%PORT%``; default ``$TENSORBOARD_PROXY_URL``.
        environ: environment to read (default ``os.environ``).
        spark_conf: Spark conf to read on Databricks (default: the active session's).

    Returns:
        An absolute or host-relative URL, ending in ``/``.

    Example:
        >>> browser_url(outcome, proxy_url="/user/alice/proxy/%PORT%/")
        '/user/alice/proxy/6006/'
    """
    env = os.environ if environ is None else environ
    port = outcome.port
    template = proxy_url if proxy_url is not None else env.get("TENSORBOARD_PROXY_URL")
    if template:
        return template.replace("%PORT%", str(port))
    if env.get("DATABRICKS_RUNTIME_VERSION"):
        url = databricks_proxy_url(port, spark_conf if spark_conf is not None else _active_spark_conf())
        if url:
            return url
        log.warning("on Databricks but the cluster tags (%s, %s) are not readable; showing the driver's "
                    "own URL, which your browser may not reach: set TENSORBOARD_PROXY_URL",
                    _DATABRICKS_ORG, _DATABRICKS_CLUSTER)
    prefix = env.get("JUPYTERHUB_SERVICE_PREFIX")
    if prefix:
        return f"{prefix.rstrip('/')}/proxy/{port}/"
    return outcome.url


def databricks_proxy_url(port: int, conf: Mapping[str, str]) -> str | None:
    """Databricks driver-proxy URL for ``port``, or None when the cluster tags are missing.

    Untested on a live workspace (none is reachable from CI); the form
    ``/driver-proxy/o/<orgId>/<clusterId>/<port>/`` is the one Databricks documents for apps
    served from the driver.

    Example:
        >>> databricks_proxy_url(6006, {"spark.databricks.clusterUsageTags.clusterOwnerOrgId": "123",
        ...                             "spark.databricks.clusterUsageTags.clusterId": "0101-abc"})
        '/driver-proxy/o/123/0101-abc/6006/'
    """
    org, cluster = conf.get(_DATABRICKS_ORG), conf.get(_DATABRICKS_CLUSTER)
    if not org or not cluster:
        return None
    path = f"/driver-proxy/o/{org}/{cluster}/{port}/"
    workspace = (conf.get(_DATABRICKS_WORKSPACE) or "").strip().rstrip("/")
    if not workspace:
        return path
    if "://" not in workspace:
        workspace = "https://" + workspace
    return workspace + path


def _active_spark_conf() -> dict:
    try:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            return {}
        return {k: spark.conf.get(k, None) for k in (_DATABRICKS_ORG, _DATABRICKS_CLUSTER, _DATABRICKS_WORKSPACE)}
    except Exception as e:  # any Spark/Py4J trouble just means "no proxy tags"
        log.debug("could not read the Databricks cluster tags: %s", e)
        return {}


def _with_query(url: str, **params: Any) -> str:
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True) + [(k, str(v)) for k, v in params.items()]
    return urlunsplit(parts._replace(query=urlencode(query)))


# ---------------------------------------------------------------- rendering


def _check_height(height) -> int:
    if height is None:
        return DEFAULT_HEIGHT
    if isinstance(height, bool) or not isinstance(height, int) or height < 100:
        raise ConfigError(f"height={height!r} must be a whole number of pixels >= 100 (default {DEFAULT_HEIGHT})")
    return height


def _ago(start_time: float) -> str:
    return str(datetime.timedelta(seconds=max(0, int(time.time() - start_time))))


def _problem_text(outcome: Outcome) -> str:
    if isinstance(outcome, Failed):
        return f"could not start: {outcome.error}. Fix: {outcome.fix}"
    if isinstance(outcome, TimedOut):
        return f"did not start within {outcome.timeout:g} s (pid {outcome.pid} was stopped). Fix: {outcome.fix}"
    raise TypeError(f"not a problem outcome: {outcome!r}")


def status_html(outcome: Outcome) -> str:
    """One status paragraph for an outcome (escaped HTML)."""
    e = html.escape
    if isinstance(outcome, Reused):
        return (f"Reusing the TensorBoard serving <code>{e(outcome.logdir)}</code> (pid {outcome.pid}, "
                f"port {outcome.port}, started {_ago(outcome.instance.start_time)} ago).")
    if isinstance(outcome, Launched):
        return (f"TensorBoard started for <code>{e(outcome.logdir)}</code> (pid {outcome.pid}, "
                f"port {outcome.port}).")
    text = f"<b>TensorBoard {e(_problem_text(outcome))}</b>"
    if outcome.output:
        text += f"<pre style='max-height:12em;overflow:auto'>{e(outcome.output)}</pre>"
    return text


def frame_html(url: str, height: int) -> str:
    """The iframe showing TensorBoard at ``url``."""
    return (f'<iframe src="{html.escape(url, quote=True)}" title="TensorBoard" width="100%" '
            f'height="{height}" style="border:1px solid #ddd" loading="eager"></iframe>')


def link_html(url: str) -> str:
    e = html.escape(url, quote=True)
    return f'<a href="{e}" target="_blank" rel="noopener">{html.escape(url)}</a>'


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
        from ._deps import require

        widgets = require("ipywidgets", "the TensorBoard panel")
        self.logdir = logdir
        self.height = _check_height(height)
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
        stopped = isinstance(outcome, (Launched, Reused)) and stop(outcome)
        self.outcome = None
        self.url = None
        pid = f" (pid {outcome.pid})" if isinstance(outcome, (Launched, Reused)) else ""
        self._status.value = f"TensorBoard{pid} stopped. Reload starts it again."
        self._link.value = ""
        self._frame.value = ""
        self._stop_button.disabled = True
        return stopped

    def _render(self) -> None:
        outcome = self.outcome
        self._status.value = status_html(outcome)
        if isinstance(outcome, (Launched, Reused)):
            self.url = browser_url(outcome, proxy_url=self.proxy_url)
            self._link.value = link_html(self.url)
            self._reloads += 1
            # a changed src is what makes the browser fetch the page again
            src = self.url if self._reloads == 1 else _with_query(self.url, tfnb_reload=self._reloads)
            self._frame.value = frame_html(src, self.height)
            self._stop_button.disabled = False
        else:
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

        shell = get_ipython()
        count = getattr(shell, "execution_count", None)
        # tensorboard() shows the panel itself and also returns it; when that call is the cell's
        # last line, the returned value would show a second copy of the same panel.
        if count is not None and count == self._shown_in:
            return
        self._shown_in = count
        display(self.widget)

    def __repr__(self) -> str:
        state = self.url or "not running"
        return f"TensorBoardPanel({str(self.logdir)!r}, {state})"


class _CallableModule(types.ModuleType):
    """Makes ``tfnb.tensorboard(logdir)`` work whatever was imported first.

    The function shares its name with this module, and importing a submodule binds the package
    attribute ``tfnb.tensorboard`` to the module (e.g. after ``from tfnb.tensorboard import ...``
    or ``%tfnb_tensorboard``). Calling the module calls the function, so both spellings agree.
    """

    def __call__(self, *args, **kwargs):
        return tensorboard(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["tensorboard", "TensorBoardPanel", "browser_url", "databricks_proxy_url",
           "status_html", "frame_html"]
