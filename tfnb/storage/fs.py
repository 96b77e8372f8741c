"""Local paths (also the ``/dbfs`` and ``/Volumes`` FUSE mounts) and any other scheme through fsspec (``gs://`` with
gcsfs, ``abfs://``, ``memory://``, ``zip://...::``)."""
from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
from typing import Any, Mapping

from .._deps import require
from ..errors import ConfigError, MissingDependencyError, StorageError
from .base import PART, Entry, Store, check_cancel, guarded, os_error, replacing, temp_name

# object stores: a PUT is atomic already, and a rename would be a second full copy
_OBJECT_STORES = frozenset({"gs", "gcs", "abfs", "abfss", "az", "adl", "oss", "r2", "memory"})
_VERSION_KEYS = ("ETag", "etag", "md5Hash", "md5", "crc32c", "checksum", "CRC")
_MTIME_KEYS = ("mtime", "LastModified", "last_modified", "updated", "modified", "created", "date_time")
_NOT_APPENDABLE = ("/dbfs/", "/Volumes/")   # FUSE mounts that cannot append in place


def _entry(rel: str, info: Mapping[str, Any]) -> Entry:
    """An fsspec info dict as an Entry; without a checksum, the modification time is the version."""
    stamps = [(key, info[key]) for key in _MTIME_KEYS if info.get(key) is not None]
    mtime = 0.0
    for _, value in stamps:
        with contextlib.suppress(TypeError, ValueError):
            mtime = value.timestamp() if hasattr(value, "timestamp") else float(value)
            break
    checksum = next((str(info[key]).strip('"') for key in _VERSION_KEYS if info.get(key)), "")
    version = checksum or next((f"{key}={value}" for key, value in stamps), "")
    return Entry(rel, int(info.get("size") or 0), mtime, version)


class FsspecStore(Store):
    def __init__(self, url: str, options: Mapping[str, Any], purpose: str):
        fsspec = require("fsspec", f"{purpose} {url}")
        try:
            self.fs, path = fsspec.core.url_to_fs(url, **dict(options))
        except ImportError as e:
            raise MissingDependencyError(f"{purpose} {url} needs an fsspec backend that is not installed: {e}") from e
        except (TypeError, ValueError) as e:
            if "Protocol not known" in str(e):
                raise ConfigError(f"{url!r} uses scheme {url.split('://', 1)[0]!r}, which neither boto3 nor fsspec "
                                  "knows; use s3://, file://, a local path such as /dbfs/..., or install the fsspec "
                                  "backend for it") from e
            raise ConfigError(f"cannot open {url} with fsspec ({e}); check the storage options") from e
        self.path = path.rstrip("/") or path
        self.root = url.rstrip("/")
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self._atomic_put = protocol in _OBJECT_STORES

    def _full(self, rel: str) -> str:
        return f"{self.path}/{rel}" if rel else self.path

    error = staticmethod(os_error)

    @guarded("listing")
    def list(self, rel: str = "", recursive: bool = True) -> dict[str, Entry]:
        base = self._full(rel).rstrip("/")
        try:
            found = self.fs.find(base, maxdepth=None if recursive else 1, detail=True)
        except FileNotFoundError:
            return {}
        out = {}
        for name, info in found.items():
            sub = name[len(base):].lstrip("/") if name.startswith(base + "/") else ""
            if sub and info.get("type", "file") == "file" and PART not in sub:
                out[sub] = _entry(sub, info)
        return out

    @guarded("reading")
    def stat(self, rel: str = "") -> Entry | None:
        try:
            info = self.fs.info(self._full(rel))
        except FileNotFoundError:
            return None
        return _entry(rel, info) if info.get("type", "file") == "file" else None

    @guarded("reading")
    def read(self, rel: str = "", offset: int = 0, length: int | None = None) -> bytes:
        end = None if length is None else offset + length
        return self.fs.cat_file(self._full(rel), start=offset or None, end=end)

    @guarded("downloading")
    def get(self, rel, local_path, *, size=None, version=None, on_bytes=None, cancel=None, whole=False) -> None:
        from fsspec.callbacks import Callback

        url = self.url(rel)
        if version is not None and (self.stat(rel) or Entry(rel, -1, 0, "")).version != version:
            raise StorageError(f"{url} changed since it was listed; run again")
        check_cancel(cancel, url)
        reported = 0

        def report(_size, done: int, final: bool = False, **_) -> None:   # a hook of fsspec's Callback
            nonlocal reported
            if not final:
                check_cancel(cancel, url)
            if on_bytes and done > reported:
                on_bytes(done - reported)
                reported = done

        with replacing(local_path, url, size) as tmp:
            self.fs.get_file(self._full(rel), tmp, callback=Callback(hooks={"progress": report}))
            report(None, os.path.getsize(tmp), final=True)   # local copies report nothing on the way

    def _replace(self, rel: str, send) -> None:
        path = self._full(rel)
        if self._atomic_put:
            return send(path)
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        tmp = temp_name(path)
        send(tmp)
        self.fs.mv(tmp, path)

    @guarded("uploading to")
    def put(self, rel: str, local_path: str = "") -> None:
        self._replace(rel, lambda path: self.fs.put_file(local_path, path))

    @guarded("writing")
    def write(self, rel: str, data: bytes = b"") -> None:
        self._replace(rel, lambda path: self.fs.pipe_file(path, data))

    @guarded("deleting")
    def delete(self, rel: str = "") -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._full(rel))


class LocalStore(FsspecStore):
    """Local files through fsspec's LocalFileSystem; paths are what TensorFlow and ``open`` take."""

    local = True

    def __init__(self, root: str):
        from fsspec.implementations.local import LocalFileSystem

        self.fs, self.path, self.root = LocalFileSystem(), root, root
        self._atomic_put = False     # write to a temporary name, then rename
        self.appendable = not (root.rstrip("/") + "/").startswith(_NOT_APPENDABLE)

    @guarded("appending to")
    def append(self, rel: str, data: bytes = b"") -> None:
        if not self.appendable:
            return Store.append(self, rel, data)
        with open(self.url(rel), "ab") as f:
            f.write(data)

    @guarded("uploading to")
    def put_dir(self, rel: str, local_dir: str = "") -> None:
        # a copy beside the target, then two renames: readers see the old tree or the new one
        final = self.url(rel)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        new = temp_name(final)
        shutil.copytree(local_dir, new)
        old = temp_name(final)
        with contextlib.suppress(FileNotFoundError):
            os.replace(final, old)
        os.replace(new, final)
        shutil.rmtree(old, ignore_errors=True)
