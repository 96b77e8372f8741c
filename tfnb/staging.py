"""Storage -> this worker's local disk: each worker copies its own byte-balanced shard of the files.

The Databricks pattern: inside ``train_fn`` every worker stages a distinct subset of the training
files from object storage to its local disk, then ``tf.data`` reads local files::

    result = tfnb.stage("s3://bucket/train/", "/local_disk0/train",
                        index=ctx.task_index, count=ctx.num_workers)
    ds = tf.data.TFRecordDataset(list(result.paths))

``s3://`` (also ``s3a://``, ``s3n://``) goes through boto3: objects up to ``chunk_size`` are one GET
each, many in flight; bigger ones go to s3transfer as parallel ranged GETs. Any other URL or plain
path (``file://``, ``/dbfs/...``, ``gs://`` when gcsfs is installed) goes through fsspec.

Sharding is deterministic given the listing: files sorted by (size desc, relative path) are dealt
greedily to the lightest shard, so shards differ by at most one file's size, every file is in exactly
one shard, and ``count=1`` stages everything. Relative paths below the prefix are kept.

Staging is idempotent and resumable. A file is downloaded to a hidden temporary name
(``.NAME.tfnb-part``, which ``*.tfrecord``-style globs do not match) and renamed when whole; the
manifest ``.tfnb-stage.json`` in ``dest_dir`` records each complete file's source URL, size, ETag (or
checksum / mtime for fsspec sources) and local mtime, and is rewritten atomically under a file lock,
so several workers may share one ``dest_dir``. A rerun downloads only what is missing or changed;
leftovers of a killed run are removed, and a file it renamed into place before recording it is kept
when its MD5 equals the object's (single-part) ETag. (The guarantee holds for a killed process, not for a power
loss: files are not fsynced.)

Nothing here prints, except a tqdm bar when asked for (``progress=True``, or the command line on a
terminal: ``python -m tfnb.staging SRC DEST``).
"""
from __future__ import annotations

import contextlib
import heapq
import json
import logging
import os
import queue
import re
import shutil
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator, Mapping, Sequence
from urllib.parse import urlsplit

from ._config import setting
from ._deps import require
from .errors import ConfigError, MissingDependencyError, StagingError

log = logging.getLogger(__name__)

MANIFEST_NAME = ".tfnb-stage.json"
PART_SUFFIX = ".tfnb-part"
_LOCK_NAME = MANIFEST_NAME + ".lock"
_MANIFEST_VERSION = 1
_S3_SCHEMES = ("s3", "s3a", "s3n")
_DEFAULT_CONCURRENCY = 16
_DEFAULT_CHUNK = 8 * 1024 * 1024
_IO_CHUNK = 1024 * 1024                # s3transfer's write unit; its 256 KiB default costs more CPU
_SMALL_GET_ATTEMPTS = 5               # as s3transfer's num_download_attempts
_IO_QUEUE = 128                        # chunks waiting for the disk: bounds memory to 128 MiB
_CALLBACK_INTERVAL = 0.25              # seconds between progress callbacks
_MANIFEST_INTERVAL = 1.0               # seconds between manifest writes while downloading
_CREDENTIAL_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
                               "ExpiredToken", "InvalidClientTokenId", "TokenRefreshRequired"})
_MD5_ETAG = re.compile(r"[0-9a-f]{32}")  # S3's ETag of a single-part, non-KMS object is its MD5
_DENIED_CODES = frozenset({"AccessDenied", "AllAccessDisabled", "403", "Forbidden"})


# ---------------------------------------------------------------- typed values


@dataclass(frozen=True)
class RemoteFile:
    """One file of the source listing.

    Attributes:
        url: the file's full source URL (named in errors, kept in the manifest).
        rel: its path below the source prefix, ``/``-separated; the path below ``dest_dir``.
        size: bytes.
        version: ETag, checksum or modification time; a change means the file must be fetched again.
        key: what the backend calls it (the S3 key, or the fsspec path).
    """

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
        src_url: the source URL as given.
        dest_dir: absolute local directory the shard is in.
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

    src_url: str
    dest_dir: str
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
        return (f"shard {self.index}/{self.count} of {self.src_url}: {self.files} files "
                f"({_human(self.bytes)}) in {self.dest_dir}; downloaded {self.downloaded_files} "
                f"({_human(self.downloaded_bytes)}), {self.skipped_files} already complete; "
                f"{self.seconds:.2f} s, {self.mb_per_s:.1f} MB/s")


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


