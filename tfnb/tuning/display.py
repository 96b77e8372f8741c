"""How a sweep is shown: the registry the display layer plugs its sweep panel and console into, and the choice.

A sweep display is any callable taking :class:`~tfnb.tuning.outcomes.SweepEvent` s, with an optional
``close()``; the sweep calls it from the thread that called ``tfnb.sweep`` only. This module is core: it
never imports the display layer; :mod:`tfnb.notebook` registers ``console`` and ``widget`` when imported,
and ``TFNB_DISPLAY`` picks between them as it does for ``tfnb.run``.
"""
from __future__ import annotations

from typing import Any, Callable

from .._config import setting
from ..errors import ConfigError
from ..monitor.display import DISPLAY_MODES, in_notebook


class _NoDisplay:
    def __call__(self, event) -> None:
        pass

    def close(self) -> None:
        pass


# mode -> factory(n_trials=, at_once=, metric=, direction=) -> display; tfnb.notebook adds console and widget
_FACTORIES: dict = {"none": lambda **shape: _NoDisplay()}


def register_sweep_display(mode: str, factory: Callable[..., Any]) -> None:
    """Add (or replace) the sweep display of ``TFNB_DISPLAY=mode``; how the notebook layer plugs in.

    Example:
        >>> register_sweep_display("widget", SweepPanel.for_sweep)   # done by tfnb.notebook
    """
    _FACTORIES[mode] = factory


def check_display(display: Any) -> None:
    """Refuse a ``display=`` that is neither a callable, False nor None (before anything starts)."""
    if not (display is None or isinstance(display, bool) or callable(display)):
        raise ConfigError(f"display={display!r} must be a callable taking SweepEvents, False for none, or None "
                          "for the default (a live panel in notebooks, lines on the console)")


def make_sweep_display(display: Any, **shape: Any):
    """The display for ``tfnb.sweep(display=...)``: a callable as given, False for none, else by TFNB_DISPLAY
    (default auto: the live panel in a notebook, lines on the console elsewhere).

    Raises:
        ConfigError: an unknown TFNB_DISPLAY mode.
    """
    check_display(display)
    if display is False:
        return _NoDisplay()
    if callable(display):
        return display
    chosen = setting("display", None, "auto", str).strip().lower()
    if chosen not in DISPLAY_MODES and chosen not in _FACTORIES:
        raise ConfigError(f"TFNB_DISPLAY={chosen!r} is not one of {', '.join(DISPLAY_MODES)}; set it to widget, "
                          "console or none, or unset it")
    if chosen == "auto":
        chosen = "widget" if in_notebook() and "widget" in _FACTORIES else "console"
    return _FACTORIES.get(chosen, _FACTORIES["none"])(**shape)
