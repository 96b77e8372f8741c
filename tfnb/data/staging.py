"""Storage -> this worker's local disk: each worker copies its own byte-balanced shard of the files (:func:`stage`).
Resumable: a file lands as a hidden ``.NAME.tfnb-part``, renamed when whole and recorded in ``.tfnb-stage.json`` (merged
under a file lock: workers may share ``dest``). A file renamed but not recorded is kept when its MD5 is the object's
single-part ETag (no fsync: not power-loss safe)."""
from __future__ import annotations

import contextlib
import hashlib
import heapq
import threading
import json
import logging
import os
import queue
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Mapping, Sequence

from .._config import setting
from .._deps import require
from ..storage import PART, Store, atomic_write, locked, open_store
from ..errors import ConfigError, MissingDependencyError, StorageError, summary

log = logging.getLogger(__name__)

MANIFEST_NAME = ".tfnb-stage.json"
_MANIFEST_VERSION = 1
# GETs in flight per worker, for small objects and for the parts of big ones each; never more threads than files.
# bench/staging.py on 2 cores: 16 ran 16 x 32 MiB at 0.64-0.68 x a sequential boto3 loop and 8 at 1.03-1.13 x; on
# obstore 32 ran below 8 in every cell (256 x 1 MiB at 20 ms RTT: 1.19 against 1.57 x s5cmd): CPU bounds it.
_DEFAULT_CONCURRENCY = 8
_DEFAULT_CHUNK = 8 * 1024 * 1024
_WHOLE_PARTS = 8  # an object up to this many chunks may be one GET (s5cmd: below its 50 MB part size)
_CALLBACK_INTERVAL = 0.25              # seconds between progress callbacks
_MANIFEST_INTERVAL = 1.0               # seconds between manifest writes while downloading
_MD5_ETAG = re.compile(r"[0-9a-f]{32}")  # S3's ETag of a single-part, non-KMS object is its MD5


@dataclass(frozen=True)
class RemoteFile:
    """One source file: its URL, path below ``dest``, size, version (ETag, checksum or mtime), path below the root."""

    url: str
    rel: str
    size: int
    version: str
    key: str = field(default="", repr=False)


@dataclass(frozen=True)
class StageProgress:
    """Where one :func:`stage` call is, as passed to its ``callback``; counts this call's downloads."""

    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int


@dataclass(frozen=True)
class StageResult:
    """What :func:`stage` did.

    Attributes:
        src: the source URL as given.
        dest: absolute local directory the shard is in.
        index: this shard's index.
        count: number of shards.
        files: files in this shard (all now complete on local disk).
        bytes: bytes in this shard.
        downloaded_files: files fetched by this call.
        downloaded_bytes: bytes fetched by this call (0 on a rerun with nothing new).
        skipped_files: files already complete from an earlier call.
        seconds: wall time of the call, listing included.
        mb_per_s: ``downloaded_bytes / seconds`` in MB/s (10**6 bytes).
        paths: local paths of the shard's files, sorted by relative path.
    """

    src: str
    dest: str
    index: int
    count: int
    files: int
    bytes: int
    downloaded_files: int
    downloaded_bytes: int
    skipped_files: int
    seconds: float
    mb_per_s: float
    paths: tuple[str, ...] = field(repr=False)

    def summary(self) -> str:
        """One line for logs and the command line."""
        return (f"shard {self.index}/{self.count} of {self.src}: {self.files} files "
                f"({_human(self.bytes)}) in {self.dest}; downloaded {self.downloaded_files} "
                f"({_human(self.downloaded_bytes)}), {self.skipped_files} already complete; "
                f"{self.seconds:.2f} s, {self.mb_per_s:.1f} MB/s")


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def assign_shard(files: Sequence[RemoteFile], index: int, count: int) -> list[RemoteFile]:
    """Shard ``index`` of ``count`` of ``files``, sorted by ``rel``; deterministic given ``files``. Files sorted by
    (size desc, rel) go one by one to the shard with the fewest bytes so far (then fewest files, then lowest index),
    so any two shards differ by at most the largest file's size."""
    _check_shard_args(index, count)
    heap = [(0, 0, i) for i in range(count)]
    mine = []
    for f in sorted(files, key=lambda f: (-f.size, f.rel)):
        load, n, i = heapq.heappop(heap)
        if i == index:
            mine.append(f)
        heapq.heappush(heap, (load + f.size, n + 1, i))
    return sorted(mine, key=lambda f: f.rel)


