"""Incremental TensorBoard event-file sync between a local directory and persistent storage.

One class, :class:`EventSync`, used at both ends of a run:

* on the chief, inside ``train_fn``: the task's local ``log_dir`` -> persistent storage
  (a ``/dbfs`` or ``/Volumes`` path, ``s3://bucket/prefix``, any fsspec URL, or a plain path);
* on the driver, in the notebook: persistent storage -> a local directory TensorBoard reads.

Event files are append-only TFRecord streams (each record: 8-byte little-endian length, 4-byte
masked CRC-32C of the length, the data, 4-byte masked CRC-32C of the data). The sync remembers,
per file, how many bytes it has delivered, and each pass ships only the new bytes, cut at the last
complete record, so a destination never holds a torn record written by the sync.

How the new bytes travel depends on the destination:

``append`` (local disks, NFS): a file's first bytes are written to a hidden temporary name (one
    without "tfevents", so TensorBoard never lists it) and renamed into place; later bytes are
    appended, whole records only. Every byte produced is sent once. (A reader racing one append
    can meet its record half there; TensorBoard's loader treats that as a truncated record and
    resumes from it on its next reload, see tensorboard/backend/event_processing/event_file_loader.py.)
``parts`` (S3 and other object stores, ``/dbfs`` and ``/Volumes`` FUSE mounts, which cannot
    append in place): each pass uploads the file's new records as one new immutable object named
    ``<file>.part-NNNNNN`` (six or more digits, counting from 1). Every byte produced is again sent
    once; there is no re-upload of a growing file (the quadratic cost of tensorboard#5655). Each
    part is itself a valid event file. Reading a store with parts, :class:`EventSync` concatenates
    them in order back into ``<file>``, so the driver-side sync (store -> local dir) restores the
    original event files byte for byte. The price is object count: at most one object per file per
    pass with new data (360 an hour at interval=10), which the driver lists each pass.

A sync resumes where an earlier one stopped: on its first pass it measures what the destination
already holds (file size, or the sizes of the parts) and continues from there. One destination
should have one writing sync at a time. Files other than event files (plugin assets, profiles)
are copied whole when they change and have been quiet for a second, also through a temporary
name. ``stop()`` (and leaving the ``with`` block, also on an exception) runs a final pass.

S3 goes through boto3 (endpoint, region and keys from ``storage_options`` or the usual AWS
environment variables, e.g. ``AWS_ENDPOINT_URL``); other URLs go through fsspec.

Example:
    >>> with tfnb.EventSync("/local_disk0/tb", "s3://bucket/run1/logs", interval=10):
    ...     model.fit(ds, epochs=5, callbacks=[tf.keras.callbacks.TensorBoard("/local_disk0/tb")])
"""
from __future__ import annotations

import atexit
import logging
import os
import posixpath
import re
import struct
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Mapping

from ._config import setting
from ._deps import require
from .errors import ConfigError, SyncError

log = logging.getLogger(__name__)

MODES = ("auto", "append", "parts")
TMP_MARK = ".tfnb-tmp-"          # temporary names carry this; listings skip them
_PART_RE = re.compile(r"^(?P<base>.+)\.part-(?P<n>\d{6,})$")
_QUIET = 1.0                     # seconds a non-event file must be unchanged before it is copied
_MAX_READ = 64 << 20             # bytes read from one file per pass; the rest follows next pass
_NOT_APPENDABLE = ("/dbfs/", "/Volumes/")


# ---------------------------------------------------------------- TFRecord framing

def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def _masked_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def complete_records(buf: bytes | memoryview) -> int | None:
    """Length of the longest prefix of ``buf`` made of whole TFRecords.

    Only the length header's checksum is verified (12 bytes per record): that is enough to tell a
    record boundary, and cheap in pure Python.

    Returns:
        The byte count (0 when not even the first record is complete), or None when ``buf`` does
        not start with a valid record header (not a TFRecord stream at this offset).
    """
    pos, n = 0, len(buf)
    while n - pos >= 12:
        length, crc = struct.unpack_from("<QI", buf, pos)
        if _masked_crc32c(bytes(buf[pos:pos + 8])) != crc:
            return pos if pos else None
        end = pos + 12 + length + 4
        if end > n:
            break
        pos = end
    return pos


def is_event_file(name: str) -> bool:
    """TensorBoard's own rule: an event file has "tfevents" in its base name."""
    return "tfevents" in posixpath.basename(name)


# ---------------------------------------------------------------- stores

