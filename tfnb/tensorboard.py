"""TensorBoard on the driver: ``tfnb.tensorboard(logdir)``, its outcomes, and the instances running.

:func:`tensorboard` asks :mod:`tfnb._tb_process` for a TensorBoard serving ``logdir`` (reusing a
running one) and shows the typed outcome (:class:`Launched`, :class:`Reused`, :class:`Failed`,
:class:`TimedOut`): inside a Jupyter or Databricks kernel as the panel of
:mod:`tfnb.notebook.tensorboard`, elsewhere as one line with the URL. :func:`instances` lists the
TensorBoards tfnb runs for this user and :func:`stop` stops one. The module itself is callable, so
``tfnb.tensorboard(logdir)`` works whether ``tfnb.tensorboard`` names the function or this module.
"""
from __future__ import annotations

import logging
import os
import sys
import types
from typing import Mapping

from ._tb_process import (Failed, Launched, Outcome, Reused, TensorBoardInstance, TimedOut, ensure_tensorboard,
                          instances, stop)
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
    height = check_height(height)
    options = dict(host=host, port=port, reload_interval=reload_interval, timeout=timeout)
    if display is None:
        from .progress import in_notebook

        display = in_notebook()
    if display:
        from .notebook.tensorboard import show_panel

        return show_panel(logdir, height=height, proxy_url=proxy_url, **options)
    outcome = ensure_tensorboard(logdir, **options)
    if isinstance(outcome, (Launched, Reused)):
        url = browser_url(outcome, proxy_url=proxy_url)
        verb = "Reusing" if isinstance(outcome, Reused) else "Started"
        print(f"{verb} TensorBoard for {outcome.logdir} at {url} (pid {outcome.pid})", flush=True)
        if outcome.warning:
            print(f"TensorBoard: {outcome.warning}", file=sys.stderr, flush=True)
    else:
        print(f"TensorBoard: {problem_text(outcome)}", file=sys.stderr, flush=True)
    return outcome


def browser_url(outcome, *, proxy_url: str | None = None, environ: Mapping[str, str] | None = None,
                spark_conf: Mapping[str, str] | None = None) -> str:
    """The URL a notebook user's browser opens to reach a running TensorBoard.

    The first that applies: ``proxy_url`` or ``TENSORBOARD_PROXY_URL`` with ``%PORT%`` replaced (the
    convention of TensorBoard's own ``%tensorboard``); on Databricks (``DATABRICKS_RUNTIME_VERSION``
    set) the driver proxy, :func:`databricks_proxy_url`; under JupyterHub (``JUPYTERHUB_SERVICE_PREFIX``
    set) ``<prefix>proxy/<port>/``, served by jupyter-server-proxy; else the driver's own
    ``http://127.0.0.1:PORT/`` (the browser runs on the kernel's machine).

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

    ``https://<workspaceUrl>/driver-proxy/o/<orgId>/<clusterId>/<port>/``, from the
    ``spark.databricks.*`` conf: the form Databricks documents for apps served from the driver,
    unit-tested but not run on a live workspace (none is reachable from CI).

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
    if workspace and "://" not in workspace:
        workspace = "https://" + workspace
    return workspace + path


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
    """The panel height in pixels: ``height`` checked, or the default."""
    if height is None:
        return DEFAULT_HEIGHT
    if isinstance(height, bool) or not isinstance(height, int) or height < 100:
        raise ConfigError(f"height={height!r} must be a whole number of pixels >= 100 (default {DEFAULT_HEIGHT})")
    return height


def problem_text(outcome: Outcome) -> str:
    """What went wrong and the fix, for a ``Failed`` or ``TimedOut`` outcome."""
    if isinstance(outcome, Failed):
        return f"could not start: {outcome.error}. Fix: {outcome.fix}"
    if isinstance(outcome, TimedOut):
        return f"did not start within {outcome.timeout:g} s (pid {outcome.pid} was stopped). Fix: {outcome.fix}"
    raise TypeError(f"not a problem outcome: {outcome!r}")


class _CallableModule(types.ModuleType):
    # Importing this module (``from tfnb.tensorboard import ...``, ``%tfnb_tensorboard``) binds the
    # package attribute ``tfnb.tensorboard`` to it instead of the function: calling it must still work.

    def __call__(self, *args, **kwargs):
        return tensorboard(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["tensorboard", "browser_url", "databricks_proxy_url", "instances", "stop", "ensure_tensorboard",
           "Launched", "Reused", "Failed", "TimedOut", "Outcome", "TensorBoardInstance", "problem_text",
           "check_height"]
