"""Settings resolve once, on the driver: explicit keyword, then TFNB_* environment, then default.

A train_fn process reads the driver's ``TFNB_*`` settings (:func:`use_settings`), not the executor's environment.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping, TypeVar

from .errors import ConfigError

T = TypeVar("T")


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low not in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
        raise ValueError(text)
    return low in ("1", "true", "yes", "on")


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


def check_seconds(name: str, value: Any, must: str | None = None, *,
                  optional: bool = False, zero: bool = False) -> float | None:
    """``value`` as seconds: a number (not a bool) > 0 (>= 0 when ``zero``), or None when ``optional``; else
    ConfigError "``name``=``value`` must be ``must``"."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 if zero else value > 0):
        raise ConfigError(f"{name}={value!r} must be {must or 'a number of seconds ' + ('>= 0' if zero else '> 0')}")
    return float(value)
