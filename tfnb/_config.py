"""Settings resolve once, on the driver: explicit keyword, then TFNB_* environment, then default.

A train_fn process reads the driver's ``TFNB_*`` settings (:func:`use_settings`), not the executor's environment.
"""
from __future__ import annotations

import os
from typing import Callable, Mapping, TypeVar

from .errors import ConfigError

T = TypeVar("T")


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(text)


_CASTS: dict[type, Callable[[str], object]] = {bool: _bool, int: int, float: float, str: str}


_SOURCE: Mapping[str, str] = os.environ  # where TFNB_* settings are read: the driver's environment


def use_settings(pairs: tuple) -> None:
    """Read settings from ``pairs`` (the driver's TFNB_* settings) in this process from now on."""
    global _SOURCE
    _SOURCE = dict(pairs)


def setting(name: str, explicit: T | None, default: T, cast: type | None = None) -> T:
    """``explicit`` unless None, else ``TFNB_<NAME>`` parsed as ``cast`` (default: ``type(default)``), else
    ``default``; ConfigError when the variable does not parse."""
    if explicit is not None:
        return explicit
    var = "TFNB_" + name.upper()
    raw = _SOURCE.get(var)
    if raw is None:
        return default
    kind = cast or type(default)
    try:
        return _CASTS.get(kind, kind)(raw)  # type: ignore[return-value]
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"{var}={raw!r} is not a valid {getattr(kind, '__name__', kind)}; fix or unset {var}"
        ) from e
