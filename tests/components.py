"""Real components the tests need (Chromium, rclone, root for tmpfs or another uid...).

:func:`need` skips the calling test when a component is missing, with the fix, so a developer's
machine without Chromium still runs the rest; under CI (``CI`` set to anything but ``false``/``0``)
it fails the test instead, so a broken CI image cannot turn the suite green by skipping.
tests/conftest.py applies the same rule to skips raised elsewhere (``pytest.importorskip``,
fixtures that skip when a binary is missing). Skips are listed at the end of the run (``-ra``).
"""
from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
# How skips for a missing component read (need() below, importorskip, the fixtures in this folder).
MISSING = ("needs ", "could not import", "not importable", "not found", "not installed", "cannot mount",
           "no module named")


def need(component: str, available: bool, fix: str) -> None:
    """Skip (outside CI) or fail (in CI) the calling test unless ``available``.

    Example:
        >>> need("Debian chromium", os.access("/usr/bin/chromium", os.X_OK), "apt-get install chromium")
    """
    if available:
        return
    message = f"needs {component}: {fix}"
    if IN_CI:
        pytest.fail(f"{message} (CI is set: a missing component fails instead of skipping)", pytrace=False)
    pytest.skip(message)


def is_missing_component(reason: str) -> bool:
    """True when a skip's reason says a real component is missing (see MISSING)."""
    low = reason.lower()
    return any(mark in low for mark in MISSING)
