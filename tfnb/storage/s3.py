"""``s3://`` through boto3 (not s3fs: it pins an old botocore), and obstore (``s3-native`` extra) to list and download
(bench/staging.py, 2 cores: 0.98-1.61 x s5cmd; boto3 alone 0.47-0.86 x) unless TFNB_S3_NATIVE=0, options only botocore
knows, no credentials or keys obstore cannot name ('', '.', '..' parts). A failed call is not repeated through the
other client; a "wrong region" answer (obstore does not follow it) asks for the region once and goes on there."""
from __future__ import annotations

import datetime
import logging
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Mapping

from .._config import setting
from .._deps import require
from ..errors import ConfigError, StorageError
from .base import PART, S3_OPTIONS, Entry, MissingError, Store, check_cancel, guarded, replacing

_IO_CHUNK = 1 << 20        # bytes per write: smaller blocks cost more CPU per byte
_GET_ATTEMPTS = 5          # tries of one body, as s3transfer's num_download_attempts
_CREDENTIAL_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
                               "ExpiredToken", "InvalidClientTokenId", "TokenRefreshRequired"})
_DENIED_CODES = frozenset({"AccessDenied", "AllAccessDisabled", "403", "Forbidden"})
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_REDIRECT_CODES = frozenset({"PermanentRedirect", "301", "AuthorizationHeaderMalformed"})  # wrong region
# the options obstore honours exactly; any other keeps the store on boto3
_NATIVE_OPTIONS = frozenset({"aws_access_key_id", "aws_secret_access_key", "aws_session_token", "region_name",
                             "endpoint_url", "profile", "anon"})
_CREDENTIAL_TTL = 300      # seconds obstore keeps credentials before asking botocore again
# obstore's words for S3's answers to a request signed for the wrong region (its 301 carries no Location)
_MOVED_WORDS = ("incorrectly configured region", "PermanentRedirect", "AuthorizationHeaderMalformed")
# an obstore failure's text: S3's error document, else the HTTP status; its debug dump follows a blank line
_NATIVE_CODE = (re.compile(r"<Code>([^<]+)</Code>"), re.compile(r"status code: (\d{3})"))
_NATIVE_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")

log = logging.getLogger(__name__)


