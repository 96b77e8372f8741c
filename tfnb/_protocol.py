"""What crosses the wire, one vocabulary for both ends: the channel's frames and message kinds (:class:`Msg`), a
run's events (:class:`RunEvent`) and the files, signals and variables between a task and its train_fn process.

A frame is a 4-byte big-endian length and a body; after the handshake (docs/security.md) a body is
``HMAC-SHA256(key, sequence || JSON) || JSON`` with a key per direction, and :meth:`_Sealer.seal` refuses unknown kinds.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import signal
import socket
import struct
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

_MAX_FRAME = 16 << 20    # an authenticated frame (a batch, a long traceback)
_MAX_HELLO = 4 << 10     # the unauthenticated hello: a MAC, a nonce and who the task is
_HANDSHAKE_TIMEOUT = 10.0
_SEND_TIMEOUT = 30.0
_MAC = 32
_HEAD = struct.Struct(">I")


def batch_window(num_tasks: int) -> float:
    """Seconds a task gathers messages into one frame: 0.1 s, up to 0.4 s above 600 tasks (~6,000 frames/s)."""
    return min(0.4, max(0.1, num_tasks / 6000))


def _proof(token: str, label: str, first: str, second: str) -> str:
    return hmac.new(token.encode(), f"{label}|{first}|{second}".encode(), hashlib.sha256).hexdigest()


def _key(token: str, direction: str, server_nonce: str, task_nonce: str) -> bytes:
    return hmac.digest(token.encode(), f"tfnb-channel-1|{direction}|{server_nonce}|{task_nonce}".encode(),
                       "sha256")


class _Sealer:
    """MACs or checks frame bodies of one direction, counting the sequence: RFC 2104 HMAC-SHA256 (``hmac.digest``'s
    bytes) with the key's pads hashed once (a third of the cost for a 1 KB frame) and the frame read in place."""

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
        _check_kinds(msg)
        payload = json.dumps(msg, default=str, separators=(",", ":")).encode()
        mac = self.mac(payload)
        self.seq += 1
        return _HEAD.pack(_MAC + len(payload)) + mac + payload

    def open(self, body: memoryview) -> object:
        if len(body) < _MAC or not hmac.compare_digest(self.mac(body[_MAC:]), body[:_MAC]):
            raise ConnectionError("a frame failed its authentication check")
        self.seq += 1
        return json.loads(str(body[_MAC:], "utf-8"))  # from str: json.loads(bytes) guesses the encoding first


class Msg(str, Enum):
    """The ``kind`` of a channel message; a ``str`` enum, so it equals, prints and serialises as its value."""

    __str__, __repr__ = str.__str__, str.__repr__

    # task -> driver
    LOG = "log"              # stream, then line (partial: a progress bar's latest state) or lines
    EVENT = "event"          # event (an EventKind), data
    STATE = "state"          # state (starting, training, serving, done, stopped), pid, gpus
    FAILED = "failed"        # failure: the TaskFailure fields
    STACK = "stack"          # text: the train_fn process's thread stacks, answering DUMP
    ADDR = "addr"            # addr, rows: where this task's TensorFlow server listens, the rows it was fed
    FEED = "feed"            # rows, done; from the driver: counts or safe (tfnb.data.feeding)
    # driver -> task
    WELCOME = "welcome"      # auth: the handshake's last step (unsealed)
    CLUSTER = "cluster"      # tasks: every task's addr and rows
    STOP = "stop"
    END = "end"              # every train_fn returned: lingering train_fn processes may exit
    DUMP = "dump"            # send your stacks (the stall watchdog)
    RESIZE = "resize"        # an elastic run stops at its next epoch boundary to be relaunched at another size
    # either way
    BATCH = "batch"          # items: messages gathered into one frame
    DISCONNECTED = "disconnected"  # never sent: what the driver's channel hands on when a task hangs up


_KINDS = frozenset(Msg)


def _check_kinds(msg) -> None:
    kind = msg.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"channel message kind {kind!r} is not one of tfnb._protocol.Msg "
                         f"({', '.join(k.value for k in Msg)}); add it there")
    if kind == Msg.BATCH:
        for item in msg["items"]:
            _check_kinds(item)


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


