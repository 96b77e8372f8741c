"""The train functions tests/test_sweep.py sweeps over: custom loops without TensorFlow, reporting each epoch with
``ctx.report``. A module of their own, importing nothing heavy: a train_fn is pickled by reference to its module,
so each trial's process imports that module, and the test module's imports (pytest, MLflow, Optuna) would cost every
trial seconds."""
from __future__ import annotations

import os
import time

# each good trial beats every one before it (the median pruner leaves it alone), one fails, and the diverging one
# comes last: it starts once six have ended, and its first epoch is far above their median
TRIALS = [(0.05, 8), (0.03, 8), (0.02, 16), (0.01, 32), (0.01, 16), (0.005, 16), (0.003, 16), (50.0, 16)]


def fit_trial(ctx, params):
    """Two epochs whose loss is the learning rate over the epoch, reported at each epoch end. units=32 fails before
    training; a learning rate above 1 lingers after its first epoch long enough to be pruned while it runs (or to
    fail the test by finishing). Its "model" is a file MLflow logs as it is."""
    lr, units = params["learning_rate"], params["units"]
    print(f"units={units} learning_rate={lr}")
    if units == 32:
        raise ValueError(f"units={units} does not fit in the worker's memory")
    losses = []
    for epoch in (1, 2):
        losses.append(lr / epoch)
        ctx.report(epoch=epoch, epochs=2, epoch_end=True, loss=losses[-1])
        if lr > 1:
            time.sleep(120)
    with open(os.path.join(ctx.model_dir, "model.keras"), "w") as f:
        f.write(f"units={units} learning_rate={lr}\n")
    return {"loss": losses}  # as Keras' history.history: the objective is the last item


def two_workers(ctx, params):
    ctx.report(epoch=1, epochs=1, epoch_end=True, loss=params["learning_rate"])
    return {"loss": params["learning_rate"], "workers": ctx.num_workers}


def always_fails(ctx, params):
    raise ZeroDivisionError("division by zero in the loss")


def slow_epochs(ctx, params):
    for epoch in range(1, 61):
        time.sleep(0.5)
        ctx.report(epoch=epoch, epochs=60, epoch_end=True, loss=params["x"] / epoch)
    return params["x"]
