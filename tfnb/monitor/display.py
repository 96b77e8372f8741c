"""How a run or a sweep is shown: the display protocol (a callable taking :class:`tfnb.RunEvent` s), the one
registry the display layer plugs into, the choice. Core: :mod:`tfnb.notebook` registers ``console`` and ``widget``
of each kind when imported; ``none`` is built in."""
from __future__ import annotations

import sys
from typing import Any, Callable, Protocol

from .._config import setting
from .._protocol import RunEvent
from ..errors import ConfigError

DISPLAY_MODES = ("auto", "widget", "console", "none")


class Display(Protocol):
    """Called with every event on the thread that called the verb. With ``batch(events)``, a run's driver hands it
    the events of one pass over its inbox (thousands at scale) in one call, to fold and redraw once; ``close()`` is
    called once when the run or sweep ends (also on failure or Ctrl-C)."""

    def __call__(self, event: RunEvent) -> None: ...


def show(display: Display, batch: list) -> None:
    """Hand ``batch`` (events, in order) to ``display``: one ``batch()`` call when it has one."""
    if batch and hasattr(display, "batch"):
        display.batch(batch)
    else:
        for event in batch:
            display(event)


def _drop(event: RunEvent | None = None) -> None:
    """TFNB_DISPLAY=none or display=False: events are dropped (failures still raise from the verb)."""


_drop.close = _drop  # type: ignore[attr-defined]


def in_notebook() -> bool:
    """True inside a Jupyter (ipykernel) or Databricks notebook kernel."""
    ip = sys.modules.get("IPython")
    shell = ip.get_ipython() if ip is not None and hasattr(ip, "get_ipython") else None
    return shell is not None and any(
        c.__name__ in ("ZMQInteractiveShell", "DatabricksShell") for c in type(shell).__mro__)


# kind -> mode -> factory(**shape) -> display
_FACTORIES: dict = {kind: {"none": lambda **shape: _drop} for kind in ("run", "sweep")}


def register_display(mode: str, factory: Callable[..., Display], kind: str = "run") -> None:
    """Add (or replace) ``TFNB_DISPLAY=mode`` of ``kind`` (``"run"`` or ``"sweep"``); how the notebook layer plugs
    in. ``factory`` is called as ``factory(num_workers=, num_ps=, max_attempts=)`` for a run,
    ``factory(n_trials=, at_once=, metric=, direction=)`` for a sweep."""
    _FACTORIES[kind][mode] = factory


def check_display(display: Any, kind: str = "run") -> None:
    """Refuse a ``display=`` that is neither a callable, False nor None (before anything starts)."""
    if not (display is None or isinstance(display, bool) or callable(display)):
        raise ConfigError(f"display={display!r} must be a callable taking {kind.title()}Events, False for none, or "
                          "None for the default (a live panel in notebooks, lines on the console)")


def make_display(display: Display | bool | None, num_workers: int | None = None, num_ps: int = 0,
                 max_attempts: int | None = None, *, kind: str = "run", mode: str | None = None,
                 **shape: Any) -> Display:
    """The display for ``tfnb.run(display=...)`` and ``tfnb.sweep(display=...)``; add-ons (tfnb.compat) use it too.

    Args:
        display: a callable taking events (used as is), False for none, None/True for the ``mode``'s.
        num_workers, num_ps, max_attempts: the run's tasks and launches, when known.
        kind: ``"run"``, or ``"sweep"`` with the sweep's ``shape`` (see :func:`register_display`).
        mode: ``"auto"`` (a widget in a notebook, the console elsewhere), ``"widget"``, ``"console"`` or ``"none"``.
            Env: TFNB_DISPLAY.

    Raises:
        ConfigError: ``display`` is none of those, an unknown mode, or ``widget`` without the notebook layer.

    Example:
        >>> sink = make_display(None, num_workers=2)   # call its close(), when it has one, once the run ends
    """
    check_display(display, kind)
    if display is False:
        return _drop
    if callable(display):
        return display
    factories = _FACTORIES[kind]
    chosen = setting("display", mode, "auto", str).strip().lower()
    if chosen not in DISPLAY_MODES and chosen not in factories:
        raise ConfigError(
            f"display mode {chosen!r} (TFNB_DISPLAY or mode=) is not one of {', '.join(DISPLAY_MODES)}; "
            "set TFNB_DISPLAY=widget, console or none, or unset it")
    if chosen == "auto":
        chosen = next(m for m in ("widget" if in_notebook() else "", "console", "none") if m in factories)
    if chosen not in factories:
        raise ConfigError(f"TFNB_DISPLAY={chosen} needs the display layer: run `import tfnb.notebook` first "
                          "(`import tfnb` loads it with the first verb you use), or set TFNB_DISPLAY=none")
    if kind == "run":
        shape.update(num_workers=num_workers, num_ps=num_ps, max_attempts=max_attempts)
    return factories[chosen](**shape)
