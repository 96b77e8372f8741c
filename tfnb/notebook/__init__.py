"""tfnb's display layer: everything that renders a run or a sweep for a person (the console, the live widget and
sweep panel, the TensorBoard panel and verb, the IPython magics).

Only this package (and the public front ``tfnb``) may import IPython or ipywidgets; the core never imports it. It
plugs into the core's display registry (:mod:`tfnb.monitor.display`): importing it registers the ``console`` and
``widget`` displays of runs and sweeps. ``import tfnb`` imports it with the first public verb used (at once inside an
IPython kernel); ``%load_ext tfnb`` also loads it. ipywidgets itself is imported only when a widget is built.
"""
from __future__ import annotations

from ..monitor.display import register_display
from .console import ConsoleDisplay
from .magics import load_ipython_extension
from .progress import ProgressWidget
from .sweep import SweepConsole, SweepPanel
from .tensorboard import TensorBoardPanel

register_display("console", lambda num_workers, num_ps, max_attempts: ConsoleDisplay(num_workers=num_workers,
                                                                                    num_ps=num_ps))
register_display("widget", ProgressWidget.for_run)
register_display("console", SweepConsole, kind="sweep")
register_display("widget", SweepPanel.for_sweep, kind="sweep")

__all__ = ["ConsoleDisplay", "ProgressWidget", "SweepConsole", "SweepPanel", "TensorBoardPanel",
           "load_ipython_extension"]
