"""The run's authenticated message channel between barrier tasks and the driver.

The driver listens on one TCP port bound to the driver host (loopback for local masters). A frame
is a 4-byte big-endian length and a body. The handshake proves the run's secret both ways without
sending it:

1. driver -> task: ``{"nonce": sn}`` (JSON body)
2. task -> driver: ``{"auth": HMAC(secret, "task"|sn|tn), "nonce": tn, "peer": {...}}`` (at most
   ``_MAX_HELLO`` bytes, within ``_HANDSHAKE_TIMEOUT`` seconds of connecting)
3. driver -> task: ``{"kind": "welcome", "auth": HMAC(secret, "driver"|tn|sn)}``; the task hangs up
   unless it checks out, so a server that does not know the secret learns nothing and can send nothing.

Every later frame body is ``MAC || JSON`` where MAC = HMAC-SHA256(key, sequence || JSON) with a key per
direction derived from the secret and both nonces and a sequence number counted by both ends: a
forged, altered, replayed, reordered or dropped frame fails the check and the connection is closed.
Frames are authenticated, not encrypted (logs and tracebacks are readable on the wire; see README).

The driver serves every connection from one thread (``selectors``), so connections that have not
authenticated cost no thread; at most ``max_pending`` of them are served at once, the rest wait in the
listen backlog. Tasks batch what they send (:meth:`TaskChannel.post`, :meth:`TaskChannel.post_line`):
what comes within ``window`` seconds goes out as one frame, a run of lines of one stream as one item,
and progress reports are merged to the latest per window.
"""
from __future__ import annotations

import collections
import hashlib
import hmac
import json
import logging
import os
import queue
import secrets
import selectors
import socket
import struct
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)

_MAX_FRAME = 16 << 20    # an authenticated frame (a batch, a long traceback)
_MAX_HELLO = 4 << 10     # the unauthenticated hello: a MAC, a nonce and who the task is
_HANDSHAKE_TIMEOUT = 10.0
_MAX_PENDING = 64        # unauthenticated connections served at once
_BATCH_BYTES = 256 << 10  # a task sends its batch early when this much is waiting
_SEND_TIMEOUT = 30.0
_MAC = 32
_HEAD = struct.Struct(">I")


def batch_window(num_tasks: int) -> float:
    """Seconds a task gathers messages into one frame: 0.1 s, longer above 600 tasks (0.34 s at 2,048,
    at most 0.4 s), so the driver gets at most ~6,000 frames/s up to 2,400 tasks."""
    return min(0.4, max(0.1, num_tasks / 6000))


def _proof(token: str, label: str, first: str, second: str) -> str:
    return hmac.new(token.encode(), f"{label}|{first}|{second}".encode(), hashlib.sha256).hexdigest()


def _key(token: str, direction: str, server_nonce: str, task_nonce: str) -> bytes:
    return hmac.digest(token.encode(), f"tfnb-channel-1|{direction}|{server_nonce}|{task_nonce}".encode(),
                       "sha256")


class _Sealer:
    """MACs outgoing or checks incoming frame bodies of one direction, counting the sequence.

    HMAC-SHA256 as RFC 2104 defines it (the same bytes as ``hmac.digest``), with the key's inner and
    outer pads hashed once: per frame that saves two SHA-256 blocks and the key set-up (about a
    third of the MAC's cost for a 1 KB frame) and reads the frame in place, without copies.
    """

    __slots__ = ("inner", "outer", "seq")

    def __init__(self, key: bytes):
        key = key.ljust(64, b"\0")  # derived keys are 32 bytes: shorter than SHA-256's block
        self.inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self.outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))
        self.seq = 0

    def mac(self, payload) -> bytes:
        h = self.inner.copy()
        h.update(self.seq.to_bytes(8, "big"))
        h.update(payload)
        o = self.outer.copy()
        o.update(h.digest())
        return o.digest()

    def seal(self, msg) -> bytes:
        payload = json.dumps(msg, default=str, separators=(",", ":")).encode()
        mac = self.mac(payload)
        self.seq += 1
        return _HEAD.pack(_MAC + len(payload)) + mac + payload

    def open(self, body: memoryview) -> object:
        if len(body) < _MAC or not hmac.compare_digest(self.mac(body[_MAC:]), body[:_MAC]):
            raise ConnectionError("a frame failed its authentication check")
        self.seq += 1
        return json.loads(str(body[_MAC:], "utf-8"))  # from str: json.loads(bytes) guesses the encoding first