@dataclass(frozen=True)
class FileInfo:
    size: int
    mtime: float


class _Store:
    """A directory tree on some filesystem, addressed by relative POSIX paths."""

    appendable = False
    local = False      # a path this process can open directly (TensorFlow can read/write it)
    root = ""

    def list(self, recursive: bool = True) -> dict[str, FileInfo]:
        raise NotImplementedError

    def read(self, rel: str, offset: int = 0, length: int | None = None) -> bytes:
        raise NotImplementedError

    def write(self, rel: str, data: bytes) -> None:
        """Create or replace ``rel`` so that readers see the old content or all of ``data``."""
        raise NotImplementedError

    def append(self, rel: str, data: bytes) -> None:
        raise NotImplementedError(f"{self.root} does not support appends")

    def put_file(self, local_path: str, rel: str) -> None:
        with open(local_path, "rb") as f:
            self.write(rel, f.read())

    def get_file(self, rel: str, local_path: str) -> None:
        with open(local_path, "wb") as f:
            f.write(self.read(rel))

    def delete(self, rel: str) -> None:
        raise NotImplementedError

    def url(self, rel: str = "") -> str:
        return self.root.rstrip("/") + ("/" + rel if rel else "")


class _LocalStore(_Store):
    local = True

    def __init__(self, root: str):
        if root.startswith("file://"):
            root = root[len("file://"):]
        self.root = os.path.abspath(os.path.expanduser(root))
        self.appendable = not (self.root + "/").startswith(_NOT_APPENDABLE)

    def _path(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/")) if rel else self.root

    def list(self, recursive: bool = True) -> dict[str, FileInfo]:
        out: dict[str, FileInfo] = {}
        if not os.path.isdir(self.root):
            return out
        for dirpath, dirnames, filenames in os.walk(self.root):
            if not recursive:
                dirnames.clear()
            for name in filenames:
                if TMP_MARK in name:
                    continue
                full = os.path.join(dirpath, name)
                try:
                    st = os.stat(full)
                except FileNotFoundError:  # deleted between listing and stat
                    continue
                rel = os.path.relpath(full, self.root).replace(os.sep, "/")
                out[rel] = FileInfo(st.st_size, st.st_mtime)
        return out

    def read(self, rel: str, offset: int = 0, length: int | None = None) -> bytes:
        with open(self._path(rel), "rb") as f:
            f.seek(offset)
            return f.read() if length is None else f.read(length)

    def _tmp(self, path: str) -> str:
        return os.path.join(os.path.dirname(path), f"{TMP_MARK}{uuid.uuid4().hex[:12]}")

    def write(self, rel: str, data: bytes) -> None:
        path = self._path(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = self._tmp(path)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            _silent_remove(tmp)
            raise

    def append(self, rel: str, data: bytes) -> None:
        with open(self._path(rel), "ab") as f:
            f.write(data)

    def put_file(self, local_path: str, rel: str) -> None:
        import shutil

        path = self._path(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = self._tmp(path)
        try:
            shutil.copyfile(local_path, tmp)
            os.replace(tmp, path)
        except BaseException:
            _silent_remove(tmp)
            raise

    def get_file(self, rel: str, local_path: str) -> None:
        import shutil

        shutil.copyfile(self._path(rel), local_path)

    def delete(self, rel: str) -> None:
        _silent_remove(self._path(rel))

    def url(self, rel: str = "") -> str:
        return self._path(rel)


def _no_range_checksum(params, **kwargs) -> None:
    """Do not validate a ranged GET against a whole-object checksum.

    AWS sends no checksum with a range, but some S3-compatible servers (``rclone serve s3``) send the
    whole object's, which a range can never match. Whole-object reads keep their validation.
    """
    if "Range" in params.get("headers", {}):
        params.get("context", {}).get("checksum", {}).pop("response_algorithms", None)


def _silent_remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


_S3_KEYS = {"endpoint_url": "endpoint_url", "region_name": "region_name", "region": "region_name",
            "aws_access_key_id": "aws_access_key_id", "key": "aws_access_key_id",
            "aws_secret_access_key": "aws_secret_access_key", "secret": "aws_secret_access_key",
            "aws_session_token": "aws_session_token", "token": "aws_session_token"}


class _S3Store(_Store):
    """s3:// through boto3 (s3fs is not a dependency: it pins an old botocore)."""

    def __init__(self, url: str, options: Mapping[str, Any]):
        boto3 = require("boto3", f"syncing to {url}")
        rest = url.split("://", 1)[1]
        self.bucket, _, prefix = rest.partition("/")
        if not self.bucket:
            raise ConfigError(f"{url!r} names no bucket; write s3://BUCKET/prefix")
        self.prefix = prefix.strip("/")
        self.root = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        kwargs: dict[str, Any] = {}
        for key, value in dict(options).items():
            if key == "client_kwargs":
                kwargs.update(value)
            elif key in _S3_KEYS:
                kwargs[_S3_KEYS[key]] = value
            else:
                raise ConfigError(
                    f"storage_options key {key!r} is not understood for S3; use endpoint_url, region_name, "
                    f"aws_access_key_id, aws_secret_access_key, aws_session_token or client_kwargs")
        self._client = boto3.session.Session().client("s3", **kwargs)
        self._client.meta.events.register("before-call.s3.GetObject", _no_range_checksum)

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def list(self, recursive: bool = True) -> dict[str, FileInfo]:
        out: dict[str, FileInfo] = {}
        base = self.prefix + "/" if self.prefix else ""
        args = {"Bucket": self.bucket, "Prefix": base}
        if not recursive:
            args["Delimiter"] = "/"
        for page in self._client.get_paginator("list_objects_v2").paginate(**args):
            for obj in page.get("Contents", ()):
                rel = obj["Key"][len(base):]
                if rel and not rel.endswith("/") and TMP_MARK not in rel:
                    out[rel] = FileInfo(int(obj["Size"]), obj["LastModified"].timestamp())
        return out

    def read(self, rel: str, offset: int = 0, length: int | None = None) -> bytes:
        args = {"Bucket": self.bucket, "Key": self._key(rel)}
        if length == 0:
            return b""
        if offset or length is not None:
            args["Range"] = f"bytes={offset}-" + ("" if length is None else str(offset + length - 1))
        return self._client.get_object(**args)["Body"].read()

    def write(self, rel: str, data: bytes) -> None:
        # a PUT is atomic: readers see the old object or the new one, never a partial one
        self._client.put_object(Bucket=self.bucket, Key=self._key(rel), Body=data)

    def put_file(self, local_path: str, rel: str) -> None:
        self._client.upload_file(local_path, self.bucket, self._key(rel))

    def get_file(self, rel: str, local_path: str) -> None:
        self._client.download_file(self.bucket, self._key(rel), local_path)

    def delete(self, rel: str) -> None:
        self._client.delete_object(Bucket=self.bucket, Key=self._key(rel))


_OBJECT_STORES = frozenset({"gs", "gcs", "abfs", "abfss", "az", "adl", "oss", "r2", "memory"})


class _FsspecStore(_Store):
    def __init__(self, url: str, options: Mapping[str, Any]):
        fsspec = require("fsspec", f"syncing to {url}")
        try:
            self.fs, self.path = fsspec.core.url_to_fs(url, **dict(options))
        except (ImportError, ValueError) as e:
            raise ConfigError(f"cannot open {url!r} with fsspec: {e}; install the fsspec backend for "
                              f"this scheme or use a local path / s3:// URL") from e
        self.path = self.path.rstrip("/")
        self.root = url.rstrip("/")

    def _full(self, rel: str) -> str:
        return f"{self.path}/{rel}" if rel else self.path

    def list(self, recursive: bool = True) -> dict[str, FileInfo]:
        out: dict[str, FileInfo] = {}
        try:
            found = (self.fs.find(self.path, detail=True) if recursive
                     else {i["name"]: i for i in self.fs.ls(self.path, detail=True) if i.get("type") == "file"})
        except FileNotFoundError:
            return out
        for name, info in found.items():
            rel = name[len(self.path):].lstrip("/")
            if rel and TMP_MARK not in rel:
                out[rel] = FileInfo(int(info.get("size") or 0), _mtime(info))
        return out

    def read(self, rel: str, offset: int = 0, length: int | None = None) -> bytes:
        end = None if length is None else offset + length
        return self.fs.cat_file(self._full(rel), start=offset or None, end=end)

    def write(self, rel: str, data: bytes) -> None:
        path = self._full(rel)
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        if protocol in _OBJECT_STORES:
            # an object PUT is atomic already; a rename would be a second full copy
            self.fs.pipe_file(path, data)
            return
        parent = posixpath.dirname(path)
        self.fs.makedirs(parent, exist_ok=True)
        tmp = f"{parent}/{TMP_MARK}{uuid.uuid4().hex[:12]}"
        self.fs.pipe_file(tmp, data)
        self.fs.mv(tmp, path)

    def delete(self, rel: str) -> None:
        self.fs.rm_file(self._full(rel))


def _mtime(info: Mapping[str, Any]) -> float:
    for key in ("mtime", "LastModified", "last_modified", "created", "updated"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return value.timestamp()
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return 0.0


def open_store(url: str | os.PathLike, storage_options: Mapping[str, Any] | None = None) -> _Store:
    """The store for a local path, ``file://``, ``s3://``/``s3a://`` (boto3) or any other fsspec URL."""
    text = os.fspath(url)
    if not isinstance(text, str) or not text:
        raise ConfigError(f"expected a directory path or URL, got {url!r}")
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if scheme in ("", "file"):
        return _LocalStore(text)
    if scheme in ("s3", "s3a"):
        return _S3Store(text, storage_options or {})
    return _FsspecStore(text, storage_options or {})


# ---------------------------------------------------------------- the sync

@dataclass(frozen=True)
class SyncStats:
    """What a sync has done so far.

    Attributes:
        bytes_sent: payload bytes written to the destination (event bytes plus whole-file copies).
        event_bytes: of those, bytes of event files (new records only).
        writes: write operations (appends, part uploads, new files).
        passes: completed passes.
        files: event files tracked.
        errors: passes that failed (the next pass retries).
        last_error: text of the last failure, or "".
        last_pass: wall-clock time the last pass finished (0 before the first).
    """

    bytes_sent: int = 0
    event_bytes: int = 0
    writes: int = 0
    passes: int = 0
    files: int = 0
    errors: int = 0
    last_error: str = ""
    last_pass: float = 0.0


@dataclass
class _Track:
    """One logical event file: how much of its byte stream the destination holds."""

    delivered: int = 0
    next_part: int = 1
    raw: bool = False   # not TFRecord-framed: ship bytes as they come


_live: "weakref.WeakSet[EventSync]" = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    for sync in list(_live):
        try:
            sync.stop()
        except Exception:  # noqa: BLE001 - interpreter exit: report, never raise
            log.exception("final event sync to %s failed at exit", sync.dst_url)


atexit.register(_stop_all_at_exit)


class EventSync:
    """Copies new TensorBoard event data from ``src_dir`` to ``dst_url`` every ``interval`` seconds.

    Args:
        src_dir: directory (local path or URL) to read; event files may still be growing.
        dst_url: directory (local path, ``/dbfs/...``, ``s3://...`` or fsspec URL) to write.
        interval: seconds between passes (default 10; env TFNB_SYNC_INTERVAL).
        mode: "auto" (append on local disks, parts on object stores and /dbfs, /Volumes),
            "append" or "parts"; see the module docstring.
        storage_options: options for the remote side(s): for S3 ``endpoint_url``, ``region_name``,
            ``aws_access_key_id``, ``aws_secret_access_key``; for other schemes fsspec's options.

    Raises:
        ConfigError: bad interval or mode, ``mode="append"`` on a store that cannot append, or
            ``src_dir`` and ``dst_url`` overlapping.

    Example:
        >>> # inside train_fn, on the chief: worker disk -> persistent storage
        >>> with tfnb.EventSync(local_logs, ctx.log_dir, interval=10):
        ...     model.fit(ds, callbacks=[tf.keras.callbacks.TensorBoard(local_logs)])
        >>> # in the notebook: persistent storage -> the directory TensorBoard reads
        >>> sync = tfnb.EventSync("s3://bucket/run1/logs", "/tmp/tb/run1").start()
        >>> sync.stop()
    """

    def __init__(self, src_dir: str | os.PathLike, dst_url: str | os.PathLike, *,
                 interval: float | None = None, mode: str = "auto",
                 storage_options: Mapping[str, Any] | None = None):
        interval = setting("sync_interval", interval, 10.0, float)
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) or interval <= 0:
            raise ConfigError(f"interval={interval!r} must be a number of seconds > 0, e.g. interval=10")
        if mode not in MODES:
            raise ConfigError(f"mode={mode!r} must be one of {', '.join(MODES)}")
        for name, value in (("src_dir", src_dir), ("dst_url", dst_url)):
            if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
                raise ConfigError(f"{name}={value!r} must be a directory path or URL, e.g. '/tmp/tb/run1' "
                                  "or 's3://bucket/run1/logs'")
        self.src_url = os.fspath(src_dir)
        self.dst_url = os.fspath(dst_url)
        self.interval = float(interval)
        self._src = open_store(self.src_url, storage_options)
        self._dst = open_store(self.dst_url, storage_options)
        a, b = self._src.url().rstrip("/") + "/", self._dst.url().rstrip("/") + "/"
        if a.startswith(b) or b.startswith(a):
            raise ConfigError(f"src_dir {self.src_url!r} and dst_url {self.dst_url!r} overlap; "
                              f"sync into a directory outside the source")
        if mode == "append" and not self._dst.appendable:
            raise ConfigError(f"mode='append' but {self.dst_url!r} cannot be appended to in place; "
                              f"use mode='parts' (or 'auto')")
        self.mode = mode if mode != "auto" else ("append" if self._dst.appendable else "parts")
        self._tracks: dict[str, _Track] = {}
        self._copied: dict[str, FileInfo] = {}   # non-event files: what was copied last
        self._resumed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stats = SyncStats()
        self._stopped = False

    # ------------------------------------------------------------ public

    @property
    def stats(self) -> SyncStats:
        """A snapshot of the counters (see :class:`SyncStats`)."""
        return self._stats

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> "EventSync":
        """Start the background thread (one pass right away, then every ``interval``); returns self.

        Example:
            >>> sync = tfnb.EventSync("/local_disk0/tb", "/dbfs/runs/1/logs").start()
        """
        if self.running:
            return self
        self._stop.clear()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=f"tfnb-sync {self.src_url}", daemon=True)
        _live.add(self)
        self._thread.start()
        return self

    def flush(self) -> SyncStats:
        """Run one pass now, in the calling thread, and return the counters.

        Raises:
            SyncError: the pass failed (the cause is chained).

        Example:
            >>> sync.flush().bytes_sent
        """
        self._pass(final=False, raise_errors=True)
        return self._stats

    def stop(self) -> SyncStats:
        """Stop the thread and run a final pass that ships everything written so far.

        Returns:
            The final counters.

        Raises:
            SyncError: the final pass failed (the cause is chained).

        Example:
            >>> stats = sync.stop(); print(stats.bytes_sent)
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        _live.discard(self)
        if self._stopped:
            return self._stats
        self._stopped = True
        self._pass(final=True, raise_errors=True)
        return self._stats

    def __enter__(self) -> "EventSync":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.stop()
        except Exception:
            if exc_type is None:
                raise
            # the body's own exception is the one the user needs to see
            log.exception("final event sync %s -> %s failed", self.src_url, self.dst_url)

    def __repr__(self) -> str:
        return f"EventSync({self.src_url!r} -> {self.dst_url!r}, mode={self.mode!r}, interval={self.interval})"

    # ------------------------------------------------------------ passes

    def _loop(self) -> None:
        # passes start every `interval` seconds (not `interval` after the last one ended), so a slow
        # pass does not add its duration to the lag of the next
        next_at = time.monotonic()
        while True:
            self._pass(final=False, raise_errors=False)
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind: carry on from now rather than run a burst of passes
                next_at, delay = time.monotonic(), 0.0
            if self._stop.wait(delay):
                return

    def _pass(self, *, final: bool, raise_errors: bool) -> None:
        with self._lock:
            try:
                self._sync_once(final)
            except Exception as e:  # noqa: BLE001 - a network blip must not end the sync; retried next pass
                s = self._stats
                self._stats = SyncStats(s.bytes_sent, s.event_bytes, s.writes, s.passes, s.files,
                                        s.errors + 1, f"{type(e).__name__}: {e}", s.last_pass)
                if raise_errors:
                    raise SyncError(f"event sync {self.src_url} -> {self.dst_url} failed: "
                                    f"{type(e).__name__}: {e}; check both locations, and for a remote "
                                    "store its storage_options (endpoint_url, credentials)") from e
                log.warning("event sync %s -> %s failed (retrying in %.0f s): %s: %s",
                            self.src_url, self.dst_url, self.interval, type(e).__name__, e)

    def _sync_once(self, final: bool) -> None:
        if not self._resumed:
            self._resume()
            self._resumed = True
        listing = self._src.list()
        streams, others = _group(listing)
        sent = event_sent = writes = 0
        for name, segments in sorted(streams.items()):
            while True:
                n, w = self._ship_stream(name, segments)
                sent += n
                event_sent += n
                writes += w
                if n < _MAX_READ // 2:
                    break  # caught up (a bigger backlog is read in several chunks)
        now = time.time()
        for rel, info in sorted(others.items()):
            if self._copied.get(rel) == info:
                continue
            if not final and now - info.mtime < _QUIET:
                continue  # still being written; copy it once it settles
            data = self._src.read(rel)
            self._dst.write(rel, data)
            self._copied[rel] = info
            sent += len(data)
            writes += 1
        s = self._stats
        self._stats = SyncStats(s.bytes_sent + sent, s.event_bytes + event_sent, s.writes + writes,
                                s.passes + 1, len(self._tracks), s.errors, s.last_error, time.time())

    def _resume(self) -> None:
        """Learn what the destination already holds so a restarted sync continues, not repeats."""
        streams, _ = _group(self._dst.list())
        for name, segments in streams.items():
            track = _Track(delivered=sum(size for _, size in segments))
            if self.mode == "parts":
                numbers = [_part_number(rel) for rel, _ in segments]
                track.next_part = max(n for n in numbers if n is not None) + 1 if any(
                    n is not None for n in numbers) else 1
            self._tracks[name] = track

    def _ship_stream(self, name: str, segments: list[tuple[str, int]]) -> tuple[int, int]:
        """Ship the new whole records of one logical event file; returns (bytes, writes)."""
        track = self._tracks.setdefault(name, _Track())
        total = sum(size for _, size in segments)
        if total < track.delivered:
            log.warning("%s shrank from %d to %d bytes (recreated?); copying it again from the start",
                        name, track.delivered, total)
            if self.mode == "append":
                self._dst.delete(name)
            else:
                for number in range(1, track.next_part):
                    self._dst.delete(f"{name}.part-{number:06d}")
            track.delivered, track.raw, track.next_part = 0, False, 1
        if total == track.delivered:
            return 0, 0
        data = _read_range(self._src, segments, track.delivered, min(total - track.delivered, _MAX_READ))
        if track.raw:
            cut = len(data)
        else:
            whole = complete_records(data)
            if whole is None:
                # not TFRecord framing (or damaged): pass bytes through untouched rather than stall
                log.warning("%s is not a TFRecord stream at byte %d; copying it as raw bytes",
                            name, track.delivered)
                track.raw = True
                cut = len(data)
            else:
                cut = whole
        if cut == 0:
            return 0, 0
        chunk = data[:cut]
        if self.mode == "parts":
            self._dst.write(f"{name}.part-{track.next_part:06d}", chunk)
            track.next_part += 1
        elif track.delivered == 0:
            self._dst.write(name, chunk)
        else:
            self._dst.append(name, chunk)
        track.delivered += cut
        return cut, 1


def _part_number(rel: str) -> int | None:
    m = _PART_RE.match(rel)
    return int(m.group("n")) if m else None


def _group(listing: Mapping[str, FileInfo]) -> tuple[dict[str, list[tuple[str, int]]], dict[str, FileInfo]]:
    """Split a listing into logical event streams (name -> ordered segments) and other files."""
    streams: dict[str, list[tuple[int, str, int]]] = {}
    others: dict[str, FileInfo] = {}
    for rel, info in listing.items():
        m = _PART_RE.match(rel)
        if m and is_event_file(m.group("base")):
            streams.setdefault(m.group("base"), []).append((int(m.group("n")), rel, info.size))
        elif is_event_file(rel):
            streams.setdefault(rel, []).append((0, rel, info.size))
        else:
            others[rel] = info
    out: dict[str, list[tuple[str, int]]] = {}
    for name, items in streams.items():
        items.sort()
        # parts must be contiguous from 1: a later part may be listed before an earlier one lands
        chain, expect = [], 1
        for number, rel, size in items:
            if number == 0:
                chain.append((rel, size))
            elif number == expect:
                chain.append((rel, size))
                expect += 1
            else:
                break
        out[name] = chain
    return out, others


def _read_range(store: _Store, segments: list[tuple[str, int]], start: int, length: int) -> bytes:
    """Bytes [start, start+length) of the concatenation of ``segments``."""
    pieces, pos, end = [], 0, start + length
    for rel, size in segments:
        lo, hi = max(start, pos), min(end, pos + size)
        if lo == pos and hi == pos + size:
            pieces.append(store.read(rel))          # a whole part: no range, so checksums apply
        elif lo < hi:
            pieces.append(store.read(rel, lo - pos, hi - lo))
        pos += size
        if pos >= end:
            break
    return b"".join(pieces)
