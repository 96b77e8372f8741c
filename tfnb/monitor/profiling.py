"""Profiler traces of a tfnb run (``tfnb.run(..., profile_steps=(20, 25))``; README, "Profiling").

Each train_fn process traces the steps (counted from 1 across epochs, both included, as Keras'
``profile_batch``) from ``ctx.progress_callback()`` or ``ctx.profile(step)``, and the trace lands at
``<log_dir>/plugins/profile/<run>/<role>-<index>.xplane.pb``: ``<run>`` is the attempt's start time
in TensorFlow's own format (the newest sorts first), and the task's name (``chief-0``, ``worker-1``)
makes TensorBoard's Profile tab show one host per worker even when they share a machine.
TensorFlow names its file after the hostname and writes only to paths it can open itself, so the
trace goes to a private local folder first, then through tfnb's storage layer. A trace that cannot
be taken or written never stops training: the process says so once, in one log line.
"""
from __future__ import annotations

import logging
from typing import Any

from ..errors import ConfigError

log = logging.getLogger(__name__)


def check_profile_steps(profile_steps: Any, log_dir: str | None) -> tuple[int, int] | None:
    """``profile_steps`` as ``(first, last)``, checked on the driver before anything is launched.

    Raises:
        ConfigError: not a step or a pair of steps >= 1 in order, or no ``log_dir`` to write to.
    """
    if profile_steps is None:
        return None
    pair = (profile_steps, profile_steps) if isinstance(profile_steps, int) else profile_steps
    ok = (isinstance(pair, (tuple, list)) and len(pair) == 2
          and all(isinstance(s, int) and not isinstance(s, bool) for s in pair))
    if not ok or not 1 <= pair[0] <= pair[1]:
        hint = (f"; did you mean profile_steps=({pair[1]}, {pair[0]})?" if ok and 1 <= pair[1] < pair[0]
                else "")
        raise ConfigError(f"profile_steps={profile_steps!r} must be (first, last) training steps to trace, "
                          f"counted from 1 with first <= last, e.g. profile_steps=(20, 25){hint}")
    if not log_dir:
        raise ConfigError(f"profile_steps={profile_steps!r} needs log_dir=: each worker's trace goes to "
                          "<log_dir>/plugins/profile/ for TensorBoard; pass log_dir= (a path or URL every "
                          "worker can write) or remove profile_steps")
    return int(pair[0]), int(pair[1])