def _plain(msg: dict) -> bytes:
    data = json.dumps(msg).encode()
    return _HEAD.pack(len(data)) + data


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv_body(sock: socket.socket, limit: int) -> bytes | None:
    head = _recv_exact(sock, 4)
    if head is None:
        return None
    (n,) = _HEAD.unpack(head)
    if n > limit:
        raise ConnectionError(f"frame of {n} bytes exceeds {limit}")
    return _recv_exact(sock, n)


# ---------------------------------------------------------------- driver end


class _Conn:
    __slots__ = ("sock", "buf", "deadline", "nonce", "peer", "rx", "tx", "lock")

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock = sock
        self.buf = bytearray()
        self.deadline = deadline
        self.nonce = secrets.token_hex(16)
        self.peer: dict | None = None   # set once authenticated
        self.rx: _Sealer | None = None
        self.tx: _Sealer | None = None
        self.lock = threading.Lock()


class DriverChannel:
    """Driver end: accepts authenticated task connections and hands each message to ``on_message``.

    Args:
        host: address to bind (the driver host; loopback for local masters).
        on_message: called from the channel thread with ``(peer, message)``; peer is the task's hello
            dict. A batch arrives as one ``{"kind": "batch", "items": [...]}`` message. It may block:
            reading stops meanwhile, which slows the senders down (TCP back-pressure).
        token: the per-run secret; generated when not given.
        max_pending: connections served at once before they authenticate.
        handshake_timeout: seconds a connection has to authenticate.
    """

    def __init__(self, host: str, on_message: Callable[[dict, dict], None], token: str | None = None, *,
                 max_pending: int = _MAX_PENDING, handshake_timeout: float = _HANDSHAKE_TIMEOUT):
        self.token = token or secrets.token_hex(32)
        self._on_message = on_message
        self._max_pending = max_pending
        self._handshake_timeout = handshake_timeout
        self._lock = threading.Lock()
        self._all_gone = threading.Condition(self._lock)
        self._conns: dict[socket.socket, _Conn] = {}   # authenticated
        self._pending: dict[socket.socket, _Conn] = {}
        self._closed = threading.Event()
        self.rejected = 0  # connections closed for failing authentication or a bad frame
        self._listener = socket.create_server((host, 0), backlog=1024)
        self._listener.setblocking(False)
        self.address = (host, self._listener.getsockname()[1])
        # one receive buffer for every connection (only the channel thread reads): a fresh 256 KiB
        # bytes object per recv() costs an mmap/munmap pair, a third of the thread's time at 2,000 tasks
        self._rx = memoryview(bytearray(1 << 18))
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._listening = True
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
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            c = _Conn(sock, time.monotonic() + self._handshake_timeout)
            try:
                # blocking with a timeout: reads happen only once the selector says data is there,
                # and a stop sent from another thread waits for a full send buffer instead of failing
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
        self._listening = False

    def _expire(self) -> None:
        now = time.monotonic()
        for c in [c for c in self._pending.values() if c.deadline < now]:
            log.warning("tfnb channel: closed a connection that did not authenticate within %.0f s",
                        self._handshake_timeout)
            self.rejected += 1
            self._drop(c)
        if not self._listening and len(self._pending) < self._max_pending and not self._closed.is_set():
            self._sel.register(self._listener, selectors.EVENT_READ, None)
            self._listening = True

    def _read(self, c: _Conn) -> None:
        try:
            # readv, not recv_into: a socket with a timeout polls before every recv, a second system
            # call per frame when the selector has just said there is data (its fd is non-blocking)
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
        c.sock.sendall(_plain({"kind": "welcome", "auth": _proof(self.token, "driver", task_nonce, c.nonce)}))
        peer = hello.get("peer")
        c.peer = dict(peer) if isinstance(peer, dict) else {}
        del self._pending[c.sock]
        with self._lock:
            self._conns[c.sock] = c

    def _drop(self, c: _Conn) -> None:
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        self._pending.pop(c.sock, None)
        with self._lock:
            was_open = self._conns.pop(c.sock, None) is not None
        try:
            c.sock.close()
        except OSError:
            pass
        if was_open:
            try:
                self._on_message(c.peer, {"kind": "disconnected"})
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
            try:
                with c.lock:
                    c.sock.sendall(c.tx.seal(msg))
            except OSError:
                pass

    def wait_disconnected(self, timeout: float) -> bool:
        """Wait until every task has hung up (its processes are gone); True if they all did in time."""
        with self._lock:
            return self._all_gone.wait_for(lambda: not self._conns, timeout=timeout)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        try:
            self._sel.close()
        except (OSError, ValueError):
            pass
        self._listener.close()


