"""The storage contract every backend keeps (:class:`Store`, :class:`Entry`, the errors) and the shared helpers."""
from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import posixpath
import uuid
from dataclasses import dataclass
from typing import Iterator

from ..errors import ConfigError, MissingDependencyError, StorageError

PART = ".tfnb-part"          # temporary names carry this; listings skip them
S3_OPTIONS = {  # the vocabulary -> boto3's name (its own names are accepted too)
    "key": "aws_access_key_id", "secret": "aws_secret_access_key", "token": "aws_session_token",
    "region": "region_name", "endpoint_url": "endpoint_url", "profile": "profile", "anon": "anon",
    "config": "config", "client_kwargs": "client_kwargs"}


class MissingError(StorageError, FileNotFoundError):
    """The file or object does not exist."""


@dataclass(frozen=True)
class Entry:
    """One file: ``rel`` below the store's root (``""``: the root itself), ``size`` in bytes, ``mtime`` in seconds
    since the epoch (0 when the backend has none), ``version`` (ETag, checksum or mtime: changes with the content)."""

    rel: str
    size: int
    mtime: float
    version: str


def normalize(url: str | os.PathLike) -> str:
    """The one spelling of a URL or path: ``dbfs:/x`` -> ``/dbfs/x``, ``file://x`` -> ``/x``,
    ``s3a://``/``s3n://`` -> ``s3://``, a plain path -> absolute."""
    text = os.fspath(url) if isinstance(url, os.PathLike) else url
    if not isinstance(text, str) or not text:
        raise ConfigError(f"expected a path or URL, got {url!r}; e.g. '/dbfs/data' or 's3://bucket/prefix'")
    scheme, sep, rest = text.partition("://")
    if text.lower().startswith("dbfs:"):                # dbfs:/x (Spark's spelling), dbfs:///x
        return "/dbfs/" + text[len("dbfs:"):].lstrip("/")
    if not sep or "/" in scheme:
        return os.path.abspath(os.path.expanduser(text))
    scheme = scheme.lower()
    if scheme == "file":
        return os.path.abspath(os.path.expanduser(rest))
    if scheme in ("s3", "s3a", "s3n"):
        return "s3://" + rest
    return f"{scheme}://{rest}"


class Store:
    """A directory tree (or one file) addressed by relative ``/``-separated paths (``""``: the root). Each failure
    is a StorageError naming the URL, what failed and the fix (a MissingError, also a FileNotFoundError, when absent).

    * ``list(rel="", recursive=True) -> {sub: Entry}`` (``{}`` when missing, no temporary names); ``stat(rel="") ->
      Entry | None``; ``read(rel="", offset=0, length=None) -> bytes``.
    * ``get(rel, local_path, *, size=None, version=None, on_bytes=None, cancel=None, whole=False)``: an atomic
      download that fails when the file is no longer the listed ``size``/``version``; ``on_bytes(n)`` reports
      progress (negative when a retry restarts), a set ``cancel`` Event stops it, ``whole`` asks for one request.
    * ``put(rel, local_path)``, ``write(rel, data)``, ``put_dir(rel, local_dir)``: create or replace atomically;
      ``append(rel, data)`` where :attr:`appendable`; ``delete(rel)`` (a missing file is fine)."""

    root = ""            # the normalised URL or absolute path
    local = False        # a path this process can open directly (TensorFlow can read/write it)
    appendable = False   # append() adds to a file in place

    def url(self, rel: str = "") -> str:
        return self.root.rstrip("/") + ("/" + rel if rel else "")

    def append(self, rel: str, data: bytes) -> None:
        raise StorageError(f"{self.url(rel)} cannot be appended to in place; write a new file instead")

    def put_dir(self, rel: str, local_dir: str) -> None:
        # every file uploaded first, then what is not in local_dir deleted (no directory swap on objects)
        wanted = set()
        for dirpath, _, files in os.walk(local_dir):
            for name in files:
                sub = os.path.relpath(os.path.join(dirpath, name), local_dir).replace(os.sep, "/")
                self.put(posixpath.join(rel, sub), os.path.join(dirpath, name))
                wanted.add(sub)
        for sub in self.list(rel):
            if sub not in wanted:
                self.delete(posixpath.join(rel, sub))

    def close(self) -> None:
        pass


def guarded(doing: str):
    """Method decorator: any failure becomes the store's StorageError for ``doing`` the URL of ``rel``."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(self, rel: str = "", *args, **kwargs):
            try:
                return fn(self, rel, *args, **kwargs)
            except (StorageError, ConfigError, MissingDependencyError):
                raise
            except Exception as e:  # noqa: BLE001 - classified by the backend
                raise self.error(e, self.url(rel), doing) from e
        return inner
    return wrap


def check_cancel(cancel, url: str) -> None:
    if cancel is not None and cancel.is_set():
        raise StorageError(f"downloading {url} was cancelled")


def os_error(e: BaseException, url: str, doing: str) -> StorageError:
    """The StorageError for an OS-level failure (local files, fsspec filesystems)."""
    if isinstance(e, FileNotFoundError):
        return MissingError(f"{doing} {url} failed: it does not exist; check the path")
    if isinstance(e, PermissionError):
        return StorageError(f"permission denied {doing} {url} ({e}); give this process access to it "
                            "or use other credentials")
    if isinstance(e, OSError) and e.errno == 28:
        return StorageError(f"{doing} {url} failed: no space left on the device; free space there")
    return StorageError(f"{doing} {url} failed: {type(e).__name__}: {e}")


def temp_name(path: str, named: bool = False) -> str:
    """A hidden temporary name beside ``path``: ``.NAME.tfnb-part-X`` when ``named`` (its owner finds leftovers),
    else ``.tfnb-part-X`` (an event file's temporary copy must not look like an event file to TensorBoard)."""
    head, name = os.path.split(path)
    return os.path.join(head, f".{name if named else ''}{PART}-{uuid.uuid4().hex[:12]}")


@contextlib.contextmanager
def replacing(path: str, url: str = "", size: int | None = None) -> Iterator[str]:
    """A temporary name that replaces ``path`` when the block succeeds, removed when it fails. A download of ``url``
    lands under a ``named`` one and must hold the listing's ``size`` (else it changed meanwhile)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = temp_name(path, named=bool(url))
    try:
        yield tmp
        if size is not None and (got := os.path.getsize(tmp)) != size:
            raise StorageError(f"{url} arrived with {got} bytes but was listed with {size}; it changed, run again")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def atomic_write(path: str, data: bytes) -> None:
    with replacing(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """An exclusive lock on ``path`` across processes."""
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield
