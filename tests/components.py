"""Real components the tests need (Chromium, rclone, root for tmpfs or another uid...).

:func:`need` skips the calling test when a component is missing, with the fix, so a developer's
machine without Chromium still runs the rest; under CI (``CI`` set to anything but ``false``/``0``)
it fails the test instead, so a broken CI image cannot turn the suite green by skipping.
tests/conftest.py applies the same rule to skips raised elsewhere (``pytest.importorskip``,
fixtures that skip when a binary is missing). Skips are listed at the end of the run (``-ra``).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

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


def cached_venv(cache: Path, requirements: Sequence[str]) -> Path:
    """A virtualenv holding ``requirements``, built once (under a lock, marked by a ``ready`` file) into
    ``cache/<hash of the Python version and requirements>`` and reused after that.

    Raises:
        RuntimeError: venv or pip failed; the message has their output.
    """
    key = hashlib.sha256("\n".join([sys.version.split()[0], *requirements]).encode()).hexdigest()[:16]
    venv = cache / key
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "ready").is_file():
            shutil.rmtree(venv, ignore_errors=True)
            start = time.monotonic()
            # this checkout on PYTHONPATH (for Spark's workers) must not leak into the new venv's pip
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            for cmd in ([sys.executable, "-m", "venv", venv],
                        [venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
                         *requirements]):
                res = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if res.returncode != 0:
                    raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
            (venv / "ready").write_text(f"built in {time.monotonic() - start:.0f} s\n")
    return venv
