"""What runs inside a barrier task and its train_fn process: never imports the driver side or the display layer.
``entry`` (the task), ``supervisor`` and ``child`` (the train_fn process), ``warm`` (standbys), ``keras3`` (Keras
corrections), ``feed`` and ``dataset`` (``tfnb.run(data=df)``), ``context`` (``WorkerContext``)."""