# ---------------------------------------------------------------- sharding


def assign_shard(files: Sequence[RemoteFile], index: int, count: int) -> list[RemoteFile]:
    """The files of shard ``index`` out of ``count``, balanced by bytes; deterministic given ``files``.

    Files sorted by (size desc, rel) go one by one to the shard with the fewest bytes so far (then the
    fewest files, then the lowest index), so any two shards differ by at most the largest file's size.

    Args:
        files: the whole listing, in any order.
        index: which shard, ``0 <= index < count``.
        count: number of shards.

    Returns:
        This shard's files sorted by ``rel``.

    Example:
        >>> mine = assign_shard(listing, index=ctx.task_index, count=ctx.num_workers)
    """
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
    """``rel`` normalised to ``a/b/c``; None for folder markers and our own bookkeeping files."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts:
        return None
    if ".." in parts:
        raise StagingError(f"{url} would be written outside dest_dir ('..' in its key); rename the "
                           "object or stage a prefix below it")
    name = parts[-1]
    if name.startswith(MANIFEST_NAME) or (name.startswith(".") and PART_SUFFIX in name):
        return None
    return "/".join(parts)


# ---------------------------------------------------------------- manifest


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` across processes (workers sharing a dest_dir)."""
    try:
        import fcntl
    except ImportError:  # Windows: a single process per dest_dir is assumed
        yield
        return
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class _Manifest:
    """The record of complete files in ``dest_dir``, merged and replaced atomically under a lock."""

    def __init__(self, dest: Path):
        self.path = dest / MANIFEST_NAME
        self.lock = dest / _LOCK_NAME
        self.entries = self._read()
        self.pending: dict[str, dict] = {}
        self.last_write = time.monotonic()

    def _read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable staging manifest %s (%s); files will be checked again",
                        self.path, e)
            return {}
        if not isinstance(data, dict) or data.get("version") != _MANIFEST_VERSION:
            return {}
        files = data.get("files")
        return files if isinstance(files, dict) else {}

    def is_complete(self, f: RemoteFile, local: Path) -> bool:
        e = self.entries.get(f.rel)
        if not isinstance(e, dict) or (e.get("source"), e.get("size"), e.get("version")) != (
                f.url, f.size, f.version):
            return False
        try:
            st = local.stat()
        except OSError:
            return False
        return st.st_size == f.size and st.st_mtime_ns == e.get("mtime_ns")

    def record(self, f: RemoteFile, st: os.stat_result) -> None:
        self.pending[f.rel] = {"source": f.url, "size": f.size, "version": f.version,
                               "mtime_ns": st.st_mtime_ns}
        if time.monotonic() - self.last_write >= _MANIFEST_INTERVAL:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        with _locked(self.lock):
            merged = self._read()
            merged.update(self.pending)
            tmp = self.path.with_name(f"{MANIFEST_NAME}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"version": _MANIFEST_VERSION, "files": merged},
                                      sort_keys=True, separators=(",", ":")))
            os.replace(tmp, self.path)
        self.entries = merged
        self.pending = {}
        self.last_write = time.monotonic()


# ---------------------------------------------------------------- sources


OnBytes = Callable[[int], None]
OnDone = Callable[[BaseException | None], None]


