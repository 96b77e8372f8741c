"""Watching a run from the driver: ``progress`` (the run model), ``display`` (how it is shown), ``sync``
(``EventSync``), ``evaluator`` (``Evaluator``, over ``checkpoints`` and ``eval_model``), ``tensorboard``,
``tracking`` (MLflow) and ``charts``. Typed outcomes only: the display layer (``tfnb.notebook``) renders them."""
