"""The checkpoints directly inside ``checkpoint_dir``: TensorFlow prefixes (complete when the index and every shard
exist), ``.weights.h5`` files (complete when the HDF5 superblock records a close at the file's length) and numbered
``.keras`` zips (complete when they end with their central directory). A rewrite is a new version; a file is loaded
from a private copy checked whole, and one that changed meanwhile raises :class:`Torn`."""
from __future__ import annotations

import contextlib
import math
import os
import re
import tempfile
import time
from dataclasses import dataclass

from ..storage import Store

_SHARD_RE = re.compile(r"^(?P<prefix>.+)\.data-(?P<i>\d{5})-of-(?P<n>\d{5})$")
H5, KERAS = ".weights.h5", ".keras"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_ZIP_END = b"PK\x05\x06"  # end of central directory record: 22 bytes when the zip has no comment


class Torn(OSError):
    """A checkpoint file changed, or is not whole, around its load: a write in progress (retried)."""


@dataclass
class Candidate:
    """One checkpoint version not handled yet."""

    name: str                      # relative to checkpoint_dir: the prefix "ckpt-3", or the file "ckpt-3.weights.h5"
    number: int | None             # the last number in the name (before its suffix)
    complete: bool = False
    fingerprint: tuple = ()        # (file, size, mtime, version) of the index (or the file), then each shard
    found_at: float | None = None  # wall-clock time it was first seen complete
    failures: int = 0              # failed loads since the files last changed
    torn: int = 0                  # loads that found the file changing (Torn) since the last scan
    unchanged_polls: int = 0
    mtime: float = 0.0

    @property
    def is_file(self) -> bool:  # a Keras file, not a TensorFlow prefix
        return self.name.endswith((H5, KERAS))


class Checkpoints:
    """The checkpoint versions of ``store`` not done yet; after training ended, an incomplete one is given up after
    ``max_retries`` scans with unchanged files."""

    def __init__(self, store: Store, max_retries: int):
        self.store, self.max_retries = store, max_retries
        self.pending: dict[str, Candidate] = {}
        # name -> mtime of the index (or file) of the version handled (evaluated or skipped)
        self._done: dict[str, float] = {}

    def scan(self, finished: bool) -> tuple[list[Candidate], list[tuple[Candidate, str]]]:
        """One listing: the complete checkpoints in evaluation order (number, time, name), and the ones to give up on
        with the reason (``finished``: training ended, so an incomplete one never completes)."""
        listing = self.store.list(recursive=False)
        now = time.time()
        shards: dict[str, list[tuple[int, int, str]]] = {}
        for rel in listing:
            m = _SHARD_RE.match(rel)
            if m:
                shards.setdefault(m.group("prefix"), []).append((int(m.group("i")), int(m.group("n")), rel))
        seen = set()
        for rel, info in listing.items():
            if rel.endswith(".index"):
                name = rel[: -len(".index")]
                parts = shards.get(name, [])
                files = (rel,) + tuple(sorted(r for _, _, r in parts))
            elif rel.endswith(H5) or (rel.endswith(KERAS) and _number(rel) is not None):
                name, parts, files = rel, (), (rel,)
            else:
                continue
            seen.add(name)
            if self._done.get(name) == info.mtime:
                continue
            cand = self.pending.setdefault(name, Candidate(name, _number(name)))
            fingerprint = tuple((f, listing[f].size, listing[f].mtime, listing[f].version) for f in files)
            if fingerprint == cand.fingerprint:
                cand.unchanged_polls += 1
                cand.failures, cand.torn = cand.failures + cand.torn, 0  # it did not change after all: failures
            else:
                # the files moved on (a write in progress): earlier load failures do not count
                cand.unchanged_polls = cand.failures = cand.torn = 0
            if cand.is_file:
                # read again while not complete: a file closed within the mtime's resolution looks unchanged
                if fingerprint != cand.fingerprint or not cand.complete:
                    cand.complete = self._whole(rel, info.size)
            else:
                count = parts[0][1] if parts else 0
                cand.complete = count > 0 and {i for i, n, _ in parts if n == count} == set(range(count))
            cand.fingerprint, cand.mtime = fingerprint, info.mtime
            if cand.complete and cand.found_at is None:
                cand.found_at = now
        # CheckpointManager(max_to_keep=...) deletes checkpoints, maybe before we got to them
        gone = [(c, "deleted before it could be evaluated") for c in self.pending.values() if c.name not in seen]
        listed = [c for c in self.pending.values() if c.name in seen]
        # a missing shard or an unclosed file is a write in progress; after training ended it never completes
        gone += [(c, "incomplete: " + ("the file was never closed" if c.is_file else "data files missing")
                  + " after training ended") for c in listed
                 if not c.complete and finished and c.unchanged_polls >= self.max_retries]
        ready = sorted((c for c in listed if c.complete),
                       key=lambda c: (math.inf if c.number is None else c.number, c.mtime, c.name))
        return ready, gone

    def exists(self, cand: Candidate) -> bool:
        """The checkpoint's index (or file) is still in the directory."""
        return bool(self.store.list(recursive=False).get(cand.fingerprint[0][0]))

    def done(self, cand: Candidate) -> None:
        """This version is handled (evaluated or skipped): scans no longer return it."""
        self._done[cand.name] = cand.mtime
        self.pending.pop(cand.name, None)

    @contextlib.contextmanager
    def local_copy(self, cand: Candidate):
        """The checkpoint on a local disk: a local TensorFlow prefix as it is, anything else copied into a private
        folder (TensorFlow cannot read every URL; HDF5 locks a file it opens, and training may rewrite it). Torn when
        a file's copy is not the complete version scanned."""
        if self.store.local and not cand.is_file:
            yield self.store.url(cand.name)
            return
        with tempfile.TemporaryDirectory(prefix="tfnb-eval-ckpt-", ignore_cleanup_errors=True) as tmp:
            path = os.path.join(tmp, cand.name)
            try:
                for rel, size, _, version in cand.fingerprint:
                    # pinned to the listed version: a file rewritten since fails here instead of arriving mixed
                    self.store.get(rel, os.path.join(tmp, rel), size=size, version=version or None)
            except Exception as e:
                if cand.is_file and self._changed(cand):
                    raise self._torn(cand, "changed while it was copied") from e
                raise
            if cand.is_file and (self._changed(cand) or not _whole_file(path)):
                raise self._torn(cand, "changed while it was copied")
            yield path

    def _changed(self, cand: Candidate) -> bool:
        """The file is no longer the version scanned, or gone (not by mtime: a listing and a stat may differ in
        precision)."""
        rel, size, _, version = cand.fingerprint[0]
        try:
            now = self.store.stat(rel)
        except Exception:  # noqa: BLE001 - unreadable counts as changed: looked at again next scan
            return True
        return now is None or (now.size, now.version) != (size, version)

    @staticmethod
    def _torn(cand: Candidate, what: str) -> Torn:
        cand.complete = False  # the next scan reads its header again, even if its size and mtime look the same
        return Torn(f"{cand.name} {what} (a write in progress)")

    def _whole(self, rel: str, size: int) -> bool:
        """False also when unreadable (looked at again next scan)."""
        try:
            return _is_whole(rel, size, lambda offset, n: self.store.read(rel, offset, n))
        except Exception:  # noqa: BLE001
            return False


