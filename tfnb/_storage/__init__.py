"""One storage layer under every URL tfnb reads or writes: staging, event sync, evaluator, status, predict.

``open_store(url, options)`` gives a :class:`Store` rooted at ``url``; every operation takes a path
relative to that root (``""`` is the root itself, which may be a single file). Backends:

* local paths (also ``file://``, ``/dbfs/...``, ``/Volumes/...``; ``dbfs:/x`` is read as ``/dbfs/x``);
* ``s3://`` (also ``s3a://``, ``s3n://``) through boto3 and s3transfer, no s3fs;
* any other scheme through fsspec (``gs://`` with gcsfs, ``memory://``, ...).

Options are one vocabulary for every backend and every public function that takes a URL (see
:data:`S3_OPTIONS`); for fsspec schemes they go to the filesystem as they are. Every failure is a
:class:`~tfnb.errors.StorageError` naming the URL, what failed and the fix; a missing file is also a
``FileNotFoundError``. Writes are atomic: a reader sees the old content or all of the new, never a
part (local: a hidden temporary name renamed into place; object stores: one PUT).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..errors import ConfigError, MissingDependencyError, StorageError

PART = ".tfnb-part"          # temporary names carry this; listings skip them
S3_SCHEMES = ("s3", "s3a", "s3n")
S3_OPTIONS = {  # the vocabulary -> boto3 client keyword; long boto3 names are accepted too
    "key": "aws_access_key_id", "secret": "aws_secret_access_key", "token": "aws_session_token",
    "endpoint_url": "endpoint_url", "region": "region_name", "profile": "profile", "anon": "anon",
    "config": "config", "client_kwargs": "client_kwargs", "aws_access_key_id": "aws_access_key_id",
    "aws_secret_access_key": "aws_secret_access_key", "aws_session_token": "aws_session_token",
    "region_name": "region_name"}
_NOT_APPENDABLE = ("/dbfs/", "/Volumes/")   # FUSE mounts that cannot append in place


class MissingError(StorageError, FileNotFoundError):
    """The file or object does not exist."""


@dataclass(frozen=True)
class Entry:
    """One file of a store.

    Attributes:
        rel: its path below the store's root, ``/``-separated (``""``: the root itself).
        size: bytes.
        mtime: modification time, seconds since the epoch (0 when the backend has none).
        version: ETag, checksum or mtime; it changes when the content does.
    """

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
    if text.startswith("dbfs:") and not sep:            # dbfs:/x (the Spark spelling)
        return "/dbfs/" + text[len("dbfs:"):].lstrip("/")
    if not sep or "/" in scheme:
        return os.path.abspath(os.path.expanduser(text))
    scheme = scheme.lower()
    if scheme == "file":
        return os.path.abspath(rest) if rest.startswith("/") else os.path.abspath(os.path.expanduser(rest))
    if scheme == "dbfs":                                # dbfs:///x
        return "/dbfs/" + rest.lstrip("/")
    if scheme in S3_SCHEMES:
        return "s3://" + rest
    return f"{scheme}://{rest}"


def open_store(url: str | os.PathLike, options: Mapping[str, Any] | None = None, *, purpose: str = "",
               concurrency: int = 16, chunk_size: int = 8 << 20) -> "Store":
    """The store rooted at ``url``.

    Args:
        url: local path or URL (see the module docstring).
        options: storage options (``key``, ``secret``, ``token``, ``endpoint_url``, ``region``,
            ``profile``, ``anon``, ``config``; for fsspec schemes the filesystem's own). Never logged.
        purpose: what the caller is doing, for messages ("staging", "predict", ...).
        concurrency: requests in flight at once within one transfer (S3) or copies (fsspec).
        chunk_size: S3 objects larger than this are fetched as parallel ranged GETs of this size.

    Raises:
        ConfigError: bad URL or options. MissingDependencyError: the backend is not installed.
    """
    text = normalize(url)
    options = dict(options or {})
    purpose = purpose or "accessing"
    scheme = text.split("://", 1)[0] if "://" in text else ""
    if not scheme:
        from .local import LocalStore

        return LocalStore(text, purpose)
    if scheme == "s3":
        from .s3 import S3Store

        return S3Store(text, options, purpose, concurrency, chunk_size)
    from .fs import FsspecStore

    return FsspecStore(text, options, purpose, concurrency)


class Store:
    """A directory tree (or one file) addressed by relative ``/``-separated paths."""

    root = ""            # the normalised URL or absolute path
    local = False        # a path this process can open directly (TensorFlow can read/write it)
    appendable = False   # append() adds to a file in place

    def url(self, rel: str = "") -> str:
        """The full URL (or local path) of ``rel``."""
        return self.root.rstrip("/") + ("/" + rel if rel else "")

    def list(self, rel: str = "", recursive: bool = True) -> dict[str, Entry]:
        """Files below ``rel`` (relative to it); empty when it does not exist. Temporary names skipped."""
        raise NotImplementedError

    def stat(self, rel: str = "") -> Entry | None:
        """The file ``rel``, or None when there is no file there (a folder is not a file)."""
        raise NotImplementedError

    def read(self, rel: str = "", offset: int = 0, length: int | None = None) -> bytes:
        """Bytes of ``rel`` from ``offset`` (``length`` bytes, or to the end)."""
        raise NotImplementedError

    def get(self, rel: str, local_path: str, *, size: int | None = None, version: str | None = None,
            on_bytes: Callable[[int], None] | None = None, cancel=None) -> None:
        """Download ``rel`` to ``local_path`` atomically (via ``.NAME.tfnb-part-*`` beside it).

        Args:
            size, version: what a listing said; a file that no longer matches fails (if-version)
                instead of arriving mixed or torn.
            on_bytes: called with each count of bytes received (negative when a retry restarts).
            cancel: a ``threading.Event``; when set, the download stops with a StorageError.
        """
        raise NotImplementedError

    def put(self, rel: str, local_path: str) -> None:
        """Upload the local file to ``rel`` atomically."""
        raise NotImplementedError

    def write(self, rel: str, data: bytes) -> None:
        """Create or replace ``rel`` with ``data`` atomically."""
        raise NotImplementedError

    def append(self, rel: str, data: bytes) -> None:
        """Add ``data`` to the end of ``rel`` (only where :attr:`appendable`)."""
        raise StorageError(f"{self.url(rel)} cannot be appended to in place; write a new file instead")

    def delete(self, rel: str) -> None:
        """Remove the file ``rel``; a missing one is not an error."""
        raise NotImplementedError

    def get_dir(self, rel: str, local_dir: str) -> None:
        """Download every file below ``rel`` into ``local_dir``, keeping relative paths."""
        for sub in self.list(rel):
            self.get(_join(rel, sub), os.path.join(local_dir, *sub.split("/")))

    def put_dir(self, rel: str, local_dir: str) -> None:
        """Make ``rel`` a copy of ``local_dir``: upload every file, then delete what is not in it."""
        wanted = set()
        for dirpath, _, files in os.walk(local_dir):
            for name in files:
                sub = os.path.relpath(os.path.join(dirpath, name), local_dir).replace(os.sep, "/")
                self.put(_join(rel, sub), os.path.join(dirpath, name))
                wanted.add(sub)
        for sub in self.list(rel):
            if sub not in wanted:
                self.delete(_join(rel, sub))

    def close(self) -> None:
        """Release pools and connections."""


def _join(rel: str, sub: str) -> str:
    return f"{rel.rstrip('/')}/{sub}" if rel and sub else rel or sub


def is_temp(name: str) -> bool:
    return PART in name


def guarded(doing: str):
    """Method decorator: any failure becomes the store's StorageError for ``doing`` the URL of ``rel``."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(self, rel: str = "", *args, **kwargs):
            try:
                return fn(self, rel, *args, **kwargs)
            except (StorageError, ConfigError, MissingDependencyError, KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # noqa: BLE001 - classified by the backend
                raise self.error(e, self.url(rel) if isinstance(rel, str) else self.root, doing) from e
        return inner
    return wrap


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


def appendable(path: str) -> bool:
    return not (path.rstrip("/") + "/").startswith(_NOT_APPENDABLE)