class _S3Source:
    """S3 and S3-compatible servers: boto3 lists and GETs small objects, s3transfer fetches big ones."""

    def __init__(self, url: str, *, endpoint_url: str | None, concurrency: int, chunk_size: int,
                 options: Mapping[str, Any]):
        require("boto3", f"staging {url}")
        import boto3
        from botocore.config import Config

        parts = urlsplit(url)
        if not parts.netloc:
            raise ConfigError(f"{url!r} names no bucket; use s3://BUCKET/PREFIX")
        self.url = url
        self.bucket = parts.netloc
        self.prefix = parts.path.lstrip("/")
        self.endpoint_url = endpoint_url
        self.concurrency = concurrency
        self.chunk_size = chunk_size
        opts = dict(options)
        # small objects (own pool) and big ones (s3transfer) may each have `concurrency` in flight
        config = Config(max_pool_connections=2 * concurrency + 4,
                        retries={"mode": "standard", "max_attempts": 5})
        user_config = opts.pop("config", None)
        if user_config is not None:
            config = config.merge(user_config)
        try:
            self.client = boto3.session.Session().client("s3", endpoint_url=endpoint_url,
                                                         config=config, **opts)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"cannot make an S3 client for {url} ({e}); check endpoint_url "
                              f"(now {endpoint_url!r}) and the keys of storage_options") from e
        self.client.meta.events.register("before-call.s3.GetObject", _no_range_checksum)
        self._manager = None
        self._futures: set = set()
        self._pool = None
        self._closing = False

    def where(self) -> str:
        return f" at {self.endpoint_url}" if self.endpoint_url else ""

    def list(self) -> list[RemoteFile]:
        from botocore.exceptions import ClientError

        base = self.prefix if not self.prefix or self.prefix.endswith("/") else self.prefix + "/"
        files = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                             Prefix=base):
                for obj in page.get("Contents", ()):
                    key = obj["Key"]
                    url = f"s3://{self.bucket}/{key}"
                    rel = _safe_rel(key[len(base):], url)
                    if rel is not None:
                        files.append(RemoteFile(url, rel, int(obj["Size"]),
                                                str(obj.get("ETag", "")).strip('"'), key))
            if not files and self.prefix and not self.prefix.endswith("/"):
                # The URL may name one object rather than a folder.
                try:
                    head = self.client.head_object(Bucket=self.bucket, Key=self.prefix)
                except ClientError as e:
                    if _code(e) not in ("404", "NoSuchKey", "NotFound"):
                        raise
                else:
                    name = PurePosixPath(self.prefix).name
                    files.append(RemoteFile(f"s3://{self.bucket}/{self.prefix}", name,
                                            int(head["ContentLength"]),
                                            str(head.get("ETag", "")).strip('"'), self.prefix))
        except Exception as e:  # noqa: BLE001 - every botocore failure is classified below
            raise self.error(e, self.url, "listing") from e
        return files

    def empty_error(self) -> StagingError:
        return StagingError(
            f"{self.url} matched no objects (bucket {self.bucket!r}{self.where()}, prefix "
            f"{self.prefix!r}); check the URL: keys are case-sensitive and the prefix is a folder path")

    def error(self, e: BaseException, url: str, doing: str) -> BaseException:
        """``e`` as a one-line StagingError naming ``url`` and the fix (or ``e`` itself if not ours)."""
        from botocore.exceptions import (ClientError, EndpointConnectionError,
                                         NoCredentialsError, PartialCredentialsError)

        if isinstance(e, (KeyboardInterrupt, SystemExit, StagingError, ConfigError)):
            return e
        if isinstance(e, (NoCredentialsError, PartialCredentialsError)):
            return StagingError(
                f"no AWS credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(or AWS_PROFILE), attach an instance profile, or pass storage_options="
                "{'aws_access_key_id': ..., 'aws_secret_access_key': ...}")
        if isinstance(e, EndpointConnectionError):
            return StagingError(
                f"cannot connect to the S3 endpoint for {url} ({e}); check endpoint_url "
                "(or TFNB_S3_ENDPOINT_URL / AWS_ENDPOINT_URL) and that the server is reachable")
        if isinstance(e, ClientError):
            code = _code(e)
            msg = e.response.get("Error", {}).get("Message") or code
            if code == "NoSuchBucket":
                return StagingError(f"bucket {self.bucket!r} does not exist{self.where()} ({url}); "
                                    "check the bucket name in the URL and the endpoint_url")
            if code in _CREDENTIAL_CODES:
                return StagingError(
                    f"the S3 server{self.where()} rejected the credentials for {url} ({code}: {msg}); "
                    "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) or the "
                    "profile")
            if code in _DENIED_CODES:
                return StagingError(
                    f"access denied {doing} {url}{self.where()}; grant these credentials "
                    f"s3:ListBucket on bucket {self.bucket!r} and s3:GetObject on the prefix, or use "
                    "credentials that have them")
            if code in ("PreconditionFailed", "412"):
                return StagingError(f"{url} changed while it was being staged; run stage again")
            if code in ("NoSuchKey", "404"):
                return StagingError(f"{url} disappeared after it was listed; run stage again")
            return StagingError(f"{doing} {url}{self.where()} failed: {code}: {msg}")
        return StagingError(f"{doing} {url}{self.where()} failed: {type(e).__name__}: {e}")

    def verify(self, f: RemoteFile, local: Path) -> bool:
        """True when ``local`` is ``f`` whole: its MD5 equals a single-part ETag (which is an MD5).

        Finds files a killed run renamed into place but had not yet written to the manifest.
        """
        if not _MD5_ETAG.fullmatch(f.version) or not _same_size(local, f.size):
            return False
        return _md5(local) == f.version

    def start(self, f: RemoteFile, tmp: Path, on_bytes: OnBytes, on_done: OnDone) -> None:
        if f.size <= self.chunk_size:
            # One GET each: s3transfer's per-transfer machinery costs about as much CPU as the
            # request itself, which dominates for small objects.
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="tfnb-stage")

            def done(fut) -> None:
                on_done(StagingError("cancelled") if fut.cancelled() else fut.exception())

            self._pool.submit(self._get_small, f, tmp, on_bytes).add_done_callback(done)
            return
        if self._manager is None:
            from s3transfer.manager import TransferConfig, TransferManager

            config = TransferConfig(multipart_threshold=self.chunk_size,
                                    multipart_chunksize=self.chunk_size,
                                    max_request_concurrency=self.concurrency,
                                    io_chunksize=_IO_CHUNK, max_io_queue_size=_IO_QUEUE)
            self._manager = TransferManager(self.client, config)
        box: list = []   # the future, for cancelling; done() may run before download() returns

        def done(exc: BaseException | None) -> None:
            if box:
                self._futures.discard(box[0])
            on_done(exc)

        box.append(self._manager.download(self.bucket, f.key, str(tmp),
                                          subscribers=[_s3_subscriber(f, on_bytes, done)]))
        self._futures.add(box[0])

    def _get_small(self, f: RemoteFile, tmp: Path, on_bytes: OnBytes) -> None:
        from s3transfer.utils import S3_RETRYABLE_DOWNLOAD_ERRORS

        extra = {"IfMatch": f'"{f.version}"'} if f.version else {}
        for attempt in range(_SMALL_GET_ATTEMPTS):
            written = 0
            try:
                body = self.client.get_object(Bucket=self.bucket, Key=f.key, **extra)["Body"]
                with open(tmp, "wb") as fh:
                    for block in body.iter_chunks(_IO_CHUNK):
                        fh.write(block)
                        written += len(block)
                        on_bytes(len(block))
                return
            except S3_RETRYABLE_DOWNLOAD_ERRORS:
                # botocore retries the request but not a body cut short; start the object again
                on_bytes(-written)
                if attempt + 1 == _SMALL_GET_ATTEMPTS or self._closing:
                    raise

    def close(self, cancel: bool) -> None:
        self._closing = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=cancel)
            self._pool = None
        if self._manager is not None:
            if cancel:
                # Not shutdown(cancel=True): s3transfer 0.19 passes its message on as the exception
                # type there and raises TypeError.
                for future in list(self._futures):
                    future.cancel()
            self._manager.shutdown()
            self._manager = None