def endpoint_url(explicit: str | None = None) -> str | None:
    """``endpoint_url=`` > TFNB_S3_ENDPOINT_URL > AWS_ENDPOINT_URL_S3 > AWS_ENDPOINT_URL > AWS's own."""
    return (setting("s3_endpoint_url", explicit, None, cast=str) or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL") or None)


def _boto3_client(url: str, options: Mapping[str, Any], purpose: str, pool: int):
    """The boto3 S3 client for tfnb's option vocabulary (:data:`S3_OPTIONS`)."""
    boto3 = require("boto3", f"{purpose} {url}")
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ProfileNotFound

    given = {S3_OPTIONS.get(k, k): v for k, v in options.items()}
    if unknown := sorted(set(given) - set(S3_OPTIONS.values())):
        raise ConfigError(f"storage option {unknown[0]!r} is not understood for {url}; use key, secret, token, "
                          "endpoint_url, region, profile, anon or config (see docs/data.md, 'Storage URLs "
                          "and options')")
    kwargs = dict(given.pop("client_kwargs", None) or {})   # s3fs's spelling: endpoint_url, region_name, config
    config = Config(max_pool_connections=pool, retries={"mode": "standard", "max_attempts": 5})
    for extra in (kwargs.pop("config", None), given.pop("config", None)):
        if extra is not None:
            config = config.merge(extra if isinstance(extra, Config) else Config(**extra))
    kwargs.update(given)
    if kwargs.pop("anon", False):
        config = config.merge(Config(signature_version=UNSIGNED))
    profile = kwargs.pop("profile", None)
    endpoint = endpoint_url(kwargs.pop("endpoint_url", None))
    try:
        session = boto3.session.Session(botocore_session=_botocore_session(), profile_name=profile)
        client = session.client("s3", endpoint_url=endpoint, config=config, **kwargs)
    except ProfileNotFound as e:
        raise ConfigError(f"AWS profile {profile!r} for {url} does not exist ({e}); fix profile= or AWS_PROFILE") from e
    except (TypeError, ValueError) as e:
        raise ConfigError(f"cannot make an S3 client for {url} ({e}); check endpoint_url (now {endpoint!r}) "
                          "and the storage options") from e
    client.meta.events.register("before-call.s3.GetObject", _no_range_checksum)
    return client


_LOADER: dict = {}


def _botocore_session():
    """A fresh botocore session (credentials read anew) sharing one data loader, which holds no credentials: a new
    one parses botocore's JSON again, ~0.1 CPU-s per client (a third of a repeated ``stage`` of 128 x 1 MiB)."""
    import botocore.session

    session = botocore.session.get_session()
    session.register_component("data_loader", _LOADER.setdefault("", session.get_component("data_loader")))
    return session


def _no_range_checksum(params, **kwargs) -> None:
    """No checksum validation of a ranged GET: some servers (``rclone serve s3``) send the whole object's checksum,
    which fails against the part. Parts are checked for size and guarded by If-Match."""
    if "Range" in params.get("headers", {}):
        params.get("context", {}).get("checksum", {}).pop("response_algorithms", None)


def _classified(e: BaseException) -> tuple[str, str]:
    """(S3 error code, message) of a botocore ClientError or an obstore failure; ("", "") for neither."""
    from botocore.exceptions import ClientError

    if isinstance(e, ClientError):
        error = e.response.get("Error", {})
        code = str(error.get("Code") or e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        return code, error.get("Message") or code
    text = str(e)
    if any(word in text for word in _MOVED_WORDS):
        return "PermanentRedirect", "the bucket is in another region"
    code = next((found.group(1) for found in (p.search(text) for p in _NATIVE_CODE) if found), "")
    message = _NATIVE_MESSAGE.search(text)
    return code, message.group(1) if message else code


class S3Store(Store):
    def __init__(self, url: str, options: Mapping[str, Any], purpose: str, concurrency: int, chunk_size: int):
        bucket, _, prefix = url[len("s3://"):].partition("/")
        if not bucket:
            raise ConfigError(f"{url!r} names no bucket; use s3://BUCKET/PREFIX")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.root = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.concurrency, self.chunk_size = concurrency, chunk_size
        self._url, self._options, self._purpose = url, options, purpose
        self._client = self._parts = None
        self._lock = threading.RLock()
        require("boto3", f"{purpose} {url}")   # it resolves the credentials either way
        self.endpoint = endpoint_url(options.get("endpoint_url"))
        self.native = _native_store(bucket, options, self.endpoint)   # obstore, or None: boto3 lists and downloads
        self.ranges: bool | None = None  # does the server answer a range with 206, as obstore requires?
        self._probe = threading.Lock()
        if self.native is None:
            self.client  # noqa: B018 - built now: bad options fail here, as they always have

    @property
    def client(self):
        """The boto3 client, built on first use (callers' threads and part threads: `concurrency` each)."""
        with self._lock:
            if self._client is None:
                self._client = _boto3_client(self._url, self._options, self._purpose, 2 * self.concurrency + 4)
            return self._client

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix and rel else self.prefix or rel

    def error(self, e: BaseException, url: str, doing: str) -> StorageError:
        from botocore.exceptions import ConnectionError, NoCredentialsError, PartialCredentialsError

        where = f" at {self.endpoint}" if self.endpoint else ""
        detail = str(e).split("\n\nDebug source:")[0]
        if isinstance(e, (NoCredentialsError, PartialCredentialsError)):
            return StorageError(
                f"no AWS credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
                "AWS_PROFILE), attach an instance profile, or pass storage_options={'key': ..., 'secret': ...}")
        if isinstance(e, ConnectionError) or "kind: Connect" in str(e):
            return StorageError(
                f"cannot connect to the S3 endpoint for {url} ({self.endpoint or 'AWS'}); check endpoint_url and "
                f"that the server is reachable\n{type(e).__name__}: {detail}\nThe endpoint is storage_options' "
                "endpoint_url, else TFNB_S3_ENDPOINT_URL, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, else AWS's own.")
        code, msg = _classified(e)
        if not code:
            return StorageError(f"{doing} {url}{where} failed: {type(e).__name__}: {detail}")
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
            region = (_bucket_region(e.response) if hasattr(e, "response") else None) or "another region"
            configured = self.native.config.get("region") if self.native else self.client.meta.region_name
            return StorageError(
                f"bucket {self.bucket!r} is in {region}, not {configured}; set the bucket's "
                f"region: storage_options={{'region': ...}} or AWS_DEFAULT_REGION\n"
                f"The S3 server{where} did not let the request follow it ({code}).")
        if code in ("PreconditionFailed", "412"):
            return StorageError(f"{url} changed while {doing} it; run again")
        if code in _MISSING_CODES:
            return MissingError(f"{doing} {url}{where} failed: it does not exist; check the URL")
        return StorageError(f"{doing} {url}{where} failed: {code}: {msg}")

    def _natively(self, call):
        """``call(obstore store)``, made again in the bucket's own region once when it is elsewhere."""
        native = self.native
        try:
            return call(native)
        except Exception as e:
            with self._lock:
                if self.native is native and any(word in str(e) for word in _MOVED_WORDS):
                    region, was = self._region(), native.config.get("region")
                    if region and region != was:
                        log.info("S3 bucket %r is in %s, not %s; set storage_options={'region': %r} or "
                                 "AWS_DEFAULT_REGION to spare this look-up", self.bucket, region, was, region)
                        self.native = _native_store(self.bucket, self._options, self.endpoint, region)
                moved = self.native
            if moved is native or moved is None:
                raise
        return call(moved)

    def _region(self) -> str | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return _bucket_region(self.client.head_bucket(Bucket=self.bucket))
        except ClientError as e:   # a refused HEAD names the region too (real S3 does, on 301 and 403)
            return _bucket_region(e.response)
        except BotoCoreError:
            return None

    @guarded("listing")
    def list(self, rel: str = "", recursive: bool = True) -> dict[str, Entry]:
        base = self._key(rel)
        base = base + "/" if base else ""
        found: list[tuple[str, int, Any, str]] | None = None
        if self.native is not None:
            import obstore
            from obstore.exceptions import InvalidPathError

            def listing(native):
                if not recursive:
                    return obstore.list_with_delimiter(native, base.rstrip("/") or None)["objects"]
                return [obj for page in obstore.list(native, base.rstrip("/") or None, chunk_size=1000)
                        for obj in page]

            try:
                found = [(obj["path"], obj["size"], obj["last_modified"], obj.get("e_tag") or "")
                         for obj in self._natively(listing)]
            except InvalidPathError:  # a key obstore cannot name (an empty, '.' or '..' part): boto3 lists it
                pass
        if found is None:
            args = {"Bucket": self.bucket, "Prefix": base, **({} if recursive else {"Delimiter": "/"})}
            found = [(obj["Key"], obj["Size"], obj["LastModified"], obj.get("ETag", ""))
                     for page in self.client.get_paginator("list_objects_v2").paginate(**args)
                     for obj in page.get("Contents", ())]
        out: dict[str, Entry] = {}
        for key, size, modified, etag in found:
            sub = key[len(base):]
            if sub and not sub.endswith("/") and PART not in sub:
                out[sub] = Entry(sub, int(size), modified.timestamp(), str(etag).strip('"'))
        return out

    @guarded("reading")
    def stat(self, rel: str = "") -> Entry | None:
        from botocore.exceptions import ClientError

        if not self._key(rel):
            return None
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(rel))
        except ClientError as e:
            if _classified(e)[0] in _MISSING_CODES:
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
        # botocore raises when a body falls short of its Content-Length (an object rewritten while it is sent)
        return self.client.get_object(**args)["Body"].read()

    @guarded("downloading")
    def get(self, rel, local_path, *, size=None, version=None, on_bytes=None, cancel=None, whole=False) -> None:
        args = (rel, size, version, on_bytes or (lambda n: None), cancel,
                size is not None and size > self.chunk_size and not whole)
        with replacing(local_path, self.url(rel), size) as tmp:
            if self.native is None or {"", ".", ".."} & set(self._key(rel).split("/")):  # keys obstore cannot name
                return self._get(self._request, tmp, *args)
            self._natively(lambda native: self._get(_native_request(native), tmp, *args))

    def _request(self, key: str, version: str | None, span: tuple[int, int] | None):
        """One GET through boto3: (ETag, the body's blocks), as :func:`_native_request` through obstore."""
        args = {"Bucket": self.bucket, "Key": key, **({"IfMatch": f'"{version}"'} if version else {})}
        if span:
            args["Range"] = f"bytes={span[0]}-{span[1] - 1}"
        resp = self.client.get_object(**args)
        return resp.get("ETag"), resp["Body"].iter_chunks(_IO_CHUNK)

    def _get(self, request, tmp, rel, size, version, on_bytes, cancel, split: bool) -> None:
        """``rel`` into ``tmp`` through ``request(key, version, span) -> (etag, blocks)``: one GET unless ``split`` (and
        the server answers ranges), else ranged GETs of ``chunk_size`` on the shared part threads; a body cut short
        starts its part again. Every GET is conditional on the listing's ETag (If-Match): a replaced object fails."""
        url, key = self.url(rel), self._key(rel)

        def part(start: int, end: int | None = None) -> None:
            for attempt in range(_GET_ATTEMPTS):
                etag, blocks = request(key, version, None if end is None else (start, end))
                if version and (etag or "").strip('"') != version:   # servers that ignore If-Match
                    raise StorageError(f"{url} changed since it was listed; run again")
                at = start
                try:
                    for block in blocks:
                        check_cancel(cancel, url)
                        view = memoryview(block)
                        while view:
                            n = os.pwrite(fd, view, at)
                            at, view = at + n, view[n:]
                        on_bytes(len(block))
                    return
                except StorageError:
                    raise
                except Exception:   # noqa: BLE001 - a body cut short, which no client retries
                    on_bytes(start - at)
                    if attempt + 1 == _GET_ATTEMPTS or (cancel is not None and cancel.is_set()):
                        raise

        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            first = 0
            if split and self.ranges is None:
                # the first big file finds out alone, so the others spend no request on it
                with self._probe:
                    if self.ranges is None:
                        try:
                            part(0, self.chunk_size)
                            self.ranges, first = True, self.chunk_size
                        except Exception as e:   # noqa: BLE001
                            if "NotPartial" not in str(e):
                                raise
                            self.ranges = False   # 200 to a range (rclone), which obstore refuses: one GET each
            if not split or not self.ranges:
                return part(0)
            with self._lock:
                if self._parts is None:
                    self._parts = ThreadPoolExecutor(self.concurrency, thread_name_prefix="tfnb-s3-part")
            futures = [self._parts.submit(part, start, min(start + self.chunk_size, size))
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
            parts, self._parts = self._parts, None
        if parts is not None:
            parts.shutdown(wait=True, cancel_futures=True)


def _bucket_region(response: Mapping) -> str | None:
    """The region an S3 response names for its bucket (header on any answer, or a redirect's body)."""
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    return headers.get("x-amz-bucket-region") or response.get("Error", {}).get("Region") or None


def _native_store(bucket: str, options: Mapping[str, Any], endpoint: str | None, region: str | None = None):
    """An obstore S3Store for ``bucket`` (in ``region`` when known), or None for boto3 (see the module docstring)."""
    given = {S3_OPTIONS.get(k, k): v for k, v in options.items()}
    if not setting("s3_native", None, True) or not set(given) <= _NATIVE_OPTIONS:
        return None
    try:
        from obstore.auth.boto3 import Boto3CredentialProvider
        from obstore.store import S3Store as NativeStore
    except ImportError:
        return None
    try:
        session = _botocore_session()
        if given.get("profile"):
            session.set_config_variable("profile", given["profile"])
        region = region or given.get("region_name") or session.get_config_variable("region") or "us-east-1"
        config: dict[str, Any] = {"region": region, **({"endpoint": endpoint} if endpoint else {})}
        keys = given.get("aws_access_key_id"), given.get("aws_secret_access_key")
        provider = None
        if given.get("anon"):
            config["skip_signature"] = True
        elif any(keys):
            if not all(keys):
                return None   # boto3 reports the half-given pair
            config.update(access_key_id=keys[0], secret_access_key=keys[1],
                          **({"token": given["aws_session_token"]} if given.get("aws_session_token") else {}))
        else:
            # botocore's credentials, refreshed as botocore refreshes them; with none it raises: boto3 says what to set
            provider = Boto3CredentialProvider(session, ttl=datetime.timedelta(seconds=_CREDENTIAL_TTL))
        return NativeStore(bucket, config=config, credential_provider=provider,
                           client_options={"allow_http": bool(endpoint and endpoint.startswith("http://")),
                                           "timeout": "600s", "connect_timeout": "10s"},
                           retry_config={"max_retries": _GET_ATTEMPTS - 1,
                                         "retry_timeout": datetime.timedelta(seconds=60)})
    except Exception:  # noqa: BLE001 - a profile or config boto3 reads differently: boto3 handles it
        return None


def _native_request(native):
    import obstore

    def request(key: str, version: str | None, span: tuple[int, int] | None):
        options = {"if_match": f'"{version}"'} if version else {}
        got = obstore.get(native, key, options=dict(options, range=span) if span else options)
        return got.meta.get("e_tag"), got.stream(min_chunk_size=_IO_CHUNK)
    return request
