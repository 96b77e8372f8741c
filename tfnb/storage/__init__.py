"""One storage layer under every URL tfnb reads or writes: staging, event sync, evaluator, status, predict.

``open_store(url, options)`` gives a :class:`Store` rooted at ``url``: local paths (also ``file://``,
``/dbfs/...``, ``/Volumes/...``; ``dbfs:/x`` is ``/dbfs/x``), ``s3://`` (also ``s3a://``, ``s3n://``; see
:mod:`tfnb.storage.s3`), any other scheme through fsspec. Options are one vocabulary for every backend and every
public function that takes a URL (:data:`S3_OPTIONS`); fsspec filesystems get them as they are.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from .base import PART, S3_OPTIONS, Entry, MissingError, Store, atomic_write, locked, normalize

__all__ = ["open_store", "Store", "Entry", "MissingError", "PART", "S3_OPTIONS", "atomic_write", "locked",
           "normalize"]


def open_store(url: str | os.PathLike, options: Mapping[str, Any] | None = None, *, purpose: str = "",
               concurrency: int = 16, chunk_size: int = 8 << 20) -> "Store":
    """The store rooted at ``url``, a local path or URL.

    Args:
        options: storage options (:data:`S3_OPTIONS`; for fsspec schemes the filesystem's own). Never logged.
        purpose: what the caller is doing, for messages ("staging", "predict", ...).
        concurrency: S3 requests in flight at once within one transfer.
        chunk_size: S3 objects larger than this are fetched as parallel ranged GETs of this size.

    Raises:
        ConfigError: bad URL or options. MissingDependencyError: the backend is not installed.
    """
    text = normalize(url)
    if "://" not in text:
        from .local import LocalStore

        return LocalStore(text)
    if text.startswith("s3://"):
        from .s3 import S3Store

        return S3Store(text, options or {}, purpose or "accessing", concurrency, chunk_size)
    from .fs import FsspecStore

    return FsspecStore(text, options or {}, purpose or "accessing")
