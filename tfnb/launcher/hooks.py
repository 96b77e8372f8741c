"""The launcher surface add-ons build on (tfnb.compat does): hooks into one launch, and the payload check."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .._task.spill import ArrowSpill
from ..errors import ConfigError, summary

__all__ = ["LaunchHooks", "ArrowSpill", "pickle_fn"]


@dataclass(frozen=True)
class LaunchHooks:
    """What an add-on changes in one launch: ``tfnb.run(train_fn, hooks=LaunchHooks(...), ...)``.

    tfnb.compat is built on it; every field's default keeps ``tfnb.run``'s own behaviour.

    Attributes:
        feeder: feeds ``data`` (already one partition per task) through the add-on's own spill instead of
            tfnb's feeding: ``feeder.spill(batches, workdir)`` in the task before train_fn starts (write the
            batches with :class:`ArrowSpill`), ``feeder.finish(spilled, rows_per_task)`` returns ``ctx.feed``.
        all_results: ``tfnb.run`` returns every task's value as a list indexed by rank.
        daemon_ranks: tasks stopped (not failed) once every other task is done (servers: ps, evaluator).
        cancel: setting this event cancels the run (RunCancelledError).
        keep_port: keep the task's port reserved while train_fn runs; ``ctx.reserved_port()`` hands it over.
        task_cwd: run train_fn in the Spark task's working directory.

    Example:
        >>> values = tfnb.run(node_fn, hooks=LaunchHooks(all_results=True), num_workers=3)
    """

    feeder: Any = None
    all_results: bool = False
    daemon_ranks: frozenset = frozenset()
    cancel: threading.Event | None = None
    keep_port: bool = False
    task_cwd: bool = False


def pickle_fn(train_fn: Callable, args: Sequence = (), kwargs: Mapping[str, Any] | None = None) -> bytes:
    """``(train_fn, args, kwargs)`` pickled as the tasks receive them: check a payload before anything starts.

    Raises:
        ConfigError: they cannot be pickled; the message says what to change.
    """
    import cloudpickle

    try:
        return cloudpickle.dumps((train_fn, tuple(args), dict(kwargs or {})))
    except Exception as e:  # noqa: BLE001 - pickling errors come in many types
        raise ConfigError(
            f"train_fn or args cannot be sent to the workers ({summary(e, 120)}); create such objects inside "
            "train_fn, or pass paths/values through args\n"
            "train_fn and args are pickled for the workers: train_fn may capture only plain values (no "
            "SparkSession, DataFrame, lock, open file or model object)."
        ) from e