def _no_range_checksum(params, **kwargs) -> None:
    """Skip response-checksum validation of ranged GETs.

    AWS sends no whole-object checksum with a range, but some S3-compatible servers (``rclone serve
    s3``) do, and botocore then checks the part against the whole object's CRC and fails. Whole-object
    GETs keep their validation; ranged ones are still checked for size and guarded by If-Match.
    """
    if "Range" in params.get("headers", {}):
        params.get("context", {}).get("checksum", {}).pop("response_algorithms", None)


def _s3_subscriber(f: RemoteFile, on_bytes: OnBytes, on_done: OnDone):
    from s3transfer.subscribers import BaseSubscriber

    class Subscriber(BaseSubscriber):
        def on_queued(self, future, **kwargs):
            # Size and ETag from the listing spare one HEAD per object, and the ETag makes every
            # GET conditional (If-Match), so an object replaced mid-download fails instead of mixing.
            future.meta.provide_transfer_size(f.size)
            if f.version:
                future.meta.provide_object_etag(f'"{f.version}"')

        def on_progress(self, future, bytes_transferred, **kwargs):
            on_bytes(bytes_transferred)

        def on_done(self, future, **kwargs):
            try:
                future.result()
            except BaseException as e:  # noqa: BLE001 - handed to the staging loop
                on_done(e)
            else:
                on_done(None)

    return Subscriber()


