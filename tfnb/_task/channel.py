"""The task's end of the run's channel: one authenticated connection to the driver, batching what it sends
(see :mod:`tfnb._protocol` for the frames and the handshake)."""
from __future__ import annotations

import contextlib
import hmac
import json
import secrets
import socket
import threading
import time
from typing import Callable

from .._protocol import _MAX_FRAME, _MAX_HELLO, Msg, _key, _plain, _proof, _recv_body, _Sealer

_BATCH_BYTES = 256 << 10  # a task sends its batch early when this much is waiting


class TaskChannel:
    """One authenticated connection to the driver (ConnectionError when either side fails the secret). What
    :meth:`post` queues waits up to ``window`` seconds (None: until :meth:`flush`) to share a frame; :meth:`send`
    goes out at once, after it. ``on_message`` runs on a reader thread; ``on_lost`` once if the driver goes away."""

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
        self._pending_bytes, self._window, self._on_message, self._on_lost = 0, window, on_message, on_lost
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
        if not isinstance(welcome, dict) or welcome.get("kind") != Msg.WELCOME:
            raise ConnectionError("the tfnb driver channel refused this task (wrong run secret?)")
        if not hmac.compare_digest(str(welcome.get("auth", "")), _proof(token, "driver", tn, sn)):
            raise ConnectionError(f"the server at {self._sock.getpeername()} could not prove it knows the "
                                  "run's secret; this task will not talk to it")
        return _Sealer(_key(token, "task", sn, tn)), _Sealer(_key(token, "driver", sn, tn))

    def _read_loop(self) -> None:
        with contextlib.suppress(OSError, ValueError, ConnectionError):
            while (body := _recv_body(self._sock, _MAX_FRAME)) is not None:
                msg = self._rx.open(memoryview(body))
                if self._on_message and isinstance(msg, dict):
                    self._on_message(msg)
        if not self._closing and self._on_lost:
            self._on_lost()

    def _write(self, msgs: list) -> bool:
        if not msgs:
            return True
        msg = msgs[0] if len(msgs) == 1 else {"kind": Msg.BATCH, "items": msgs}
        try:
            self._sock.sendall(self._tx.seal(msg))  # callers hold self._lock
            return True
        except OSError:
            return False

    def send(self, kind: Msg, **fields) -> bool:
        """Send one message now (after what was posted before it); False when the driver is gone."""
        return self.flush({"kind": kind, **fields})

    def send_apart(self, kind: Msg, **fields) -> bool:
        """Send one message now in a frame of its own, ahead of what waits for the next batch."""
        with self._lock:
            return self._write([{"kind": kind, **fields}])

    def post(self, kind: Msg, merge: str | None = None, **fields) -> None:
        """Queue one message for the next batch; one with a ``merge`` key replaces the waiting one with that key
        (``data`` updated field by field), one without ends that, keeping the order of lines."""
        msg = {"kind": kind, **fields}
        with self._pending_lock:
            at = self._merged.get(merge) if merge is not None else None
            if at is not None:
                if "data" in msg:  # one merge key, one kind: a progress event's fields
                    msg["data"] = {**self._pending[at]["data"], **msg["data"]}
                self._pending[at] = msg
                full = False
            else:
                full = self._append(msg, merge, len(str(fields.get("line", ""))))
        if full:
            self.flush()

    def post_line(self, stream: str, line: str) -> None:
        """Queue one output line, in order with :meth:`post`; a run of lines of one stream travels as one ``log``
        item with ``lines`` (a string per line for the driver to parse, not an object)."""
        with self._pending_lock:
            last = self._pending[-1] if self._pending else None
            if last is not None and last.get("stream") == stream and "lines" in last:
                last["lines"].append(line)  # nothing merges after it: _merged is empty
                self._pending_bytes += len(line) + 8
                full = self._pending_bytes >= _BATCH_BYTES
            else:
                full = self._append({"kind": Msg.LOG, "stream": stream, "lines": [line]}, None, len(line))
        if full:
            self.flush()

    def _append(self, msg: dict, merge: str | None, size: int) -> bool:
        # under _pending_lock; True when full: the caller sends it, waiting for the socket, instead of queueing more
        if merge is None:
            self._merged.clear()
        else:
            self._merged[merge] = len(self._pending)
        self._pending.append(msg)
        self._pending_bytes += size + 64
        if len(self._pending) == 1:
            self._pending_lock.notify()
        return self._pending_bytes >= _BATCH_BYTES

    def flush(self, *last: dict) -> bool:
        """Send what was posted (and ``last``), as one frame."""
        with self._lock:  # nothing posted later can overtake it
            with self._pending_lock:
                msgs, self._pending, self._merged, self._pending_bytes = self._pending, [], {}, 0
            return self._write(msgs + list(last))

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
        # closing now could reset the connection before the driver read it all: end our side, wait for its
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)
        if threading.current_thread() is not self._reader:
            self._reader.join(timeout)
        self._sock.close()
