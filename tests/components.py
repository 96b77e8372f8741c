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
import socket
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


def cached_venv(cache: Path, requirements: Sequence[str], *, python: str | os.PathLike | None = None) -> Path:
    """A virtualenv holding ``requirements``, built once (under a lock, marked by a ``ready`` file) into
    ``cache/<hash of the Python version and requirements>`` and reused after that.

    Args:
        cache: folder holding the cached virtualenvs (created if missing).
        requirements: pip requirement specifiers, installed in one ``pip install``.
        python: the interpreter to build the virtualenv with (``~/.pyenv/versions/3.12.1/bin/python3.12``);
            default: the one running the tests.

    A build that died half way (no ``ready`` file) or whose interpreter is gone is built again. The
    virtualenv's ``pip freeze`` is kept beside it in ``freeze.txt``.

    Raises:
        RuntimeError: ``python`` does not run, or venv or pip failed; the message has their output.
    """
    # this checkout on PYTHONPATH (for Spark's workers) must not leak into the new venv or its pip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    interpreter = str(python) if python is not None else sys.executable
    version = sys.version.split()[0]
    if python is not None:
        res = subprocess.run([interpreter, "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True, env=env)
        if res.returncode != 0:
            raise RuntimeError(f"{interpreter} does not run ({res.returncode}): {res.stderr[-2000:]}")
        version = res.stdout.strip()
    key = hashlib.sha256("\n".join([version, *requirements]).encode()).hexdigest()[:16]
    venv = cache / key
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = venv / "ready"
        if ready.is_file() and not (venv / "bin" / "python").resolve().is_file():
            ready.unlink()  # the interpreter it was made with is gone (pyenv version removed)
        if not ready.is_file():
            shutil.rmtree(venv, ignore_errors=True)
            start = time.monotonic()
            python_in_venv = venv / "bin" / "python"
            for cmd in ([interpreter, "-m", "venv", venv],
                        [python_in_venv, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                         *requirements]):
                res = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if res.returncode != 0:
                    raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
            freeze = subprocess.run([python_in_venv, "-m", "pip", "freeze", "--disable-pip-version-check"],
                                    capture_output=True, text=True, env=env)
            (venv / "freeze.txt").write_text(freeze.stdout)
            ready.write_text(f"built in {time.monotonic() - start:.0f} s\n")
    return venv


def free_port() -> int:
    """A loopback port for a server that must be told its port before it starts (Spark's standalone
    master, an MLflow server, JupyterLab), which no parallel test can be handed meanwhile.

    The port is listened on, connected to and closed from the listening side first, so it waits in
    TIME_WAIT for a minute: the kernel hands it to no other ``bind(("127.0.0.1", 0))`` in that time,
    while a server that sets SO_REUSEADDR (Java's, tornado's, uvicorn's and Python's http.server all
    do) may listen on it. Until one does, connecting to it is refused. Where a server can take port 0
    and say which it got, prefer that (tests/s3server.py does).
    """
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            accepted.close()  # this side closes first: the port's end goes to TIME_WAIT
            client.recv(1)
    return port