class _FsspecSource:
    """Any fsspec filesystem (local paths, ``file://``, ``gs://``, ...), one thread per file in flight."""

    def __init__(self, url: str, *, concurrency: int, options: Mapping[str, Any]):
        require("fsspec", f"staging {url}")
        import fsspec

        self.url = url
        try:
            self.fs, self.path = fsspec.core.url_to_fs(url, **options)
        except ImportError as e:
            raise MissingDependencyError(f"staging {url} needs an fsspec backend that is not "
                                         f"installed: {e}") from e
        except ValueError as e:
            if "Protocol not known" not in str(e):
                raise StagingError(f"cannot open {url}: {e}") from e
            scheme = url.split("://", 1)[0]
            raise ConfigError(
                f"{url!r} uses scheme {scheme!r}, which neither boto3 nor fsspec knows; use s3://, "
                "file://, a local path such as /dbfs/..., or install the fsspec backend for it") from e
        self.concurrency = concurrency
        self._pool = None

    def list(self) -> list[RemoteFile]:
        root = self.path.rstrip("/") or "/"
        try:
            if self.fs.isfile(root):
                info = self.fs.info(root)
                return [RemoteFile(self.fs.unstrip_protocol(root), PurePosixPath(root).name,
                                   int(info.get("size") or 0), _fsspec_version(info), root)]
            found = self.fs.find(root, detail=True)
        except FileNotFoundError:
            return []
        except Exception as e:  # noqa: BLE001 - classified below
            raise self.error(e, self.url, "listing") from e
        files = []
        for path, info in found.items():
            if info.get("type", "file") != "file" or not path.startswith(root.rstrip("/") + "/"):
                continue
            url = self.fs.unstrip_protocol(path)
            rel = _safe_rel(path[len(root.rstrip("/")) + 1:], url)
            if rel is not None:
                files.append(RemoteFile(url, rel, int(info.get("size") or 0), _fsspec_version(info),
                                        path))
        return files

    def empty_error(self) -> StagingError:
        return StagingError(f"{self.url} has no files (it is missing or an empty folder); check "
                            "the path")

    def error(self, e: BaseException, url: str, doing: str) -> BaseException:
        if isinstance(e, (KeyboardInterrupt, SystemExit, StagingError, ConfigError)):
            return e
        if isinstance(e, PermissionError):
            return StagingError(f"access denied {doing} {url} ({e}); give this process read access "
                                "or use other credentials")
        return StagingError(f"{doing} {url} failed: {type(e).__name__}: {e}")

    def verify(self, f: RemoteFile, local: Path) -> bool:
        """fsspec listings carry no checksum we can recompute cheaply everywhere: fetch again."""
        return False

    def start(self, f: RemoteFile, tmp: Path, on_bytes: OnBytes, on_done: OnDone) -> None:
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="tfnb-stage")

        def done(fut) -> None:
            on_done(StagingError("cancelled") if fut.cancelled() else fut.exception())

        self._pool.submit(self._copy, f, tmp, on_bytes).add_done_callback(done)

    def _copy(self, f: RemoteFile, tmp: Path, on_bytes: OnBytes) -> None:
        from fsspec.callbacks import Callback

        class Progress(Callback):
            reported = 0

            def call(self, *args, **kwargs):
                if self.value > self.reported:
                    on_bytes(self.value - self.reported)
                    self.reported = self.value

        self.fs.get_file(f.key, str(tmp), callback=Progress())

    def close(self, cancel: bool) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=cancel)
            self._pool = None


