"""The train functions tests/test_sweep.py sweeps over: custom loops without TensorFlow, reporting each epoch with
``ctx.report``. A module of their own, importing nothing heavy: a train_fn is pickled by reference to its module,
so each trial's process imports that module, and the test module's imports (pytest, MLflow, Optuna) would cost every
trial seconds."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

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


def index_bug(ctx, params):
    """A bug whose message holds data: every trial raises IndexError on this line, each naming another index."""
    import numpy as np

    return float(np.zeros(3)[params["i"] + 10])


def _executor_jvm() -> int:
    """The pid of the executor JVM this process descends from (as tests/test_masters.py finds it)."""
    pid = os.getpid()
    while pid > 1:
        if b"java" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]:
            return pid
        status = Path(f"/proc/{pid}/status").read_text()
        pid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
    return -1


def lose_executor(ctx, params):
    """kill=1: worker 1 SIGKILLs its executor JVM (a lost node) and goes down with it; kill=0 trains one epoch."""
    if params["kill"] and ctx.task_index == 1:
        os.kill(_executor_jvm(), signal.SIGKILL)
        time.sleep(60)
    ctx.report(epoch=1, epochs=1, epoch_end=True, loss=0.5)
    return 0.5


def slow_epochs(ctx, params):
    for epoch in range(1, 61):
        time.sleep(0.5)
        ctx.report(epoch=epoch, epochs=60, epoch_end=True, loss=params["x"] / epoch)
    return params["x"]
