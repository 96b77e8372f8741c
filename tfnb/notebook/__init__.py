"""tfnb's display layer: consoles, live panels, the TensorBoard panel and the magics. Only this package (and the
front ``tfnb``) imports IPython or ipywidgets (the latter when a widget is built); importing it registers the
``console`` and ``widget`` displays of runs and sweeps in :mod:`tfnb.monitor.display`."""
from __future__ import annotations

from ..monitor.display import register_display
from .console import ConsoleDisplay
from .magics import load_ipython_extension
from .progress import ProgressWidget
from .sweep import SweepConsole, SweepPanel
from .tensorboard import TensorBoardPanel

register_display("console", ConsoleDisplay)
register_display("widget", ProgressWidget.shown)
register_display("console", SweepConsole, kind="sweep")
register_display("widget", SweepPanel.shown, kind="sweep")

__all__ = ["ConsoleDisplay", "ProgressWidget", "SweepConsole", "SweepPanel", "TensorBoardPanel",
           "load_ipython_extension"]
