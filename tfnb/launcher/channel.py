"""The driver's end of the run's channel (frames and handshake: :mod:`tfnb._protocol`) and its bounded inbox."""
from __future__ import annotations

import collections
import contextlib
import hmac
import json
import logging
import os
import queue
import secrets
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from .._protocol import (_HANDSHAKE_TIMEOUT, _HEAD, _MAX_FRAME, _MAX_HELLO, _SEND_TIMEOUT, EventKind, Msg, _key,
                         _plain, _proof, _Sealer)

log = logging.getLogger(__name__)

_MAX_PENDING = 64        # unauthenticated connections served at once


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    nonce: str = field(default_factory=lambda: secrets.token_hex(16))
    peer: dict | None = None   # set once authenticated
    rx: _Sealer | None = None
    tx: _Sealer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class DriverChannel:
    """Driver end: binds ``host``, accepts authenticated task connections (at most ``max_pending`` at once before
    they authenticate, each within ``handshake_timeout`` s) and calls ``on_message(peer, message)`` from its thread
    (peer: the task's hello dict; a batch is one message). ``on_message`` may block: the senders slow down."""

    def __init__(self, host: str, on_message: Callable[[dict, dict], None], *, max_pending: int = _MAX_PENDING,
                 handshake_timeout: float = _HANDSHAKE_TIMEOUT):
        self.token = secrets.token_hex(32)
        self._on_message, self._max_pending, self._handshake_timeout = on_message, max_pending, handshake_timeout
        self._lock = threading.Lock()
        self._all_gone = threading.Condition(self._lock)
        self._conns: dict[socket.socket, _Conn] = {}   # authenticated
        self._pending: dict[socket.socket, _Conn] = {}
        self._closed = threading.Event()
        self.rejected = 0  # connections closed for failing authentication or a bad frame
        self._listener = socket.create_server((host, 0), backlog=1024)
        self._listener.setblocking(False)
        self.address = (host, self._listener.getsockname()[1])
        # one receive buffer for every connection: a fresh 256 KiB one per recv() costs an mmap/munmap pair
        self._rx = memoryview(bytearray(1 << 18))
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._loop, name="tfnb-channel", daemon=True)
        self._thread.start()

    # the channel thread

    def _loop(self) -> None:
        try:
            while not self._closed.is_set():
                for key, _ in self._sel.select(timeout=0.5):
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.data)
                self._expire()
        except (OSError, ValueError):
            if not self._closed.is_set():
                log.exception("tfnb channel: the driver's channel thread stopped")
        finally:
            for c in list(self._pending.values()) + list(self._conns.values()):
                self._drop(c)

    def _accept(self) -> None:
        while len(self._pending) < self._max_pending:
            try:
                sock, _ = self._listener.accept()
            except OSError:  # BlockingIOError: none waiting
                return
            c = _Conn(sock, time.monotonic() + self._handshake_timeout)
            try:
                # blocking with a timeout: reads follow the selector, and a send waits for a full buffer
                sock.settimeout(_SEND_TIMEOUT)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.sendall(_plain({"nonce": c.nonce}))
            except OSError:
                sock.close()
                continue
            self._pending[sock] = c
            self._sel.register(sock, selectors.EVENT_READ, c)
        # Enough connections are proving themselves: let the rest wait in the listen backlog.
        self._sel.unregister(self._listener)

    def _expire(self) -> None:
        now = time.monotonic()
        for c in [c for c in self._pending.values() if c.deadline < now]:
            log.warning("tfnb channel: closed a connection that did not authenticate within %.0f s",
                        self._handshake_timeout)
            self.rejected += 1
            self._drop(c)
        if (len(self._pending) < self._max_pending and self._listener not in self._sel.get_map()
                and not self._closed.is_set()):
            self._sel.register(self._listener, selectors.EVENT_READ, None)

    def _read(self, c: _Conn) -> None:
        try:
            # readv, not recv_into: a socket with a timeout polls before every recv (a second system call)
            n = os.readv(c.sock.fileno(), (self._rx,))
        except (BlockingIOError, InterruptedError, socket.timeout):
            return
        except OSError:
            n = 0
        if not n:
            self._drop(c)
            return
        c.buf += self._rx[:n]
        try:
            self._frames(c)
        except Exception as e:  # noqa: BLE001 - whatever one connection sent, the others go on
            log.warning("tfnb channel: closed a connection from %s: %s",
                        (c.peer or {}).get("host") or "an unauthenticated peer", e)
            self.rejected += 1
            self._drop(c)

    def _frames(self, c: _Conn) -> None:
        buf, pos = c.buf, 0
        try:
            while len(buf) - pos >= 4:
                (n,) = _HEAD.unpack_from(buf, pos)
                limit = _MAX_FRAME if c.peer is not None else _MAX_HELLO
                if n > limit:
                    raise ConnectionError(f"a frame of {n} bytes exceeds the {limit}-byte limit")
                if len(buf) - pos - 4 < n:
                    return
                body = memoryview(buf)[pos + 4:pos + 4 + n]
                pos += 4 + n
                try:
                    if c.peer is None:
                        self._hello(c, bytes(body))
                    else:
                        msg = c.rx.open(body)
                        if not isinstance(msg, dict):
                            raise ConnectionError("a frame is not a message")
                        self._on_message(c.peer, msg)
                finally:
                    body.release()
        finally:
            del buf[:pos]

    def _hello(self, c: _Conn, body: bytes) -> None:
        hello = json.loads(body)
        if not isinstance(hello, dict) or not isinstance(hello.get("nonce"), str) or len(hello["nonce"]) > 64:
            raise ConnectionError("the hello is not a tfnb hello")
        task_nonce = hello["nonce"]
        if not hmac.compare_digest(str(hello.get("auth", "")), _proof(self.token, "task", c.nonce, task_nonce)):
            raise ConnectionError("it failed authentication (not this run's secret)")
        c.rx = _Sealer(_key(self.token, "task", c.nonce, task_nonce))
        c.tx = _Sealer(_key(self.token, "driver", c.nonce, task_nonce))
        c.sock.sendall(_plain({"kind": Msg.WELCOME, "auth": _proof(self.token, "driver", task_nonce, c.nonce)}))
        peer = hello.get("peer")
        c.peer = dict(peer) if isinstance(peer, dict) else {}
        del self._pending[c.sock]
        with self._lock:
            self._conns[c.sock] = c

    def _drop(self, c: _Conn) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(c.sock)
        self._pending.pop(c.sock, None)
        with self._lock:
            was_open = self._conns.pop(c.sock, None) is not None
        with contextlib.suppress(OSError):
            c.sock.close()
        if was_open:
            try:
                self._on_message(c.peer, {"kind": Msg.DISCONNECTED})
            finally:
                with self._lock:
                    self._all_gone.notify_all()

    # other threads

    @property
    def connected(self) -> int:
        with self._lock:
            return len(self._conns)

    def broadcast(self, msg: dict) -> None:
        """Send ``msg`` to every connected task (best effort)."""
        with self._lock:
            conns = list(self._conns.values())
        for c in conns:
            with contextlib.suppress(OSError), c.lock:
                c.sock.sendall(c.tx.seal(msg))

    def wait_disconnected(self, timeout: float) -> bool:
        """Wait until every task has hung up; True if they all did in time."""
        with self._lock:
            return self._all_gone.wait_for(lambda: not self._conns, timeout=timeout)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError, ValueError):
            self._sel.close()
        self._listener.close()