def _fsspec_version(info: Mapping[str, Any]) -> str:
    for k in ("ETag", "etag", "md5Hash", "md5", "crc32c", "checksum"):
        if info.get(k):
            return str(info[k]).strip('"')
    for k in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        if info.get(k) is not None:
            return f"{k}={info[k]}"
    return ""


def _open_source(url: str, *, endpoint_url, concurrency, chunk_size, options):
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in _S3_SCHEMES:
        endpoint = (setting("s3_endpoint_url", endpoint_url, None, cast=str)
                    or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
                    or None)
        return _S3Source(url, endpoint_url=endpoint, concurrency=concurrency, chunk_size=chunk_size,
                         options=options)
    if scheme == "dbfs" and os.path.isdir("/dbfs"):
        # On Databricks the DBFS FUSE mount reads dbfs:/x as the local file /dbfs/x.
        url = "/dbfs/" + url.split(":", 1)[1].lstrip("/")
    return _FsspecSource(url, concurrency=concurrency, options=options)


def _code(e) -> str:
    return str(e.response.get("Error", {}).get("Code") or
               e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


# ---------------------------------------------------------------- local files


def _local(dest: Path, rel: str) -> Path:
    return dest.joinpath(*rel.split("/"))


def _same_size(local: Path, size: int) -> bool:
    try:
        return local.stat().st_size == size
    except OSError:
        return False


def _md5(path: Path) -> str:
    import hashlib

    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _part(local: Path) -> Path:
    return local.with_name(f".{local.name}{PART_SUFFIX}")


def _remove_leftovers(locals_: Sequence[Path]) -> None:
    """Delete temp files a killed run left for these files (only these: other shards may be live)."""
    wanted: dict[Path, set[str]] = {}
    for p in locals_:
        wanted.setdefault(p.parent, set()).add(_part(p).name)
    for folder, names in wanted.items():
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        for entry in entries:
            n = entry.name
            if n.startswith(".") and PART_SUFFIX in n:
                # s3transfer writes NAME.RANDOM8 before renaming to NAME
                base = n[:n.index(PART_SUFFIX) + len(PART_SUFFIX)]
                if base in names:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)


def _check_space(dest: Path, todo: Sequence[RemoteFile], url: str, index: int, count: int) -> None:
    need = sum(f.size for f in todo)
    free = shutil.disk_usage(dest).free
    if need > free:
        raise StagingError(
            f"shard {index}/{count} of {url} needs {need} bytes ({_human(need)}, {len(todo)} files) "
            f"in {dest} but only {free} bytes ({_human(free)}) are free; free space there, pick a "
            "dest_dir on a bigger disk, or spread the data over more workers (count)")


# ---------------------------------------------------------------- the entry point


