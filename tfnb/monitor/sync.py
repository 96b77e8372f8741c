"""Incremental TensorBoard event-file sync (:class:`EventSync`) between two stores. Event files are append-only
TFRecord streams (8-byte length, masked CRC-32C of it, data, masked CRC-32C of the data): each pass ships a file's new
bytes once, cut at the last whole record. Other files are copied whole once quiet 1 s."""
from __future__ import annotations

import atexit
import dataclasses
import itertools
import logging
import os
import posixpath
import re
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

from .._config import check_seconds, setting
from ..storage import Entry, Store, open_store
from ..errors import ConfigError, StorageError, TfnbError, below, summary

log = logging.getLogger(__name__)

MODES = ("auto", "append", "parts")
_PART_RE = re.compile(r"^(?P<base>.+)\.part-(?P<n>\d{6,})$")
_QUIET = 1.0                     # seconds a non-event file must be unchanged before it is copied
_MAX_READ = 64 << 20             # bytes read from one file per pass; the rest follows next pass


def _crc_entry(c: int) -> int:
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c


_CRC_TABLE = [_crc_entry(c) for c in range(256)]


def _masked_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def complete_records(buf: bytes | memoryview) -> int | None:
    """Length of the longest prefix of ``buf`` made of whole TFRecords; None when it does not start with a record
    header. Only the length's checksum is checked: enough to tell a boundary, and cheap in pure Python."""
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


def location(name: str, value: Any, example: str) -> str:
    """The directory argument ``name`` as a string; ConfigError when it is not a path or URL."""
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise ConfigError(f"{name}={value!r} must be a directory path or URL, e.g. {example}")
    return os.fspath(value)


