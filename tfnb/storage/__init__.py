"""One storage layer under every URL tfnb reads or writes: staging, event sync, evaluator, status, predict.

``open_store(url, options)`` gives a :class:`Store` rooted at ``url``; every operation takes a path
relative to that root (``""`` is the root itself, which may be a single file). Backends:

* local paths (also ``file://``, ``/dbfs/...``, ``/Volumes/...``; ``dbfs:/x`` is read as ``/dbfs/x``);
* ``s3://`` (also ``s3a://``, ``s3n://``) through boto3 and s3transfer, no s3fs;
* any other scheme through fsspec (``gs://`` with gcsfs, ``memory://``, ...).

Options are one vocabulary for every backend and every public function that takes a URL (see
:data:`S3_OPTIONS`); for fsspec schemes they go to the filesystem as they are. Writes are atomic
(local: a hidden temporary name renamed into place; object stores: one PUT).
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from .base import (PART, S3_OPTIONS, Entry, MissingError, Store, atomic_write, check_cancel, guarded, is_temp, landing,
                   locked, normalize, os_error, replacing, temp_name)

__all__ = ["open_store", "Store", "Entry", "MissingError", "PART", "S3_OPTIONS", "atomic_write", "normalize",
           "is_temp", "landing", "locked", "replacing", "temp_name", "guarded", "check_cancel", "os_error"]


def open_store(url: str | os.PathLike, options: Mapping[str, Any] | None = None, *, purpose: str = "",
               concurrency: int = 16, chunk_size: int = 8 << 20) -> "Store":
    """The store rooted at ``url``, a local path or URL (see the module docstring).

    Args:
        options: storage options (:data:`S3_OPTIONS`; for fsspec schemes the filesystem's own). Never logged.
        purpose: what the caller is doing, for messages ("staging", "predict", ...).
        concurrency: S3 requests in flight at once within one transfer.
        chunk_size: S3 objects larger than this are fetched as parallel ranged GETs of this size.

    Raises:
        ConfigError: bad URL or options. MissingDependencyError: the backend is not installed.
    """
    text = normalize(url)
    options = options or {}
    purpose = purpose or "accessing"
    if "://" not in text:
        from .local import LocalStore

        return LocalStore(text)
    if text.startswith("s3://"):
        from .s3 import S3Store

        return S3Store(text, options, purpose, concurrency, chunk_size)
    from .fs import FsspecStore

    return FsspecStore(text, options, purpose)
