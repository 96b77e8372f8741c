"""Refusals of the progress display's arguments (no Spark)."""
from __future__ import annotations

import tfnb
from tfnb import ConfigError

from refusals import Refusals, case


@case("progress", "`ctx.progress_callback(batch_size=0)`", ConfigError, "batch_size=0", "examples per step",
      says="an int >= 1 (examples per step)")
def progress_callback_batch(env):
    from tfnb._task.context import WorkerContext

    WorkerContext(task_index=0, num_workers=2, job_name="chief", cluster_spec={}, tf_config={}).progress_callback(
        batch_size=0)


@case("progress", "`tfnb.ConsoleDisplay(interval=-1)`", ConfigError, "interval=-1", "seconds >= 0",
      says="seconds >= 0")
def progress_console_interval(env):
    tfnb.ConsoleDisplay(interval=-1)


class TestRefusals(Refusals):
    """The cases above."""
