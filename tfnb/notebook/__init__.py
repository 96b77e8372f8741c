"""tfnb's notebook layer: the live progress widget, the TensorBoard panel and the IPython magics.

Only this package (and the thin front modules ``tfnb`` and ``tfnb.tensorboard``) may import
IPython or ipywidgets; the core (launcher, tasks, data, storage, evaluator) never imports it. It
plugs into the core through the display registry: importing it registers the ``widget`` display
mode, which ``tfnb.run`` then uses by default in a notebook. ``import tfnb`` imports this package
by itself when IPython is loaded, so notebook users need no extra step; ``%load_ext tfnb`` also
loads it. ipywidgets itself is imported only when a widget is built.

Example:
    >>> import tfnb.notebook                        # done by `import tfnb` in a kernel
    >>> w = tfnb.notebook.ProgressWidget(num_workers=2)
"""
from __future__ import annotations

from ..progress import register_display
from .magics import load_ipython_extension
from .progress import ProgressWidget
from .tensorboard import TensorBoardPanel

register_display("widget", ProgressWidget.for_run)

__all__ = ["ProgressWidget", "TensorBoardPanel", "load_ipython_extension"]
