"""The run's authenticated message channel between barrier tasks and the driver.

The driver listens on one TCP port bound to the driver host (loopback for local
masters). Each task connects, proves it knows the run's secret with an HMAC of a
server nonce (the secret itself never crosses the socket), then streams framed
JSON messages: log lines, progress, state changes, failures. The driver can send
messages back (``stop``). A frame is a 4-byte big-endian length and UTF-8 JSON.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import socket
import struct
import threading
from typing import Callable

log = logging.getLogger(__name__)

_MAX_FRAME = 16 << 20
_HANDSHAKE_TIMEOUT = 10.0


def _send(sock: socket.socket, msg: dict) -> None:
    data = json.dumps(msg, default=str).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket) -> dict | None:
    head = _recv_exact(sock, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > _MAX_FRAME:
        raise ConnectionError(f"frame of {n} bytes exceeds {_MAX_FRAME}")
    body = _recv_exact(sock, n)
    return None if body is None else json.loads(body)


def _mac(token: str, nonce: str) -> str:
    return hmac.new(token.encode(), nonce.encode(), hashlib.sha256).hexdigest()


class DriverChannel:
    """Driver end: accepts authenticated task connections and hands each message to ``on_message``.

    Args:
        host: address to bind (the driver host; loopback for local masters).
        on_message: called from connection threads with ``(peer, message)``; peer is the hello dict.
        token: the per-run secret; generated when not given.
    """

    def __init__(self, host: str, on_message: Callable[[dict, dict], None], token: str | None = None):
        self.token = token or secrets.token_hex(32)
        self._on_message = on_message
        self._lock = threading.Lock()
        self._conns: dict[socket.socket, dict] = {}
        self._closed = threading.Event()
        self._all_gone = threading.Condition(self._lock)
        self._listener = socket.create_server((host, 0), backlog=512)
        self.address = (host, self._listener.getsockname()[1])
        self._thread = threading.Thread(target=self._accept_loop, name="tfnb-channel", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="tfnb-channel-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        peer: dict | None = None
        try:
            conn.settimeout(_HANDSHAKE_TIMEOUT)
            nonce = secrets.token_hex(16)
            _send(conn, {"nonce": nonce})
            hello = _recv(conn)
            if not hello or not hmac.compare_digest(str(hello.get("auth", "")), _mac(self.token, nonce)):
                log.warning("tfnb channel: rejected a connection that failed authentication")
                return
            conn.settimeout(None)
            peer = dict(hello.get("peer") or {})
            with self._lock:
                if self._closed.is_set():
                    return
                self._conns[conn] = peer
            _send(conn, {"kind": "welcome"})
            while True:
                msg = _recv(conn)
                if msg is None:
                    break
                self._on_message(peer, msg)
        except (OSError, ValueError, ConnectionError):
            pass
        finally:
            with self._lock:
                self._conns.pop(conn, None)
                self._all_gone.notify_all()
            try:
                conn.close()
            except OSError:
                pass
            if peer is not None:
                self._on_message(peer, {"kind": "disconnected"})

    @property
    def connected(self) -> int:
        with self._lock:
            return len(self._conns)

    def broadcast(self, msg: dict) -> None:
        """Send ``msg`` to every connected task (best effort)."""
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                _send(conn, msg)
            except OSError:
                pass

    def wait_disconnected(self, timeout: float) -> bool:
        """Wait until every task has hung up (its processes are gone); True if they all did in time."""
        with self._lock:
            return self._all_gone.wait_for(lambda: not self._conns, timeout=timeout)

    def close(self) -> None:
        self._closed.set()
        try:
            # shutdown wakes the thread blocked in accept(); close alone does not on Linux
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            except OSError:
                pass
        self._thread.join(timeout=5)


class TaskChannel:
    """Task end: one authenticated connection to the driver; ``send`` is thread-safe.

    Args:
        address: the driver channel's (host, port).
        token: the run's secret.
        peer: who this task is (role, index, host), shown with its messages on the driver.
        on_message: called from a reader thread for each message the driver sends.
        on_lost: called once if the driver goes away.
    """

    def __init__(self, address, token: str, peer: dict, on_message: Callable[[dict], None] | None = None,
                 on_lost: Callable[[], None] | None = None, timeout: float = 30.0):
        self._sock = socket.create_connection(tuple(address), timeout=timeout)
        self._lock = threading.Lock()
        challenge = _recv(self._sock)
        if not challenge or "nonce" not in challenge:
            raise ConnectionError("the tfnb driver channel did not send a challenge")
        _send(self._sock, {"auth": _mac(token, challenge["nonce"]), "peer": peer})
        welcome = _recv(self._sock)
        if not welcome or welcome.get("kind") != "welcome":
            raise ConnectionError("the tfnb driver channel refused this task (wrong run secret?)")
        self._sock.settimeout(None)
        self._on_message = on_message
        self._on_lost = on_lost
        self._closing = False
        self._reader = threading.Thread(target=self._read_loop, name="tfnb-task-channel", daemon=True)
        self._reader.start()

    def _read_loop(self) -> None:
        try:
            while True:
                msg = _recv(self._sock)
                if msg is None:
                    break
                if self._on_message:
                    self._on_message(msg)
        except (OSError, ValueError, ConnectionError):
            pass
        if not self._closing and self._on_lost:
            self._on_lost()

    def send(self, kind: str, **fields) -> bool:
        """Send one message; False when the driver can no longer be reached."""
        try:
            with self._lock:
                _send(self._sock, {"kind": kind, **fields})
            return True
        except OSError:
            return False

    def close(self) -> None:
        self._closing = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