def stage(src_url: str, dest_dir: str | os.PathLike, *, index: int = 0, count: int = 1,
          endpoint_url: str | None = None, concurrency: int | None = None,
          chunk_size: int | None = None, storage_options: Mapping[str, Any] | None = None,
          progress: bool = False, callback: Callable[[StageProgress], None] | None = None
          ) -> StageResult:
    """Copy shard ``index`` of ``count`` of the files under ``src_url`` into ``dest_dir``.

    Files already complete in ``dest_dir`` (same source, size and ETag/checksum, per the manifest) are
    skipped, so a rerun after a failure or kill fetches only what is missing.

    Args:
        src_url: ``s3://bucket/prefix`` (or ``s3a://``, ``s3n://``), any fsspec URL (``file://``,
            ``gs://`` with gcsfs installed), or a local path such as ``/dbfs/data``. A URL naming a
            single object stages that object.
        dest_dir: local directory; created if missing. Paths below the prefix are kept below it.
        index: this worker's shard, usually ``ctx.task_index``.
        count: number of shards, usually ``ctx.num_workers``; 1 stages everything.
        endpoint_url: S3-compatible server (MinIO, Ceph, rclone, ...). Env: TFNB_S3_ENDPOINT_URL,
            then AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL.
        concurrency: S3 GETs in flight at once, for small objects and for the parts of big ones
            each; fsspec file copies at once. Default 16. Env: TFNB_STAGE_CONCURRENCY.
        chunk_size: objects larger than this are fetched as parallel ranged GETs of this size;
            smaller ones with one GET. Default 8 MiB, at least 1 MiB. Env: TFNB_STAGE_CHUNK_SIZE
            (bytes).
        storage_options: for S3, extra ``boto3.client("s3", ...)`` keywords (``region_name``,
            ``aws_access_key_id``, ``config``, ...); for fsspec URLs, the filesystem's options.
            Never logged.
        progress: show a tqdm bar on stderr.
        callback: called with a :class:`StageProgress` at the start, at most every 0.25 s while
            downloading, and at the end, always from the calling thread.

    Returns:
        A :class:`StageResult`: the shard's files and bytes, what was downloaded or skipped, seconds,
        MB/s, and the local paths.

    Raises:
        ConfigError: bad ``index``/``count``/``concurrency``/``chunk_size``, or a scheme that no
            backend handles.
        MissingDependencyError: boto3 (for S3), fsspec, or the fsspec backend is not installed.
        StagingError: no credentials, bucket missing, access denied, no files under the URL,
            not enough free disk space, or a download failed; the message names the URL and the fix.

    Example:
        >>> def train_fn(ctx):
        ...     import tensorflow as tf
        ...     staged = tfnb.stage("s3://bucket/train/", "/local_disk0/train",
        ...                         index=ctx.task_index, count=ctx.num_workers)
        ...     ds = tf.data.TFRecordDataset(list(staged.paths))
        ...     ...
    """
    start = time.monotonic()
    _check_shard_args(index, count)
    if not isinstance(src_url, str) or not src_url:
        raise ConfigError(f"src_url={src_url!r} but it must be a non-empty URL or path, e.g. "
                          "'s3://bucket/prefix' or '/dbfs/data'")
    concurrency = setting("stage_concurrency", concurrency, _DEFAULT_CONCURRENCY)
    chunk_size = setting("stage_chunk_size", chunk_size, _DEFAULT_CHUNK)
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise ConfigError(f"concurrency={concurrency!r} but it must be an int >= 1 "
                          "(TFNB_STAGE_CONCURRENCY); e.g. 16")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1024 * 1024:
        raise ConfigError(f"chunk_size={chunk_size!r} but it must be an int of at least 1 MiB "
                          "(TFNB_STAGE_CHUNK_SIZE, in bytes); e.g. 8388608")
    if not isinstance(dest_dir, (str, os.PathLike)) or not os.fspath(dest_dir):
        raise ConfigError(f"dest_dir={dest_dir!r} but it must be a local folder path, e.g. '/local_disk0/train'")
    dest = Path(os.fspath(dest_dir)).expanduser().absolute()

    source = _open_source(src_url, endpoint_url=endpoint_url, concurrency=concurrency,
                          chunk_size=chunk_size, options=dict(storage_options or {}))
    listing = source.list()
    if not listing:
        raise source.empty_error()
    mine = assign_shard(listing, index, count)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StagingError(f"cannot create dest_dir {dest} ({e}); pick a writable local folder") from e
    manifest = _Manifest(dest)
    todo = []
    for f in mine:
        local = _local(dest, f.rel)
        if manifest.is_complete(f, local):
            continue
        if source.verify(f, local):
            manifest.record(f, local.stat())
        else:
            todo.append(f)
    manifest.flush()
    _remove_leftovers([_local(dest, f.rel) for f in todo])
    _check_space(dest, todo, src_url, index, count)
    log.info("staging shard %d/%d of %s into %s: %d files, %d to download (%s)", index, count,
             src_url, dest, len(mine), len(todo), _human(sum(f.size for f in todo)))

    _download(source, todo, dest, manifest, progress=progress, callback=callback,
              label=f"stage {index}/{count}")
    seconds = max(time.monotonic() - start, 1e-9)
    got = sum(f.size for f in todo)
    result = StageResult(
        src_url=src_url, dest_dir=str(dest), index=index, count=count, files=len(mine),
        bytes=sum(f.size for f in mine), downloaded_files=len(todo), downloaded_bytes=got,
        skipped_files=len(mine) - len(todo), seconds=seconds, mb_per_s=got / seconds / 1e6,
        paths=tuple(str(_local(dest, f.rel)) for f in mine))
    log.info("%s", result.summary())
    return result


