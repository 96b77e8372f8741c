"""``s3://`` through boto3 and s3transfer (s3fs is not used: it pins an old botocore).

With the ``s3-native`` extra (obstore, Rust's object_store) a store lists and downloads through it:
no botocore client to build (~0.1 CPU-s per process), and a fraction of boto3's CPU per request, which
is what limits many small objects on a worker's few cores. boto3 still resolves the credentials (the
same chain: options, environment, profile, instance role), does every other operation, and names
every failure: a native listing or download that fails is repeated through boto3. Options only
botocore understands (``config``, ``client_kwargs``) or TFNB_S3_NATIVE=0 keep a store on boto3.

obstore does not follow S3's redirect to a bucket's region as botocore does: a native store that is
answered "wrong region" asks the bucket's region once (``x-amz-bucket-region``) and carries on in it.
"""
from __future__ import annotations

import datetime
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Mapping

from .._config import setting
from .._deps import require
from ..errors import ConfigError, StorageError
from .base import S3_OPTIONS, Entry, MissingError, Store, check_cancel, guarded, is_temp, landing

_IO_CHUNK = 1 << 20        # s3transfer's write unit; its 256 KiB default costs more CPU
_IO_QUEUE = 128            # chunks waiting for the disk: bounds memory to 128 MiB per store
_GET_ATTEMPTS = 5          # as s3transfer's num_download_attempts
_CREDENTIAL_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
                               "ExpiredToken", "InvalidClientTokenId", "TokenRefreshRequired"})
_DENIED_CODES = frozenset({"AccessDenied", "AllAccessDisabled", "403", "Forbidden"})
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
# the options a native store can honour exactly; any other keeps the store on boto3
_NATIVE_OPTIONS = frozenset({"aws_access_key_id", "aws_secret_access_key", "aws_session_token", "region_name",
                             "endpoint_url", "profile", "anon"})
_CREDENTIAL_TTL = 300      # seconds a native store keeps credentials before asking botocore again
_REDIRECT_CODES = frozenset({"PermanentRedirect", "301", "AuthorizationHeaderMalformed"})  # wrong region
# obstore's words for S3's answers to a request signed for the wrong region (its 301 carries no Location)
_MOVED_WORDS = ("incorrectly configured region", "PermanentRedirect", "AuthorizationHeaderMalformed")

log = logging.getLogger(__name__)