def _check_shard_args(index: Any, count: Any) -> None:
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ConfigError(f"count={count!r} but it must be an int >= 1; pass count=ctx.num_workers "
                          "(or 1 to stage everything)")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < count:
        raise ConfigError(f"index={index!r} but it must be an int in 0..{count - 1} for count={count}; "
                          "pass index=ctx.task_index, count=ctx.num_workers")


def _safe_rel(rel: str, url: str) -> str | None:
    """``rel`` normalised to ``a/b/c``; None for folder markers and our manifest (listings skip temp names)."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts:
        return None
    if ".." in parts:
        raise StorageError(f"{url} would be written outside dest ('..' in its key); rename the object or stage a "
                           "prefix below it")
    return None if parts[-1].startswith(MANIFEST_NAME) else "/".join(parts)


class _Manifest:
    """The record of complete files in ``dest``."""

    def __init__(self, dest: Path):
        self.path = dest / MANIFEST_NAME
        self.lock = dest / (MANIFEST_NAME + ".lock")
        self.entries = self._read()
        self.pending: dict[str, dict] = {}
        self.last_write = time.monotonic()

    def _read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable staging manifest %s (%s); files will be checked again", self.path, e)
            return {}
        files = data.get("files") if isinstance(data, dict) and data.get("version") == _MANIFEST_VERSION else None
        return files if isinstance(files, dict) else {}

    @staticmethod
    def _entry(f: RemoteFile, st: os.stat_result) -> dict:
        return {"source": f.url, "size": f.size, "version": f.version, "mtime_ns": st.st_mtime_ns}

    def is_complete(self, f: RemoteFile, local: Path) -> bool:
        """Recorded complete, or (renamed by a killed run, not recorded) its MD5 is ``f``'s single-part ETag."""
        try:
            st = local.stat()
            if st.st_size != f.size or self.entries.get(f.rel) == self._entry(f, st):
                return st.st_size == f.size
            if not _MD5_ETAG.fullmatch(f.version):
                return False
            h = hashlib.md5(usedforsecurity=False)
            with open(local, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
        except OSError:
            return False
        same = h.hexdigest() == f.version
        if same:
            self.record(f, st)
        return same

    def record(self, f: RemoteFile, st: os.stat_result) -> None:
        self.pending[f.rel] = self._entry(f, st)
        if time.monotonic() - self.last_write >= _MANIFEST_INTERVAL:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        with locked(str(self.lock)):   # workers sharing a dest merge, never overwrite
            merged = self._read()
            merged.update(self.pending)
            atomic_write(str(self.path), json.dumps({"version": _MANIFEST_VERSION, "files": merged},
                                                    sort_keys=True, separators=(",", ":")).encode())
        self.entries = merged
        self.pending = {}
        self.last_write = time.monotonic()


def _part(local: Path) -> Path:
    return local.with_name(f".{local.name}{PART}")


def _remove_leftovers(locals_: Sequence[Path]) -> None:
    """Delete temp files a killed run left for these files (only these: other shards may be live)."""
    wanted: dict[Path, set[str]] = {}
    for p in locals_:
        wanted.setdefault(p.parent, set()).add(p.name)
    for folder, names in wanted.items():
        # .NAME.tfnb-part, and the store's ..NAME.tfnb-part.tfnb-part-X (or any other suffix) behind
        for temp in folder.glob(f".*{PART}*"):
            if temp.name.lstrip(".").split(PART)[0] in names:
                with contextlib.suppress(FileNotFoundError):
                    temp.unlink()


def stage(src: str, dest: str | os.PathLike, *, index: int = 0, count: int = 1,
          endpoint_url: str | None = None, concurrency: int | None = None,
          chunk_size: int | None = None, storage_options: Mapping[str, Any] | None = None,
          progress: bool = False, callback: Callable[[StageProgress], None] | None = None
          ) -> StageResult:
    """Copy shard ``index`` of ``count`` of the files under ``src`` into ``dest``; a rerun after a failure or kill
    fetches only what is missing or changed (docs/data.md).

    Args:
        src: ``s3://bucket/prefix`` (or ``s3a://``, ``s3n://``), any fsspec URL (``gs://`` with gcsfs installed),
            or a local path such as ``/dbfs/data``. A URL naming a single object stages that object.
        dest: local directory; created if missing. Paths below the prefix are kept below it.
        index: this worker's shard, usually ``ctx.task_index``.
        count: number of shards, usually ``ctx.num_workers``; 1 stages everything.
        endpoint_url: S3-compatible server. Env: TFNB_S3_ENDPOINT_URL, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL.
        concurrency: S3 GETs in flight, for small objects and for the parts of big ones each; fsspec file
            copies at once. Default 8. Env: TFNB_STAGE_CONCURRENCY.
        chunk_size: objects larger than this come as parallel ranged GETs of this size (up to 8 chunks: one GET
            while ``concurrency`` files are unfinished). Default 8 MiB, at least 1 MiB. Env: TFNB_STAGE_CHUNK_SIZE.
        storage_options: docs/data.md, "Storage URLs and options" (fsspec URLs: the filesystem's); never logged.
        progress: show a tqdm bar on stderr.
        callback: called with a :class:`StageProgress` at the start, at most every 0.25 s while downloading,
            and at the end, always from the calling thread.

    Returns:
        A :class:`StageResult`.

    Raises:
        ConfigError: bad ``index``/``count``/``concurrency``/``chunk_size``, or a scheme no backend handles.
        MissingDependencyError: boto3 (for S3), fsspec, or the fsspec backend is not installed.
        StorageError: no credentials or access, no files under the URL, too little disk space, a failed download.

    Example:
        >>> staged = tfnb.stage("s3://bucket/train/", "/local_disk0/train", index=ctx.task_index,
        ...                     count=ctx.num_workers)  # in train_fn
        >>> ds = tf.data.TFRecordDataset(list(staged.paths))
    """
    start = time.monotonic()
    _check_shard_args(index, count)
    if not isinstance(src, str) or not src:
        raise ConfigError(f"src={src!r} but it must be a non-empty URL or path, e.g. "
                          "'s3://bucket/prefix' or '/dbfs/data'")
    concurrency = setting("stage_concurrency", concurrency, _DEFAULT_CONCURRENCY)
    chunk_size = setting("stage_chunk_size", chunk_size, _DEFAULT_CHUNK)
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise ConfigError(f"concurrency={concurrency!r} but it must be an int >= 1 (TFNB_STAGE_CONCURRENCY); e.g. 16")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1024 * 1024:
        raise ConfigError(f"chunk_size={chunk_size!r} but it must be an int of at least 1 MiB "
                          "(TFNB_STAGE_CHUNK_SIZE, in bytes); e.g. 8388608")
    if not isinstance(dest, (str, os.PathLike)) or not os.fspath(dest):
        raise ConfigError(f"dest={dest!r} but it must be a local folder path, e.g. '/local_disk0/train'")
    dest_path = Path(os.fspath(dest)).expanduser().absolute()

    options = dict(storage_options or {}, **({"endpoint_url": endpoint_url} if endpoint_url else {}))
    store = open_store(src, options, purpose="staging", concurrency=concurrency, chunk_size=chunk_size)
    listing = _list(store)
    if not listing:
        raise StorageError(f"{src} has no files (it is missing or an empty folder); check the URL "
                           "or path (names are case-sensitive; a prefix is a folder path)")
    mine = assign_shard(listing, index, count)
    try:
        dest_path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StorageError(f"cannot create dest {dest_path} ({e.strerror or summary(e)}); pick a writable local "
                           f"folder\n{summary(e)}") from e
    manifest = _Manifest(dest_path)
    todo = [f for f in mine if not manifest.is_complete(f, dest_path / f.rel)]
    manifest.flush()
    _remove_leftovers([dest_path / f.rel for f in todo])
    need, free = sum(f.size for f in todo), shutil.disk_usage(dest_path).free
    if need > free:
        raise StorageError(
            f"shard {index}/{count} of {src} needs {_human(need)} in {dest_path} but only {_human(free)} are free; "
            "free space there, or pick a dest on a bigger disk\n"
            f"It needs {need} bytes ({len(todo)} files) and only {free} bytes are free; or spread the data over "
            "more workers (count).")
    log.info("staging shard %d/%d of %s into %s: %d files, %d to download (%s)", index, count,
             src, dest_path, len(mine), len(todo), _human(need))

    _download(store, todo, dest_path, manifest, concurrency=concurrency, progress=progress,
              callback=callback, label=f"stage {index}/{count}", whole_max=_WHOLE_PARTS * chunk_size)
    seconds = max(time.monotonic() - start, 1e-9)
    result = StageResult(
        src=src, dest=str(dest_path), index=index, count=count, files=len(mine),
        bytes=sum(f.size for f in mine), downloaded_files=len(todo), downloaded_bytes=need,
        skipped_files=len(mine) - len(todo), seconds=seconds, mb_per_s=need / seconds / 1e6,
        paths=tuple(str(dest_path / f.rel) for f in mine))
    log.info("%s", result.summary())
    return result


def _list(store: Store) -> list[RemoteFile]:
    """The source's files; a URL naming one file is that file."""
    found = ((rel, e, _safe_rel(rel, store.url(rel))) for rel, e in store.list().items())
    files = [RemoteFile(store.url(rel), safe, e.size, e.version, rel) for rel, e, safe in found if safe is not None]
    if files:
        return files
    one = store.stat()
    return [RemoteFile(store.url(), PurePosixPath(store.root).name, one.size, one.version, "")] if one else []


def _download(store: Store, todo: Sequence[RemoteFile], dest: Path, manifest: _Manifest, *,
              concurrency: int, progress: bool, callback: Callable[[StageProgress], None] | None,
              label: str, whole_max: int) -> None:
    """Fetch ``todo``, ``concurrency`` files at a time; download threads post events, this thread does the rest."""
    total = sum(f.size for f in todo)
    events: queue.SimpleQueue = queue.SimpleQueue()
    cancel = threading.Event()
    got = {f.rel: 0 for f in todo}
    files = {f.rel: f for f in todo}
    files_done = bytes_done = 0
    bar = require("tqdm", "a staging progress bar").tqdm(
        total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label, file=sys.stderr
    ) if progress and todo else None
    last_call = 0.0

    def report(force: bool = False) -> None:
        nonlocal last_call
        now = time.monotonic()
        if callback is not None and (force or now - last_call >= _CALLBACK_INTERVAL):
            last_call = now
            callback(StageProgress(files_done, len(todo), bytes_done, total))

    def fetch(f: RemoteFile) -> None:
        # while `concurrency` files are unfinished one GET each keeps every connection busy; ranges pay off
        # for the last (or a few big) files, and above `whole_max`, where a dropped connection costs one part
        store.get(f.key, str(_part(dest / f.rel)), size=f.size, version=f.version or None,
                  on_bytes=lambda n: events.put(("bytes", f.rel, n)), cancel=cancel,
                  whole=len(files) >= concurrency and f.size <= whole_max)

    pool = ThreadPoolExecutor(max(1, min(concurrency, len(todo))), thread_name_prefix="tfnb-stage")
    try:
        for f in todo:
            pool.submit(fetch, f).add_done_callback(lambda done, rel=f.rel: events.put(("done", rel, done)))
        report(force=True)
        while files:
            kind, rel, value = events.get()
            f = files.get(rel)
            if f is None:  # a straggling progress report of a file already finished
                continue
            if kind == "bytes":
                n = min(value, f.size - got[rel])
                got[rel] += n
            else:
                value.result()   # a failed download raises here, in the calling thread
                del files[rel]
                # renamed here, not in a download thread: after an interruption only recorded files look complete
                local = dest / rel
                os.replace(_part(local), local)
                manifest.record(f, local.stat())
                n = f.size - got[rel]
                files_done += 1
            bytes_done += n
            if bar is not None and n:
                bar.update(n)
            report(force=kind == "done" and not files)
    except BaseException:
        cancel.set()
        pool.shutdown(wait=True, cancel_futures=True)
        _remove_leftovers([dest / rel for rel in files])
        raise
    finally:
        pool.shutdown(wait=True)
        store.close()
        manifest.flush()
        if bar is not None:
            bar.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tfnb stage SRC DEST [--index I --count N ...]``; a tqdm bar when on a terminal."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m tfnb stage",
                                description="Copy one shard of the files under SRC into DEST.")
    p.add_argument("src")
    p.add_argument("dest")
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--endpoint-url", default=None)
    p.add_argument("--concurrency", type=int, default=None)
    p.add_argument("--chunk-size", type=int, default=None, help="bytes")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=sys.stderr.isatty(),
                   help="tqdm bar (default: when stderr is a terminal)")
    try:
        result = stage(**vars(p.parse_args(argv)))
    except (StorageError, ConfigError, MissingDependencyError) as e:
        print(f"tfnb stage: {e}", file=sys.stderr)
        return 1
    print(result.summary())
    return 0