VERSION = "0.1.0"  # tfnb's version (tfnb.__version__): the driver's and each executor's must be the same


class EventKind(str, Enum):
    """The kinds of :class:`RunEvent`, for displays and add-ons; a ``str`` enum: ``EventKind.STATE == "state"``."""

    __str__, __repr__ = str.__str__, str.__repr__

    LOG = "log"            # data: stream ("stdout"/"stderr"), line
    PROGRESS = "progress"  # data: whatever train_fn reported (epoch, step, loss, examples_per_sec, ...)
    STATE = "state"        # data: state ("starting", "training", "done", "stopped", "failed")
    FAILED = "failed"      # data: the TaskFailure fields
    ATTEMPT = "attempt"    # data: attempt, max_attempts, reason (driver-side, job_name "driver")
    # a sweep's, from its loop alone: job_name "sweep", or "trial" with task_index the trial's number
    BEGIN = "begin"        # data: n_trials, at_once, metric, direction, slots_per_trial, study, mlflow_run_id, ...
    TRIAL = "trial"        # data: trial, its TrialResult: the row changed (launched, epoch end, state)
    LINES = "lines"        # data: trial, lines: what its tasks printed
    FINISH = "finish"      # data: result, the SweepResult


LOG, PROGRESS, STATE, FAILED, ATTEMPT = (EventKind.LOG, EventKind.PROGRESS, EventKind.STATE, EventKind.FAILED,
                                         EventKind.ATTEMPT)  # short names: events.STATE


@dataclass(frozen=True)
class RunEvent:
    """One thing that happened in a run or a sweep (its ``kind``: an :class:`EventKind`), as a display receives it."""

    kind: str
    job_name: str
    task_index: int
    data: Mapping[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    @property
    def label(self) -> str:
        return f"{self.job_name} {self.task_index}" if self.job_name != "driver" else "tfnb"

    @property
    def trial(self):
        """A sweep's ``trial`` and ``lines`` events: the trial's :class:`~tfnb.TrialResult`; else None."""
        return self.data.get("trial") if self.kind in (EventKind.TRIAL, EventKind.LINES) else None

    @property
    def lines(self) -> tuple:
        """A sweep's ``lines`` event: what the trial's tasks printed; else ``()``."""
        return tuple(self.data.get("lines", ())) if self.kind == EventKind.LINES else ()

    @property
    def result(self):
        """A sweep's ``finish`` event: its :class:`~tfnb.SweepResult`; else None."""
        return self.data.get("result") if self.kind == EventKind.FINISH else None


def number(value: Any) -> float | None:
    """A number, numpy scalar or scalar tensor as float; None for anything else (bools included)."""
    if type(value) is float or type(value) is int:  # what JSON gives the driver, many times a second
        return float(value)
    try:
        value = value.numpy() if hasattr(value, "numpy") else value
        if getattr(value, "size", 1) != 1:
            return None
        value = value.item() if hasattr(value, "item") else value
        return None if isinstance(value, bool) else float(value)
    except Exception:  # noqa: BLE001 - a symbolic or odd value is simply not reported
        return None


# between a task and its train_fn process
PAYLOAD, CONTEXT, RESULT, ERROR = "payload.pkl", "ctx.pkl", "result.pkl", "error.json"
STACKS = "stacks.txt"  # the Python stack of every thread, appended on each DUMP_SIGNAL
DUMP_SIGNAL = signal.SIGUSR1
ENV_FD, ENV_HELD_PORT_FD, ENV_KEPT_PORT_FD = "TFNB_EVENT_FD", "TFNB_HELD_PORT_FD", "TFNB_KEPT_PORT_FD"
ENV_PREIMPORT = "TFNB_PREIMPORT"
GO = b"go\n"
END = b"end\n"  # after train_fn returned (payload "linger"): every peer's train_fn has returned too
FINISHED = "finished"  # the event this process sends when train_fn returned and it waits for END
PIPE_KINDS = frozenset((LOG, PROGRESS, STATE, FAILED, ATTEMPT, FINISHED))  # what the events pipe carries: no sweep's
