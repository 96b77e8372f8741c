"""What runs inside a barrier task and its train_fn process: never imports the driver side or the display layer.

``entry`` (the task's bootstrap and body), ``setup`` (its spec and pure set-up functions), ``supervisor`` (the
train_fn process it runs), ``child`` (that process), ``warm`` (standbys), ``channel`` (the task's end of the
run's channel), ``context`` (``WorkerContext``), ``callbacks`` and ``events`` (progress from train_fn), ``feed``
and ``dataset`` (``tfnb.run(data=df)``), ``profiling`` (traces), ``local`` (a ps task run by the driver).
"""
