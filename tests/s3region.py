"""S3 regions on loopback: a front for a local S3 server that answers as AWS does for a bucket in
another region than the one a request is signed for.

AWS answers such a path-style request ``301 PermanentRedirect`` with no ``Location`` header; the
bucket's region is in the ``x-amz-bucket-region`` header (and the error body names the endpoint).
botocore follows that to the bucket's region; other clients need the region set. moto and rclone
keep no such rule, so this front applies it: every request is signed (``Credential=KEY/DATE/REGION/
s3/aws4_request``), and a bucket listed in ``regions`` is served only to requests signed for its
region. ``name_region=False`` makes a server that never names the region: a bare 301, and 403 to a
HEAD of the bucket (botocore's redirect would HEAD such a bucket recursively if that were a 301 too).
"""
from __future__ import annotations

import http.client
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/([^/]+)/s3/aws4_request")
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"}


@dataclass
class RegionFront:
    """The running front: its URL, and what it was asked (method, bucket, signing region, client)."""

    endpoint_url: str
    server: ThreadingHTTPServer = field(repr=False)
    seen: list = field(default_factory=list)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_region_front(upstream: str, regions: dict[str, str], *, name_region: bool = True) -> RegionFront:
    """A front on 127.0.0.1 for the S3 server at ``upstream`` where bucket ``b`` lives in ``regions[b]``."""
    up = urlsplit(upstream)
    seen: list[tuple[str, str, str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"   # keep-alive, as clients expect of S3

        def log_message(self, *args) -> None:
            pass

        def handle_one(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            target = urlsplit(self.path)
            bucket = unquote(target.path.lstrip("/").split("/", 1)[0])
            signed = _SCOPE.search(self.headers.get("Authorization", "") + unquote(target.query))
            region = signed.group(1) if signed else ""
            seen.append((self.command, unquote(target.path), region, self.headers.get("User-Agent", "")))
            home = regions.get(bucket)
            if home and region != home:
                self.moved(bucket, home)
                return
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
            try:
                conn.request(self.command, self.path, body=body,
                             headers={k: v for k, v in self.headers.items() if k.lower() != "connection"})
                resp = conn.getresponse()
                data = resp.read()
            finally:
                conn.close()
            self.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP:
                    self.send_header(k, v)
            length = resp.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def moved(self, bucket: str, home: str) -> None:
            if not name_region and self.command == "HEAD":
                self.send_response(403, "Forbidden")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            xml = b"" if self.command == "HEAD" else (
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>PermanentRedirect</Code><Message>The "
                "bucket you are attempting to access must be addressed using the specified endpoint. Please "
                f"send all future requests to this endpoint.</Message><Endpoint>{bucket}.s3.{home}.amazonaws."
                f"com</Endpoint><Bucket>{bucket}</Bucket><RequestId>0</RequestId></Error>").encode()
            self.send_response(301, "Moved Permanently")
            if name_region:
                self.send_header("x-amz-bucket-region", home)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(xml)))
            self.end_headers()
            self.wfile.write(xml)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = handle_one

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="s3-region-front", daemon=True).start()
    return RegionFront(f"http://127.0.0.1:{server.server_address[1]}", server, seen)