# ---------------------------------------------------------------- driver queue


def _merges(msg: dict) -> bool:
    # A progress report the next one may replace; an epoch's last report is kept (the console prints it).
    return (msg.get("kind") == "event" and msg.get("event", "progress") == "progress"
            and not (msg.get("data") or {}).get("epoch_end"))


_ENDS = ("done", "error", "closed")


class Inbox:
    """The driver's bounded queue from the channel thread to the main thread.

    Log lines, states and failures are kept in order, never dropped: when ``bound`` messages wait,
    :meth:`put_message` blocks, so the channel stops reading and the tasks slow down. Progress waits
    at most once per task: a newer report merges into the one not yet handled (``dropped`` counts
    them). The job's end (:meth:`put` of a "done", "error" or "closed" item) lifts the bound, since
    what the tasks still have to send is then finite and the channel thread must not wait on a
    queue nobody drains any more.

    A waiting :meth:`get` returns once the first message has waited ``gather`` seconds or ``bound``/10
    are waiting (at once for an item of :meth:`put`): at thousands of frames a second, waking the
    main thread for each one meant ~1,000 passes a second of a few messages each, and five times
    the context switches.

    Items come out as ``("msg", peer, message, size)`` or as put.
    """

    def __init__(self, bound: int = 10_000, gather: float = 0.02):
        self.bound = bound
        self.gather = gather
        self._since = 0.0  # when the oldest waiting item came
        self.dropped = 0
        self.peak = 0    # most messages waiting at once
        self._cv = threading.Condition()
        self._items: collections.deque = collections.deque()
        self._latest: dict = {}   # task -> the progress message waiting for it
        self._size = 0

    def put(self, item) -> None:
        with self._cv:
            if item[0] in _ENDS:
                self.bound = float("inf")
            self._items.append(item)
            self._since = -1.0  # the driver's own news: no gathering
            self._cv.notify_all()

    def put_message(self, peer: dict, msg: dict) -> None:
        items = msg.get("items") if msg.get("kind") == "batch" else [msg]
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
        if n and len(keep) == len(items):
            keep = msg  # as it came (most batches: lines only, or one message)
        elif n:
            keep = keep[0] if len(keep) == 1 else {"kind": "batch", "items": keep}
        with self._cv:
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
                while self._size >= self.bound:
                    self._cv.wait()
                self._items.append(("msg", peer, keep, n))
                self._size += n
            self.peak = max(self.peak, self._size)
            if (was_empty and self._items) or self._size * 10 >= self.bound:
                self._cv.notify_all()

    def get(self, timeout: float | None = None):
        return self.get_many(timeout, 1)[0]

    def get_many(self, timeout: float | None = None, most: int = 256) -> list:
        """Up to ``most`` waiting items at once (one round of the lock for all), oldest first; an item
        of :meth:`put` ends the list. Raises ``queue.Empty`` when nothing came within ``timeout``."""
        with self._cv:
            if not self._items:
                if timeout is not None and timeout <= 0:
                    raise queue.Empty
                end = None if timeout is None else time.monotonic() + timeout
                if not self._cv.wait_for(lambda: self._items, timeout=timeout):
                    raise queue.Empty
                wait = self._since + self.gather - time.monotonic()
                if end is not None:
                    wait = min(wait, end - time.monotonic())
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
        """Put items of :meth:`get_many` back in front, in order (their handling was interrupted)."""
        with self._cv:
            self._items.extendleft(reversed(items))
            self._size += sum(item[3] for item in items if item[0] == "msg")

    def get_nowait(self):
        return self.get(timeout=0)

    def qsize(self) -> int:
        with self._cv:
            return len(self._items)


