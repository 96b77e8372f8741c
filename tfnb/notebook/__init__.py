"""tfnb's display layer: the console display, the live progress widget, the sweep panel and console, the
TensorBoard panel and verb, the IPython magics. Everything that renders a run (or a sweep) for a person lives here.

Only this package (and the public front ``tfnb``) may import IPython or ipywidgets; the core (launcher,
tasks, data, storage, monitor) never imports it. It plugs into the core through the display registry
of :mod:`tfnb.monitor.progress`: importing it registers the ``console`` and ``widget`` display modes,
and ``tfnb.run`` picks the widget in a notebook, the console elsewhere (``tfnb.sweep`` likewise, through
:mod:`tfnb.tuning.display`). ``import tfnb`` imports this package with the first public verb used (and at
once inside an IPython kernel), so users need no extra step; ``%load_ext tfnb`` also loads it. ipywidgets
itself is imported only when a widget is built.
"""
from __future__ import annotations

from ..monitor.display import register_display
from ..tuning.display import register_sweep_display
from .console import ConsoleDisplay
from .magics import load_ipython_extension
from .progress import ProgressWidget
from .sweep import SweepConsole, SweepPanel
from .tensorboard import TensorBoardPanel

register_display("console", lambda num_workers, num_ps, max_attempts: ConsoleDisplay(num_workers=num_workers,
                                                                                    num_ps=num_ps))
register_display("widget", ProgressWidget.for_run)
register_sweep_display("console", SweepConsole)
register_sweep_display("widget", SweepPanel.for_sweep)

__all__ = ["ConsoleDisplay", "ProgressWidget", "SweepConsole", "SweepPanel", "TensorBoardPanel",
           "load_ipython_extension"]