def _merges(msg: dict) -> bool:
    # A progress report the next one may replace; an epoch's last report is kept (the console prints it), and
    # so is a task's first (the epoch an attempt began at: a relaunch's resumed_epoch).
    return (msg.get("kind") == Msg.EVENT and msg.get("event", EventKind.PROGRESS) == EventKind.PROGRESS
            and not (msg.get("data") or {}).get("epoch_end") and not msg.get("first"))


class Inbox:
    """The driver's bounded queue from the channel thread to the main thread. Lines, states and failures keep their
    order and are never dropped: with ``bound`` waiting, :meth:`put_message` blocks (the tasks slow down); the job's
    end (:meth:`put` of "done", "error", "closed") lifts the bound. Progress waits once per task, a newer report
    merging into it (``dropped`` counts them)."""

    def __init__(self, bound: int = 10_000, gather: float = 0.02):
        self.bound, self.gather = bound, gather
        self._since = 0.0  # when the oldest waiting item came
        self.dropped = 0
        self.peak = 0    # most messages waiting at once
        self._cv = threading.Condition()
        self._items: collections.deque = collections.deque()
        self._latest: dict = {}   # task -> the progress message waiting for it
        self._size = 0

    def put(self, item) -> None:
        with self._cv:
            if item[0] in ("done", "error", "closed"):
                self.bound = float("inf")
            self._items.append(item)
            self._since = -1.0  # the driver's own news: no gathering
            self._cv.notify_all()

    def put_message(self, peer: dict, msg: dict) -> None:
        items = msg.get("items") if msg.get("kind") == Msg.BATCH else [msg]
        keep, progress, n = [], [], 0  # n: messages kept, a run of lines counting a message per line
        for m in items if isinstance(items, list) else ():
            if not isinstance(m, dict):
                continue
            if _merges(m):
                progress.append(m)
            else:
                keep.append(m)
                lines = m.get("lines")
                n += len(lines) if type(lines) is list else 1
        if n:  # as it came when nothing merged (most batches: lines only, or one message)
            keep = msg if len(keep) == len(items) else keep[0] if len(keep) == 1 else {"kind": Msg.BATCH, "items": keep}
        with self._cv:
            while n and self._size >= self.bound:
                self._cv.wait()
            # after the wait: the main thread may have emptied the queue meanwhile and be waiting for news
            was_empty = not self._items
            if was_empty:
                self._since = time.monotonic()
            for m in progress:
                task = (peer.get("job_name"), peer.get("task_index"))
                waiting = self._latest.get(task)
                if waiting is not None:
                    waiting["data"] = {**(waiting.get("data") or {}), **(m.get("data") or {})}
                    self.dropped += 1
                    continue
                self._latest[task] = m
                self._items.append(("progress", peer, task))
                self._size += 1
            if n:
                self._items.append(("msg", peer, keep, n))
                self._size += n
            self.peak = max(self.peak, self._size)
            if (was_empty and self._items) or self._size * 10 >= self.bound:
                self._cv.notify_all()

    def get_many(self, timeout: float | None = None, most: int = 256) -> list:
        """Up to ``most`` waiting items, oldest first, as ``("msg", peer, message, size)`` or as :meth:`put` (which
        ends the list); once the first waited ``gather`` s or ``bound``/10 wait. ``queue.Empty`` after ``timeout``."""
        with self._cv:
            if not self._items:
                end = time.monotonic() + (float("inf") if timeout is None else timeout)
                if not self._cv.wait_for(lambda: self._items, timeout=timeout):
                    raise queue.Empty
                wait = min(self._since + self.gather, end) - time.monotonic()
                if wait > 0 and self._size * 10 < self.bound:
                    self._cv.wait(wait)  # woken early by put() or by bound/10 messages
            out, items = [], self._items
            while items and len(out) < most:
                item = items.popleft()
                if item[0] == "progress":
                    item = ("msg", item[1], self._latest.pop(item[2]), 1)
                elif item[0] != "msg":
                    out.append(item)
                    break
                self._size -= item[3]
                out.append(item)
            self._cv.notify_all()
            return out

    def unget(self, items: list) -> None:
        """Put items of :meth:`get_many` back in front (their handling was interrupted)."""
        with self._cv:
            self._items.extendleft(reversed(items))
            self._size += sum(item[3] for item in items if item[0] == "msg")

    def qsize(self) -> int:
        with self._cv:
            return len(self._items)