# ---------------------------------------------------------------- task end


class TaskChannel:
    """Task end: one authenticated connection to the driver.

    :meth:`send` goes out at once (with whatever :meth:`post` gathered before it, in order);
    :meth:`post` waits up to ``window`` seconds to share a frame with others. Both are thread-safe.

    Args:
        address: the driver channel's (host, port).
        token: the run's secret.
        peer: who this task is (role, index, host), shown with its messages on the driver.
        on_message: called from a reader thread for each message the driver sends.
        on_lost: called once if the driver goes away.
        window: seconds a posted message may wait for company; None: only :meth:`flush` sends them.

    Raises:
        ConnectionError: the driver refused the secret, or could not prove it knows it.
    """

    def __init__(self, address, token: str, peer: dict, on_message: Callable[[dict], None] | None = None,
                 on_lost: Callable[[], None] | None = None, timeout: float = 30.0, window: float | None = 0.1):
        self._sock = socket.create_connection(tuple(address), timeout=timeout)
        try:
            self._tx, self._rx = self._handshake(token, peer)
        except BaseException:
            self._sock.close()
            raise
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lock = threading.Lock()        # the socket's send side
        self._pending_lock = threading.Condition()
        self._pending: list = []
        self._merged: dict = {}              # merge key -> index in _pending
        self._pending_bytes = 0
        self._window = window
        self._on_message = on_message
        self._on_lost = on_lost
        self._closing = False
        self._reader = threading.Thread(target=self._read_loop, name="tfnb-task-channel", daemon=True)
        self._reader.start()
        if window is not None:
            threading.Thread(target=self._flush_loop, name="tfnb-task-batch", daemon=True).start()

    def _handshake(self, token: str, peer: dict) -> tuple[_Sealer, _Sealer]:
        body = _recv_body(self._sock, _MAX_HELLO)
        challenge = json.loads(body) if body else None
        if not isinstance(challenge, dict) or not isinstance(challenge.get("nonce"), str):
            raise ConnectionError("the tfnb driver channel did not send a challenge")
        sn, tn = challenge["nonce"], secrets.token_hex(16)
        self._sock.sendall(_plain({"auth": _proof(token, "task", sn, tn), "nonce": tn, "peer": peer}))
        body = _recv_body(self._sock, _MAX_HELLO)
        welcome = json.loads(body) if body else None
        if not isinstance(welcome, dict) or welcome.get("kind") != "welcome":
            raise ConnectionError("the tfnb driver channel refused this task (wrong run secret?)")
        if not hmac.compare_digest(str(welcome.get("auth", "")), _proof(token, "driver", tn, sn)):
            raise ConnectionError(f"the server at {self._sock.getpeername()} could not prove it knows the "
                                  "run's secret; this task will not talk to it")
        return _Sealer(_key(token, "task", sn, tn)), _Sealer(_key(token, "driver", sn, tn))

    def _read_loop(self) -> None:
        try:
            while True:
                body = _recv_body(self._sock, _MAX_FRAME)
                if body is None:
                    break
                msg = self._rx.open(memoryview(body))
                if self._on_message and isinstance(msg, dict):
                    self._on_message(msg)
        except (OSError, ValueError, ConnectionError):
            pass
        if not self._closing and self._on_lost:
            self._on_lost()

    def _write(self, msgs: list) -> bool:
        if not msgs:
            return True
        msg = msgs[0] if len(msgs) == 1 else {"kind": "batch", "items": msgs}
        try:
            self._sock.sendall(self._tx.seal(msg))  # callers hold self._lock
            return True
        except OSError:
            return False

    def _take(self) -> list:
        with self._pending_lock:
            msgs, self._pending, self._merged, self._pending_bytes = self._pending, [], {}, 0
            return msgs

    def send(self, kind: str, **fields) -> bool:
        """Send one message now (after what was posted before it); False when the driver is gone."""
        with self._lock:  # nothing posted later can overtake it
            return self._write(self._take() + [{"kind": kind, **fields}])

    def send_apart(self, kind: str, **fields) -> bool:
        """Send one message now in a frame of its own, ahead of what waits for the next batch."""
        with self._lock:
            return self._write([{"kind": kind, **fields}])

    def post(self, kind: str, merge: str | None = None, **fields) -> None:
        """Queue one message for the next batch.

        A message with a ``merge`` key replaces the waiting one with the same key (its ``data`` is
        updated field by field: only the latest progress matters; a progress bar's latest state). A
        message without a key ends that: later ones queue after it, so the order of lines is kept.
        """
        msg = {"kind": kind, **fields}
        with self._pending_lock:
            at = self._merged.get(merge) if merge is not None else None
            if at is not None:
                old = self._pending[at]
                if isinstance(old.get("data"), dict) and isinstance(msg.get("data"), dict):
                    msg["data"] = {**old["data"], **msg["data"]}
                self._pending[at] = msg
                full = False
            else:
                full = self._append(msg, merge, len(str(fields.get("line", ""))))
        if full:
            self.flush()

    def post_line(self, stream: str, line: str) -> None:
        """Queue one finished output line for the next batch, in order with what :meth:`post` queues.

        A run of lines of one stream travels as one ``{"kind": "log", "stream": ..., "lines": [...]}``
        item: the driver parses a string per line instead of an object, and handles the run at once.
        """
        with self._pending_lock:
            last = self._pending[-1] if self._pending else None
            if last is not None and last.get("stream") == stream and "lines" in last:
                last["lines"].append(line)  # nothing merges after it: _merged is empty
                self._pending_bytes += len(line) + 8
                full = self._pending_bytes >= _BATCH_BYTES
            else:
                full = self._append({"kind": "log", "stream": stream, "lines": [line]}, None, len(line))
        if full:
            self.flush()

    def _append(self, msg: dict, merge: str | None, size: int) -> bool:
        # under _pending_lock; True when the batch is full: the driver is behind or the output is huge,
        # so the caller sends it from its own thread and waits for the socket (and so does the process
        # writing the output) instead of queueing without bound
        if merge is None:
            self._merged.clear()
        else:
            self._merged[merge] = len(self._pending)
        self._pending.append(msg)
        self._pending_bytes += size + 64
        if len(self._pending) == 1:
            self._pending_lock.notify()
        return self._pending_bytes >= _BATCH_BYTES

    def flush(self) -> bool:
        """Send what was posted, as one frame."""
        with self._lock:
            return self._write(self._take())

    def _flush_loop(self) -> None:
        while not self._closing:
            with self._pending_lock:
                self._pending_lock.wait_for(lambda: self._pending or self._closing)
            time.sleep(self._window)
            if not self.flush():
                return

    def close(self, timeout: float = 30.0) -> None:
        """Send what is waiting, then hang up once the driver has read it all (or after ``timeout``)."""
        if not self._closing:
            self.flush()
        self._closing = True
        with self._pending_lock:
            self._pending_lock.notify_all()
        try:
            # Closing now could reset the connection while the driver is still behind on reading it
            # (the kernel drops what it had not read): end the sending side, wait for its hang-up.
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if threading.current_thread() is not self._reader:
            self._reader.join(timeout)
        self._sock.close()
