"""One storage layer under every URL tfnb reads or writes: :func:`open_store` gives a :class:`Store` for local paths,
``s3://`` and any scheme fsspec knows. Options are one vocabulary (:data:`S3_OPTIONS`), given to fsspec as they are."""
from __future__ import annotations

import os
from typing import Any, Mapping

from .base import PART, S3_OPTIONS, Entry, MissingError, Store, atomic_write, locked, normalize

__all__ = ["open_store", "Store", "Entry", "MissingError", "PART", "S3_OPTIONS", "atomic_write", "locked",
           "normalize"]


def open_store(url: str | os.PathLike, options: Mapping[str, Any] | None = None, *, purpose: str = "",
               concurrency: int = 16, chunk_size: int = 8 << 20) -> "Store":
    """The store rooted at ``url`` (see :func:`normalize`); ``options`` are never logged, ``purpose`` ("staging", ...)
    is for messages. S3: ``concurrency`` requests in flight per transfer, ranged GETs of ``chunk_size`` bytes."""
    text = normalize(url)
    if text.startswith("s3://"):
        from .s3 import S3Store

        return S3Store(text, options or {}, purpose or "accessing", concurrency, chunk_size)
    from .fs import FsspecStore, LocalStore

    return FsspecStore(text, options or {}, purpose or "accessing") if "://" in text else LocalStore(text)