class Background:
    """The monitors' background-thread lifecycle: :meth:`start` runs ``_begin()``, then ``_loop()`` in a daemon thread
    until the subclass's ``_stop`` event is set."""

    _thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self):
        """Start the background thread, unless it runs already; returns self."""
        if not self.running:
            self._begin()
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=f"tfnb {self!r}", daemon=True)
            self._thread.start()
        return self

    def _join(self, timeout: float | None = None) -> bool:
        """Wait for the thread; True once it has ended (or never started)."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running


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


class EventSync(Background):
    """Copies new TensorBoard event data from ``src`` to ``dest`` every ``interval`` seconds.

    A sync resumes where an earlier one stopped; one destination should have one writing sync at a time.
    :meth:`stop` (and leaving the ``with`` block) runs a final pass; ``stats`` holds the counters (:class:`SyncStats`).

    Args:
        src: directory (local path or URL) to read; event files may still be growing.
        dest: directory (local path, ``/dbfs/...``, ``s3://...`` or fsspec URL) to write.
        interval: seconds between passes (default 10; env TFNB_SYNC_INTERVAL).
        mode: "auto" (append on local disks, parts on object stores and the /dbfs, /Volumes mounts), "append"
            (new records appended) or "parts" (each pass uploads a file's new records as ``<file>.part-NNNNNN``,
            itself an event file, which a reading sync joins back byte for byte; see docs/monitoring.md).
        storage_options: options for the remote side(s): ``key``, ``secret``, ``token``,
            ``endpoint_url``, ``region``, ... (docs/data.md, "Storage URLs and options").

    Raises:
        ConfigError: bad interval or mode, ``mode="append"`` on a store that cannot append, or
            ``src`` and ``dest`` overlapping.

    Example:
        Inside train_fn, on the chief (the notebook side is in docs/monitoring.md):

        >>> with tfnb.EventSync(local_logs, ctx.log_dir, interval=10):
        ...     model.fit(ds, callbacks=[tf.keras.callbacks.TensorBoard(local_logs)])
    """

    def __init__(self, src: str | os.PathLike, dest: str | os.PathLike, *,
                 interval: float | None = None, mode: str = "auto",
                 storage_options: Mapping[str, Any] | None = None):
        self.interval = check_seconds("interval", setting("sync_interval", interval, 10.0, float),
                                      "a number of seconds > 0, e.g. interval=10")
        if mode not in MODES:
            raise ConfigError(f"mode={mode!r} must be one of {', '.join(MODES)}")
        self.src = location("src", src, "'/tmp/tb/run1' or 's3://bucket/run1/logs'")
        self.dest = location("dest", dest, "'/tmp/tb/run1' or 's3://bucket/run1/logs'")
        self._src = open_store(self.src, storage_options, purpose="syncing events from")
        self._dst = open_store(self.dest, storage_options, purpose="syncing events to")
        a, b = self._src.url().rstrip("/") + "/", self._dst.url().rstrip("/") + "/"
        if a.startswith(b) or b.startswith(a):
            raise ConfigError(f"src {self.src!r} and dest {self.dest!r} overlap; "
                              f"sync into a directory outside the source")
        if mode == "append" and not self._dst.appendable:
            raise ConfigError(f"mode='append' but {self.dest!r} cannot be appended to in place; "
                              f"use mode='parts' (or 'auto')")
        self.mode = mode if mode != "auto" else ("append" if self._dst.appendable else "parts")
        self._tracks: dict[str, _Track] | None = None   # learnt from the destination on the first pass
        self._copied: dict[str, Entry] = {}   # non-event files: what was copied last
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.stats = SyncStats()  # replaced, never changed: a snapshot

    def _begin(self) -> None:
        atexit.register(self._stop_at_exit)

    def flush(self) -> SyncStats:
        """Run one pass now, in the calling thread, and return the counters.

        Raises:
            StorageError: the pass failed (the cause is chained).
        """
        self._pass(final=False, raise_errors=True)
        return self.stats

    def stop(self) -> SyncStats:
        """Stop the thread, run a final pass that ships everything written so far, return the counters.

        Raises:
            StorageError: the final pass failed (the cause is chained).
        """
        if self._stop.is_set():
            return self.stats  # stopped already: its final pass ran
        self._stop.set()
        self._join()
        atexit.unregister(self._stop_at_exit)
        self._pass(final=True, raise_errors=True)
        return self.stats

    def __enter__(self) -> "EventSync":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.stop()
        else:  # the body's own exception is the one the user needs to see
            self._stop_at_exit()

    def _stop_at_exit(self) -> None:
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - interpreter exit, or another exception raising: report, never raise
            log.exception("final event sync %s -> %s failed", self.src, self.dest)

    def __repr__(self) -> str:
        return f"EventSync({self.src!r} -> {self.dest!r}, mode={self.mode!r}, interval={self.interval})"

    def _loop(self) -> None:
        # passes start every `interval` seconds, so a slow pass does not add to the next one's lag; one that fell
        # behind carries on from now rather than run a burst of passes
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._pass(final=False, raise_errors=False)
            next_at = max(next_at + self.interval, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    def _pass(self, *, final: bool, raise_errors: bool) -> None:
        with self._lock:
            try:
                self._sync_once(final)
            except Exception as e:  # noqa: BLE001 - a network blip must not end the sync; retried next pass
                self.stats = dataclasses.replace(self.stats, errors=self.stats.errors + 1,
                                                 last_error=f"{type(e).__name__}: {e}")
                if raise_errors:
                    # a tfnb error (StorageError...) ends its first line with its own fix, its detail below it
                    fix = "" if isinstance(e, TfnbError) else ("; check both locations, and a remote store's "
                                                               "storage_options (endpoint_url, credentials)")
                    raise StorageError(f"event sync {self.src} -> {self.dest} failed: {summary(e, 80)}{fix}"
                                       f"{'' if fix else below(e)}") from e
                log.warning("event sync %s -> %s failed (retrying in %.0f s): %s",
                            self.src, self.dest, self.interval, summary(e))

    def _sync_once(self, final: bool) -> None:
        if self._tracks is None:
            self._tracks = self._resume()
        streams, others = _group(self._src.list())
        event_sent = copied = writes = 0
        for name, segments in sorted(streams.items()):
            n = _MAX_READ
            while n >= _MAX_READ // 2:  # a big backlog is read in several chunks, until caught up
                n = self._ship_stream(name, segments)
                event_sent += n
                writes += n > 0
        now = time.time()
        for rel, info in sorted(others.items()):
            # unchanged since the last copy, or still being written (copied once it settles)
            if self._copied.get(rel) == info or (not final and now - info.mtime < _QUIET):
                continue
            data = self._src.read(rel)
            self._dst.write(rel, data)
            self._copied[rel] = info
            copied += len(data)
            writes += 1
        s = self.stats
        self.stats = dataclasses.replace(
            s, bytes_sent=s.bytes_sent + event_sent + copied, event_bytes=s.event_bytes + event_sent,
            writes=s.writes + writes, passes=s.passes + 1, files=len(self._tracks), last_pass=time.time())

    def _resume(self) -> dict[str, _Track]:
        """What the destination already holds: a restarted sync continues, not repeats."""
        # each segment but the base file is a part, numbered from 1 without a gap (_group)
        return {name: _Track(sum(size for _, size in segments), 1 + sum(rel != name for rel, _ in segments))
                for name, segments in _group(self._dst.list())[0].items()}

    def _ship_stream(self, name: str, segments: list[tuple[str, int]]) -> int:
        """Ship the new whole records of one logical event file in one write; the bytes sent."""
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
            return 0
        data = _read_range(self._src, segments, track.delivered, min(total - track.delivered, _MAX_READ))
        cut = len(data) if track.raw else complete_records(data)
        if cut is None:
            # not TFRecord framing (or damaged): pass bytes through untouched rather than stall
            log.warning("%s is not a TFRecord stream at byte %d; copying it as raw bytes", name, track.delivered)
            track.raw = True
            cut = len(data)
        if cut == 0:
            return 0
        chunk = data[:cut]
        if self.mode == "parts":
            self._dst.write(f"{name}.part-{track.next_part:06d}", chunk)
            track.next_part += 1
        elif track.delivered == 0:
            self._dst.write(name, chunk)
        else:
            # a reader meeting a record half appended takes it as truncated and resumes from it on its next
            # reload (TensorBoard's event_file_loader.py)
            self._dst.append(name, chunk)
        track.delivered += cut
        return cut


def _group(listing: Mapping[str, Entry]) -> tuple[dict[str, list[tuple[str, int]]], dict[str, Entry]]:
    """Split a listing into logical event streams (name -> ordered (rel, size) segments) and other files."""
    segments: dict[str, dict[int, tuple[str, int]]] = {}
    others: dict[str, Entry] = {}
    for rel, info in listing.items():
        m = _PART_RE.match(rel)
        base, number = (m.group("base"), int(m.group("n"))) if m else (rel, 0)
        if "tfevents" in posixpath.basename(base):  # TensorBoard's own rule for an event file
            segments.setdefault(base, {}).setdefault(number, (rel, info.size))
        else:
            others[rel] = info
    streams = {}
    for name, found in segments.items():
        # the base file, then parts contiguous from 1: a later part may be listed before an earlier one lands
        gap = next(n for n in itertools.count(1) if n not in found)
        streams[name] = [found[n] for n in range(0 if 0 in found else 1, gap)]
    return streams, others


def _read_range(store: Store, segments: list[tuple[str, int]], start: int, length: int) -> bytes:
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