def _is_whole(name: str, size: int, read) -> bool:
    """A ``.weights.h5`` or ``.keras`` file of ``size`` bytes, read by ``read(offset, n)``, is whole."""
    if name.endswith(H5):
        return _hdf5_closed(read(0, 64), size)
    return size >= 22 and _zip_ended(read(size - 22, 22), size)


def _whole_file(path: str) -> bool:
    with open(path, "rb") as f:
        return _is_whole(path, os.fstat(f.fileno()).st_size, lambda offset, n: os.pread(f.fileno(), n, offset))


def _hdf5_closed(head: bytes, size: int) -> bool:
    """The superblock at offset 0 (as h5py writes it) records a close: flags clear, end-of-file address ``size``."""
    if not head.startswith(HDF5_SIGNATURE) or len(head) < 48:
        return False
    version = head[8]
    if version in (0, 1):
        offsets = head[13]
        flags = int.from_bytes(head[20:24], "little")
        eof_at = 24 + (4 if version == 1 else 0) + 2 * offsets
    else:
        offsets, flags = head[9], head[11]
        eof_at = 12 + 2 * offsets
    if offsets not in (4, 8) or len(head) < eof_at + offsets:
        return False
    return flags == 0 and int.from_bytes(head[eof_at:eof_at + offsets], "little") == size


def _zip_ended(tail: bytes, size: int) -> bool:
    """The last 22 bytes are the end record, pointing right before itself (zip64: its own records lie between)."""
    if len(tail) != 22 or not tail.startswith(_ZIP_END) or tail[20:22] != b"\0\0":
        return False
    cd_size, cd_offset = int.from_bytes(tail[12:16], "little"), int.from_bytes(tail[16:20], "little")
    return cd_offset == 0xFFFFFFFF or cd_offset + cd_size == size - 22


def _number(name: str) -> int | None:
    """The last number in the name, its suffix (``.weights.h5``, ``.keras``) left out."""
    base = os.path.basename(name)
    for suffix in (H5, KERAS):
        base = base[: -len(suffix)] if base.endswith(suffix) else base
    found = re.findall(r"\d+", base)
    return int(found[-1]) if found else None
