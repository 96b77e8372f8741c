"""One storage layer under every URL tfnb reads or writes: ``open_store(url, options)`` gives a :class:`Store` for
local paths (also ``file://``, ``/dbfs/...``, ``/Volumes/...``, ``dbfs:/x``), ``s3://`` (also ``s3a://``, ``s3n://``)
and any other scheme through fsspec. Options are one vocabulary (:data:`S3_OPTIONS`); fsspec gets them as they are.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from .base import PART, S3_OPTIONS, Entry, MissingError, Store, atomic_write, locked, normalize

__all__ = ["open_store", "Store", "Entry", "MissingError", "PART", "S3_OPTIONS", "atomic_write", "locked",
           "normalize"]


def open_store(url: str | os.PathLike, options: Mapping[str, Any] | None = None, *, purpose: str = "",
               concurrency: int = 16, chunk_size: int = 8 << 20) -> "Store":
    """The store rooted at ``url``; ``options`` are never logged, ``purpose`` ("staging", ...) is for messages.
    ``concurrency``: S3 requests in flight within one transfer; objects over ``chunk_size`` come as ranged GETs.

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