def endpoint_url(explicit: str | None = None) -> str | None:
    """``endpoint_url=`` > TFNB_S3_ENDPOINT_URL > AWS_ENDPOINT_URL_S3 > AWS_ENDPOINT_URL > AWS's own."""
    return (setting("s3_endpoint_url", explicit, None, cast=str) or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL") or None)


def s3_client(url: str, options: Mapping[str, Any], purpose: str, pool: int = 10):
    """The one S3 client factory: (client, endpoint) from tfnb's option vocabulary."""
    boto3 = require("boto3", f"{purpose} {url}")
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ProfileNotFound

    config = Config(max_pool_connections=pool, retries={"mode": "standard", "max_attempts": 5})
    kwargs: dict[str, Any] = {}
    for key, value in options.items():
        name = S3_OPTIONS.get(key, key)
        if name not in S3_OPTIONS.values():
            raise ConfigError(f"storage option {key!r} is not understood for {url}; use key, secret, token, "
                              "endpoint_url, region, profile, anon or config (see docs/data.md, 'Storage URLs "
                              "and options')")
        if name == "client_kwargs":
            value = dict(value)
            if "config" in value:
                config = config.merge(value.pop("config"))
            kwargs.update(value)
        elif name == "config":
            config = config.merge(value if isinstance(value, Config) else Config(**value))
        else:
            kwargs[name] = value
    if kwargs.pop("anon", False):
        config = config.merge(Config(signature_version=UNSIGNED))
    profile = kwargs.pop("profile", None)
    endpoint = endpoint_url(kwargs.pop("endpoint_url", None))
    try:
        session = boto3.session.Session(botocore_session=_botocore_session(), profile_name=profile)
        client = session.client("s3", endpoint_url=endpoint, config=config, **kwargs)
    except ProfileNotFound as e:
        raise ConfigError(f"AWS profile {profile!r} for {url} does not exist ({e}); fix profile= or "
                          "AWS_PROFILE") from e
    except (TypeError, ValueError) as e:
        raise ConfigError(f"cannot make an S3 client for {url} ({e}); check endpoint_url (now {endpoint!r}) "
                          "and the storage options") from e
    client.meta.events.register("before-call.s3.GetObject", _no_range_checksum)
    return client, endpoint


_LOADER: list = []


def _botocore_session():
    """A fresh botocore session (credentials and profile read anew) sharing one data loader. A new session parses
    botocore's endpoint and S3 service JSON again: ~0.1 CPU-s per client, a third of the CPU of a repeated ``stage``
    of 128 x 1 MiB. The loader caches those files and holds no credentials."""
    import botocore.session

    session = botocore.session.get_session()
    if not _LOADER:
        _LOADER.append(session.get_component("data_loader"))
    session.register_component("data_loader", _LOADER[0])
    return session


def _no_range_checksum(params, **kwargs) -> None:
    """Skip response-checksum validation of ranged GETs only. AWS sends no whole-object checksum with a range, but
    some S3-compatible servers (``rclone serve s3``) send the whole object's, which botocore then checks against the
    part and fails. Whole-object GETs keep their validation; ranged ones are checked for size and guarded by
    If-Match."""
    if "Range" in params.get("headers", {}):
        params.get("context", {}).get("checksum", {}).pop("response_algorithms", None)


def _code(e) -> str:
    return str(e.response.get("Error", {}).get("Code") or
               e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


class S3Store(Store):
    def __init__(self, url: str, options: Mapping[str, Any], purpose: str, concurrency: int, chunk_size: int):
        bucket, _, prefix = url[len("s3://"):].partition("/")
        if not bucket:
            raise ConfigError(f"{url!r} names no bucket; use s3://BUCKET/PREFIX")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.root = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.concurrency, self.chunk_size = concurrency, chunk_size
        self._url, self._options, self._purpose = url, options, purpose
        self._client = self._manager = self._parts = None
        self._lock = threading.RLock()
        self.native = _native_store(bucket, options)
        self.ranges: bool | None = None  # does the server answer a range with 206, as obstore requires?
        self._probe = threading.Lock()
        if self.native is None:
            self.client  # noqa: B018 - built now: bad options fail here, as they always have
        self.endpoint = endpoint_url(options.get("endpoint_url"))

    @property
    def client(self):
        """The boto3 client, built on first use (a native store may never need it)."""
        with self._lock:
            if self._client is None:
                # small objects (callers' threads) and big ones (s3transfer) may each have
                # `concurrency` in flight
                self._client, _ = s3_client(self._url, self._options, self._purpose,
                                            pool=2 * self.concurrency + 4)
            return self._client

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix and rel else self.prefix or rel

    def error(self, e: BaseException, url: str, doing: str) -> StorageError:
        from botocore.exceptions import (ClientError, ConnectionError, NoCredentialsError,
                                         PartialCredentialsError)

        where = f" at {self.endpoint}" if self.endpoint else ""
        if isinstance(e, (NoCredentialsError, PartialCredentialsError)):
            return StorageError(
                f"no AWS credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
                "AWS_PROFILE), attach an instance profile, or pass storage_options={'key': ..., 'secret': ...}")
        if isinstance(e, ConnectionError):
            return StorageError(
                f"cannot connect to the S3 endpoint for {url} ({self.endpoint or 'AWS'}); check endpoint_url and "
                f"that the server is reachable\n{type(e).__name__}: {e}\nThe endpoint is storage_options' "
                "endpoint_url, else TFNB_S3_ENDPOINT_URL, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, else AWS's own.")
        if not isinstance(e, ClientError):
            return StorageError(f"{doing} {url}{where} failed: {type(e).__name__}: {e}")
        code = _code(e)
        msg = e.response.get("Error", {}).get("Message") or code
        if code == "NoSuchBucket":
            return StorageError(f"bucket {self.bucket!r} does not exist{where} ({url}); check the bucket "
                                "name in the URL and the endpoint_url")
        if code in _CREDENTIAL_CODES:
            return StorageError(f"the S3 server{where} rejected the credentials for {url} ({code}: {msg}); "
                                "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) or "
                                "the profile")
        if code in _DENIED_CODES:
            return StorageError(f"access denied {doing} {url}{where}; grant these credentials s3:ListBucket on "
                                f"bucket {self.bucket!r} and s3:GetObject on the prefix, or use others\n"
                                "Writing needs s3:PutObject and s3:DeleteObject too.")
        if code in _REDIRECT_CODES:
            region = _bucket_region(e.response) or "another region"
            return StorageError(
                f"bucket {self.bucket!r} is in {region}, not {self.client.meta.region_name}; set the bucket's "
                f"region: storage_options={{'region': ...}} or AWS_DEFAULT_REGION\n"
                f"The S3 server{where} did not let the request follow it ({code}).")
        if code in ("PreconditionFailed", "412"):
            return StorageError(f"{url} changed while {doing} it; run again")
        if code in _MISSING_CODES:
            return MissingError(f"{doing} {url}{where} failed: it does not exist; check the URL")
        return StorageError(f"{doing} {url}{where} failed: {code}: {msg}")

    @guarded("listing")
    def list(self, rel: str = "", recursive: bool = True) -> dict[str, Entry]:
        base = self._key(rel)
        base = base + "/" if base else ""
        native = self.native
        while native is not None and recursive:
            try:
                return self._list_native(native, base)
            except Exception as e:   # noqa: BLE001 - boto3 below lists again and names the failure
                native = self._native_failed(native, e)
        args = {"Bucket": self.bucket, "Prefix": base, **({} if recursive else {"Delimiter": "/"})}
        out: dict[str, Entry] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(**args):
            for obj in page.get("Contents", ()):
                sub = obj["Key"][len(base):]
                if sub and not sub.endswith("/") and not is_temp(sub):
                    out[sub] = Entry(sub, int(obj["Size"]), obj["LastModified"].timestamp(),
                                     str(obj.get("ETag", "")).strip('"'))
        return out

    def _list_native(self, native, base: str) -> dict[str, Entry]:
        import obstore

        out: dict[str, Entry] = {}
        for page in obstore.list(native, base.rstrip("/") or None, chunk_size=1000):
            for obj in page:
                sub = obj["path"][len(base):]
                if sub and not sub.endswith("/") and not is_temp(sub):
                    out[sub] = Entry(sub, int(obj["size"]), obj["last_modified"].timestamp(),
                                     (obj.get("e_tag") or "").strip('"'))
        return out

    @guarded("reading")
    def stat(self, rel: str = "") -> Entry | None:
        from botocore.exceptions import ClientError

        if not self._key(rel):
            return None
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(rel))
        except ClientError as e:
            if _code(e) in _MISSING_CODES:
                return None
            raise
        return Entry(rel, int(head["ContentLength"]), head["LastModified"].timestamp(),
                     str(head.get("ETag", "")).strip('"'))

    @guarded("reading")
    def read(self, rel: str = "", offset: int = 0, length: int | None = None) -> bytes:
        if length == 0:
            return b""
        args = {"Bucket": self.bucket, "Key": self._key(rel)}
        if offset or length is not None:
            args["Range"] = f"bytes={offset}-" + ("" if length is None else str(offset + length - 1))
        resp = self.client.get_object(**args)
        body = resp["Body"].read()
        if len(body) != resp.get("ContentLength", len(body)):
            # a server rewriting the object while it sends it (rclone's local backend does) must not
            # hand back a mix of two versions as one
            raise StorageError(f"{self.url(rel)} changed while it was read ({len(body)} of "
                               f"{resp['ContentLength']} bytes); read it again")
        return body

    @guarded("downloading")
    def get(self, rel, local_path, *, size=None, version=None, on_bytes=None, cancel=None, whole=False) -> None:
        on_bytes = on_bytes or (lambda n: None)
        split = size is not None and size > self.chunk_size and not whole
        with landing(self.url(rel), local_path, size) as tmp:
            native = self.native
            while native is not None and size is not None:
                sent = []
                try:
                    return self._get_native(native, rel, tmp, size, version,
                                            lambda n: (sent.append(n), on_bytes(n)), cancel, split)
                except StorageError:
                    raise
                except Exception as e:   # noqa: BLE001 - boto3 fetches it again and names any failure
                    on_bytes(-sum(sent))
                    native = self._native_failed(native, e)
            if split:
                self._get_big(rel, tmp, size, version, on_bytes, cancel)
            else:
                self._get_small(rel, tmp, version, on_bytes, cancel)

    def _native_failed(self, native, e: Exception):
        """The native store to try again with after ``native`` failed with ``e``, or None for boto3. A bucket
        outside the configured region (obstore cannot follow S3's redirect) gets a native store in the bucket's
        region, once; any other failure moves the store to boto3 for good: one failure must not cost one per
        file."""
        with self._lock:
            if self.native is not native:   # another thread has decided already
                return self.native
            moved = None
            if any(word in str(e) for word in _MOVED_WORDS):
                region, was = self._region(), native.config.get("region")
                if region and region != was:
                    log.info("S3 bucket %r is in %s, not %s; set storage_options={'region': %r} or "
                             "AWS_DEFAULT_REGION to spare this look-up", self.bucket, region, was, region)
                    moved = _native_store(self.bucket, self._options, region)
            self.native = moved
            return moved

    def _region(self) -> str | None:
        """The bucket's region as the server names it (HeadBucket's ``x-amz-bucket-region``), or None."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return _bucket_region(self.client.head_bucket(Bucket=self.bucket))
        except ClientError as e:   # a refused HEAD names the region too (real S3 does, on 301 and 403)
            return _bucket_region(e.response)
        except BotoCoreError:
            return None

    def _get_native(self, native, rel, tmp, size, version, on_bytes, cancel, split: bool) -> None:
        """``size`` bytes into ``tmp``: one GET unless ``split`` (or when the server cannot answer
        ranges), else ranged GETs of ``chunk_size`` on the store's part threads (``concurrency`` of
        them, shared by every file)."""
        import obstore
        from obstore.exceptions import PreconditionError

        url = self.url(rel)
        options = {"if_match": f'"{version}"'} if version else {}

        def part(fh, start: int, end: int) -> None:
            try:
                got = obstore.get(native, self._key(rel), options=dict(options, range=(start, end))
                                  if end - start < size else options)
            except PreconditionError as e:
                raise StorageError(f"{url} changed since it was listed; run again") from e
            etag = (got.meta.get("e_tag") or "").strip('"')
            if version and etag != version:   # servers that ignore If-Match
                raise StorageError(f"{url} changed since it was listed; run again")
            at = start
            for block in got.stream(min_chunk_size=_IO_CHUNK):
                check_cancel(cancel, url)
                view = memoryview(block)
                while view:
                    n = os.pwrite(fh, view, at)
                    at, view = at + n, view[n:]
                on_bytes(len(block))

        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            first = 0
            if split and self.ranges is None:
                # the first big file finds out alone, so the others spend no request on it
                with self._probe:
                    if self.ranges is None:
                        try:
                            part(fd, 0, self.chunk_size)
                            self.ranges, first = True, self.chunk_size
                        except Exception as e:   # noqa: BLE001
                            if "NotPartial" not in str(e):
                                raise
                            self.ranges = False   # 200 to a range (rclone): one GET per object
            if not split or not self.ranges:
                part(fd, 0, size)
                return
            with self._lock:
                if self._parts is None:
                    self._parts = ThreadPoolExecutor(self.concurrency, thread_name_prefix="tfnb-s3-part")
            futures = [self._parts.submit(part, fd, start, min(start + self.chunk_size, size))
                       for start in range(first, size, self.chunk_size)]
            try:
                for f in futures:
                    f.result()
            finally:
                for f in futures:
                    f.cancel()
                wait(futures)
        finally:
            os.close(fd)

    def _get_small(self, rel, tmp, version, on_bytes, cancel) -> None:
        # One GET: s3transfer's per-transfer machinery costs about as much CPU as the request itself.
        from s3transfer.utils import S3_RETRYABLE_DOWNLOAD_ERRORS

        url = self.url(rel)
        extra = {"IfMatch": f'"{version}"'} if version else {}
        for attempt in range(_GET_ATTEMPTS):
            written = 0
            try:
                resp = self.client.get_object(Bucket=self.bucket, Key=self._key(rel), **extra)
                if version and resp.get("ETag", "").strip('"') != version:   # servers that ignore If-Match
                    raise StorageError(f"{url} changed since it was listed; run again")
                with open(tmp, "wb") as fh:
                    for block in resp["Body"].iter_chunks(_IO_CHUNK):
                        check_cancel(cancel, url)
                        fh.write(block)
                        written += len(block)
                        on_bytes(len(block))
                return
            except S3_RETRYABLE_DOWNLOAD_ERRORS:
                # botocore retries the request but not a body cut short; start the object again
                on_bytes(-written)
                if attempt + 1 == _GET_ATTEMPTS or (cancel is not None and cancel.is_set()):
                    raise

    def _get_big(self, rel, tmp, size, version, on_bytes, cancel) -> None:
        from s3transfer.subscribers import BaseSubscriber

        with self._lock:
            if self._manager is None:
                from s3transfer.manager import TransferConfig, TransferManager

                self._manager = TransferManager(self.client, TransferConfig(
                    multipart_threshold=self.chunk_size, multipart_chunksize=self.chunk_size,
                    max_request_concurrency=self.concurrency, io_chunksize=_IO_CHUNK,
                    max_io_queue_size=_IO_QUEUE))
        done = threading.Event()

        class Subscriber(BaseSubscriber):
            def on_queued(self, future, **kwargs):
                # size and ETag from the listing spare a HEAD, and the ETag makes every ranged GET
                # conditional (If-Match): an object replaced mid-download fails instead of mixing
                future.meta.provide_transfer_size(size)
                if version:
                    future.meta.provide_object_etag(f'"{version}"')

            def on_progress(self, future, bytes_transferred, **kwargs):
                on_bytes(bytes_transferred)

            def on_done(self, future, **kwargs):
                done.set()

        future = self._manager.download(self.bucket, self._key(rel), tmp, subscribers=[Subscriber()])
        while not done.wait(0.2):
            if cancel is not None and cancel.is_set():
                future.cancel()
        future.result()

    @guarded("uploading to")
    def put(self, rel: str, local_path: str = "") -> None:
        self.client.upload_file(local_path, self.bucket, self._key(rel))  # visible only when complete

    @guarded("writing")
    def write(self, rel: str, data: bytes = b"") -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(rel), Body=data)  # a PUT is atomic

    @guarded("deleting")
    def delete(self, rel: str = "") -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(rel))

    def close(self) -> None:
        with self._lock:
            manager, self._manager = self._manager, None
            parts, self._parts = self._parts, None
        if manager is not None:
            manager.shutdown()
        if parts is not None:
            parts.shutdown(wait=True, cancel_futures=True)


def _bucket_region(response: Mapping) -> str | None:
    """The region an S3 response names for its bucket (header on any answer, or a redirect's body)."""
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    return headers.get("x-amz-bucket-region") or response.get("Error", {}).get("Region") or None


def _native_store(bucket: str, options: Mapping[str, Any], region: str | None = None):
    """An obstore S3Store for ``bucket`` with boto3's credentials, or None to stay on boto3. ``region`` (the
    bucket's own, once known) overrides the configured one. None when TFNB_S3_NATIVE=0, obstore is not installed, an
    option is one only botocore understands, or botocore finds no credentials (boto3 then says what to set)."""
    if not setting("s3_native", None, True):
        return None
    given = {S3_OPTIONS.get(k, k): v for k, v in options.items()}
    if not set(given) <= _NATIVE_OPTIONS:
        return None
    try:
        from obstore.store import S3Store as NativeStore
    except ImportError:
        return None
    try:
        session = _botocore_session()
        if given.get("profile"):
            session.set_config_variable("profile", given["profile"])
        region = region or given.get("region_name") or session.get_config_variable("region") or "us-east-1"
        endpoint = endpoint_url(given.get("endpoint_url"))
        config: dict[str, Any] = {"region": region, **({"endpoint": endpoint} if endpoint else {})}
        provider = None
        if given.get("anon"):
            config["skip_signature"] = True
        elif given.get("aws_access_key_id") or given.get("aws_secret_access_key"):
            if not (given.get("aws_access_key_id") and given.get("aws_secret_access_key")):
                return None   # boto3 reports the half-given pair
            config.update(access_key_id=given["aws_access_key_id"],
                          secret_access_key=given["aws_secret_access_key"],
                          **({"token": given["aws_session_token"]} if given.get("aws_session_token") else {}))
        else:
            credentials = session.get_credentials()
            if credentials is None:
                return None
            provider = _CredentialProvider(credentials)
        return NativeStore(bucket, config=config, credential_provider=provider,
                           client_options={"allow_http": bool(endpoint and endpoint.startswith("http://")),
                                           "timeout": "600s", "connect_timeout": "10s"},
                           retry_config={"max_retries": _GET_ATTEMPTS - 1,
                                         "retry_timeout": datetime.timedelta(seconds=60)})
    except Exception:  # noqa: BLE001 - a profile or config boto3 reads differently: boto3 handles it
        return None


class _CredentialProvider:
    """botocore's credentials (refreshed as botocore refreshes them) for obstore; never logged."""

    def __init__(self, credentials):
        self.credentials = credentials

    def __call__(self) -> dict:
        frozen = self.credentials.get_frozen_credentials()
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key,
                "token": frozen.token, "expires_at": datetime.datetime.now(datetime.timezone.utc)
                + datetime.timedelta(seconds=_CREDENTIAL_TTL)}

    def __repr__(self) -> str:
        return "_CredentialProvider(<hidden>)"
