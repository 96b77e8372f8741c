"""How a run is shown: the display protocol, the registry the display layer plugs into, and the choice.

``tfnb.run`` hands every :class:`tfnb.RunEvent` to a *display*: any callable taking a RunEvent, with an
optional ``batch(events)`` and ``close()`` (see :class:`Display`). This module is core: it never imports
the display layer. ``none`` is built in; :mod:`tfnb.notebook` registers ``console`` and ``widget`` when it
is imported (``import tfnb`` does that with the first public verb), and ``auto`` picks the widget in a
notebook, the console elsewhere.
"""
from __future__ import annotations

import sys
from typing import Callable, Protocol

from .._config import setting
from .._protocol import RunEvent
from ..errors import ConfigError

DISPLAY_MODES = ("auto", "widget", "console", "none")


class Display(Protocol):
    """What ``tfnb.run(display=...)`` accepts: called with every RunEvent on the driver's main thread. A display may
    also have ``batch(events)``: the driver then hands it the events of one pass over its inbox (up to thousands at
    scale) in one call instead of one call each, so it can fold them and redraw once. And ``close()``, called once
    when the run ends (also on failure or Ctrl-C)."""

    def __call__(self, event: RunEvent) -> None: ...


def show(display: Display, batch: list) -> None:
    """Hand ``batch`` (RunEvents, in order) to ``display``: one ``batch()`` call when it has one."""
    if not batch:
        return
    handle = getattr(display, "batch", None)
    if handle is not None:
        handle(batch)
    else:
        for event in batch:
            display(event)


class _NoDisplay:
    """TFNB_DISPLAY=none: events are dropped (failures still raise from ``tfnb.run``)."""

    def __call__(self, event: RunEvent) -> None:
        pass

    def close(self) -> None:
        pass


def in_notebook() -> bool:
    """True inside a Jupyter (ipykernel) or Databricks notebook kernel."""
    ip = sys.modules.get("IPython")
    if ip is None:
        return False
    shell = ip.get_ipython() if hasattr(ip, "get_ipython") else None
    if shell is None:
        return False
    return any(c.__name__ in ("ZMQInteractiveShell", "DatabricksShell") for c in type(shell).__mro__)


# mode -> factory(num_workers=, num_ps=, max_attempts=) -> display; the display layer (tfnb.notebook, which
# ``import tfnb`` loads with the first public verb) adds "console" and "widget"
_FACTORIES: dict = {"none": lambda num_workers, num_ps, max_attempts: _NoDisplay()}


def register_display(mode: str, factory: Callable[..., Display]) -> None:
    """Add (or replace) a display mode for ``TFNB_DISPLAY=mode``; how the notebook layer plugs in.

    Args:
        mode: the name users give in ``TFNB_DISPLAY``.
        factory: called as ``factory(num_workers=, num_ps=, max_attempts=)``; returns a display.

    Example:
        >>> register_display("widget", ProgressWidget.for_run)   # done by tfnb.notebook
    """
    _FACTORIES[mode] = factory


def auto_display(num_workers: int, num_ps: int = 0, *, mode: str | None = None,
                 max_attempts: int | None = None) -> Display:
    """The display ``tfnb.run`` uses when none is given: a live widget in notebooks, console otherwise.

    Args:
        num_workers: chief + worker tasks of the run.
        num_ps: parameter-server tasks of the run.
        mode: ``"auto"``, ``"widget"``, ``"console"`` or ``"none"``. Env: TFNB_DISPLAY. Default auto.
        max_attempts: launches the run may make (shown as "attempt n/N").

    Returns:
        A callable taking each RunEvent, with a ``close()`` to call when the run ends.

    Raises:
        ConfigError: an unknown mode, or ``widget`` while the notebook layer is not loaded.

    Example:
        >>> import os
        >>> os.environ["TFNB_DISPLAY"] = "console"     # plain output even in a notebook
        >>> tfnb.run(train_fn, num_workers=2)
    """
    chosen = setting("display", mode, "auto", str).strip().lower()
    if chosen not in DISPLAY_MODES and chosen not in _FACTORIES:
        raise ConfigError(
            f"display mode {chosen!r} (TFNB_DISPLAY or mode=) is not one of {', '.join(DISPLAY_MODES)}; "
            "set TFNB_DISPLAY=widget, console or none, or unset it")
    if chosen == "auto":
        chosen = next(m for m in ("widget" if in_notebook() else "", "console", "none") if m in _FACTORIES)
    factory = _FACTORIES.get(chosen)
    if factory is None:
        raise ConfigError(f"TFNB_DISPLAY={chosen} needs the display layer: run `import tfnb.notebook` first "
                          "(`import tfnb` loads it with the first verb you use), or set TFNB_DISPLAY=none")
    return factory(num_workers=num_workers, num_ps=num_ps, max_attempts=max_attempts)


def make_display(display: Display | bool | None, num_workers: int, num_ps: int = 0,
                 max_attempts: int | None = None) -> Display:
    """The display for ``tfnb.run(display=...)``: the launcher surface add-ons (tfnb.compat) use too.

    Args:
        display: a callable taking RunEvents (used as is), False for none, None/True for the
            default (:func:`auto_display`).
        num_workers: chief + worker tasks of the run.
        num_ps: parameter-server tasks.
        max_attempts: launches the run may make, when known.

    Returns:
        A display; call its ``close()`` (when it has one) once the run ends.

    Example:
        >>> sink = make_display(None, num_workers=2)
    """
    if display is False:
        return _NoDisplay()
    if callable(display):
        return display
    return auto_display(num_workers=num_workers, num_ps=num_ps, max_attempts=max_attempts)