def _download(source, todo: Sequence[RemoteFile], dest: Path, manifest: _Manifest, *,
              progress: bool, callback: Callable[[StageProgress], None] | None, label: str) -> None:
    """Fetch ``todo`` with a bounded number of files in flight; rename and record each when whole.

    Backend threads only post events to a queue; this thread does every rename, manifest update and
    callback, so none of that state is shared.
    """
    total = sum(f.size for f in todo)
    events: queue.SimpleQueue = queue.SimpleQueue()
    waiting = deque(todo)
    inflight: dict[str, RemoteFile] = {}
    got: dict[str, int] = {}
    files_done = bytes_done = 0
    window = max(8, 2 * source.concurrency)
    bar = None
    if progress and todo:
        bar = require("tqdm", "a staging progress bar").tqdm(
            total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label, file=sys.stderr)
    last_call = 0.0

    def report(force: bool = False) -> None:
        nonlocal last_call
        now = time.monotonic()
        if callback is not None and (force or now - last_call >= _CALLBACK_INTERVAL):
            last_call = now
            callback(StageProgress(files_done, len(todo), bytes_done, total))

    def launch() -> None:
        f = waiting.popleft()
        local = _local(dest, f.rel)
        local.parent.mkdir(parents=True, exist_ok=True)
        inflight[f.rel] = f
        got[f.rel] = 0
        source.start(f, _part(local),
                     lambda n, rel=f.rel: events.put(("bytes", rel, n)),
                     lambda exc, rel=f.rel: events.put(("done", rel, exc)))

    ok = False
    try:
        while waiting and len(inflight) < window:
            launch()
        report(force=True)
        while inflight:
            kind, rel, value = events.get()
            f = inflight.get(rel)
            if f is None:  # a straggling progress report of a file already finished
                continue
            if kind == "bytes":
                n = min(value, f.size - got[rel])
                got[rel] += n
            else:
                del inflight[rel]
                if value is not None:
                    err = source.error(value, f.url, "downloading")
                    if err is value:
                        raise value
                    raise err from value
                local = _local(dest, rel)
                part = _part(local)
                size = part.stat().st_size
                if size != f.size:
                    raise StagingError(f"{f.url} arrived with {size} bytes but was listed with "
                                       f"{f.size}; it changed while staging, run stage again")
                os.replace(part, local)
                manifest.record(f, local.stat())
                n = f.size - got[rel]
                files_done += 1
                if waiting:
                    launch()
            bytes_done += n
            if bar is not None and n:
                bar.update(n)
            report(force=kind == "done" and not inflight)
        ok = True
    except OSError as e:
        raise StagingError(f"writing into {dest} failed: {e}; check the folder and free space") from e
    finally:
        if not ok:
            source.close(cancel=True)
            _remove_leftovers([_local(dest, rel) for rel in inflight])
        else:
            source.close(cancel=False)
        manifest.flush()
        if bar is not None:
            bar.close()


# ---------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tfnb.staging SRC DEST [--index I --count N ...]``; a tqdm bar when on a terminal.

    Example:
        $ python -m tfnb.staging s3://bucket/train/ /local_disk0/train --index 0 --count 2
    """
    import argparse

    p = argparse.ArgumentParser(prog="python -m tfnb.staging",
                                description="Copy one shard of the files under SRC into DEST.")
    p.add_argument("src_url")
    p.add_argument("dest_dir")
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--endpoint-url", default=None)
    p.add_argument("--concurrency", type=int, default=None)
    p.add_argument("--chunk-size", type=int, default=None, help="bytes")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="tqdm bar (default: when stderr is a terminal)")
    a = p.parse_args(argv)
    show = sys.stderr.isatty() if a.progress is None else a.progress
    try:
        result = stage(a.src_url, a.dest_dir, index=a.index, count=a.count,
                       endpoint_url=a.endpoint_url, concurrency=a.concurrency,
                       chunk_size=a.chunk_size, progress=show)
    except (StagingError, ConfigError, MissingDependencyError) as e:
        print(f"tfnb stage: {e}", file=sys.stderr)
        return 1
    print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
