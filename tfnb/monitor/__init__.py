"""Watching a run from the driver: ``progress`` (the run model), ``display`` (how it is shown), ``sync``
(``EventSync``), ``evaluator`` (``Evaluator``), ``tensorboard`` (TensorBoard processes), ``tracking`` (MLflow),
``charts`` and ``profiling``. Typed outcomes only: the display layer (``tfnb.notebook``) renders them."""
