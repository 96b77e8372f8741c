"""The run's channel under attack: real sockets on loopback, no Spark.

Each test runs a real DriverChannel and real TaskChannels (or a raw socket playing the attacker) and
checks what the driver hands on and which connections it closes.
"""
from __future__ import annotations

import json
import os
import queue
import select
import socket
import struct
import threading

import pytest

from tfnb._protocol import _MAC, _MAX_FRAME, PIPE_KINDS, EventKind, Msg
from tfnb.launcher.channel import DriverChannel
from tfnb._task.channel import TaskChannel

PEER = {"job_name": "worker", "task_index": 1, "rank": 1, "host": "127.0.0.1"}


class Received:
    """The driver's on_message: every message, flattened out of batches, in a queue."""

    def __init__(self):
        self.q = queue.Queue()

    def __call__(self, peer, msg):
        for m in msg["items"] if msg.get("kind") == "batch" else [msg]:
            self.q.put((peer.get("task_index"), m))

    def next(self, timeout=10.0):
        return self.q.get(timeout=timeout)

    def lines(self):
        out = []
        while True:
            try:
                out.append(self.q.get_nowait())
            except queue.Empty:
                return out


@pytest.fixture
def driver():
    got = Received()
    chan = DriverChannel("127.0.0.1", got)
    chan.got = got
    yield chan
    chan.close()


def _task(driver, index=1, **kw):
    return TaskChannel(driver.address, driver.token, dict(PEER, task_index=index), **kw)


def _closed_by_peer(sock: socket.socket, timeout=10.0) -> bool:
    """True once the other end has closed the connection (reads end or reset)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def _raw(driver) -> tuple[socket.socket, dict]:
    """A raw connection and the driver's challenge."""
    sock = socket.create_connection(driver.address, timeout=10)
    (n,) = struct.unpack(">I", sock.recv(4, socket.MSG_WAITALL))
    return sock, json.loads(sock.recv(n, socket.MSG_WAITALL))


def test_messages_flow_both_ways_in_batches(driver):
    stops = queue.Queue()
    task = _task(driver, on_message=stops.put, window=None)
    try:
        task.post("log", stream="stdout", line="one")
        task.post("event", merge="progress", event="progress", data={"step": 1, "loss": 0.5})
        task.post("event", merge="progress", event="progress", data={"step": 2})
        task.send("state", state="done")
        got = [driver.got.next()[1] for _ in range(3)]
        assert got[0] == {"kind": "log", "stream": "stdout", "line": "one"}
        # two reports waiting in the same batch arrive as one, with the latest value of each field
        assert got[1]["data"] == {"step": 2, "loss": 0.5}
        assert got[2] == {"kind": "state", "state": "done"}
        assert driver.got.lines() == []
        driver.broadcast({"kind": "stop"})
        assert stops.get(timeout=10) == {"kind": "stop"}
    finally:
        task.close()


def test_every_kind_round_trips_both_ways_and_an_unknown_one_is_refused(driver):
    heard = queue.Queue()
    task = _task(driver, on_message=heard.put, window=None)
    kinds = [k for k in Msg if k is not Msg.BATCH]  # a batch is how post() sends several: below
    try:
        for k in kinds:
            task.send(k, n=1)
        assert [driver.got.next()[1] for _ in kinds] == [{"kind": k.value, "n": 1} for k in kinds]
        for k in EventKind:
            task.post(Msg.EVENT, event=k, data={})
        task.flush()
        assert [driver.got.next()[1] for _ in EventKind] == [{"kind": "event", "event": k.value, "data": {}}
                                                           for k in EventKind]
        for k in Msg:
            driver.broadcast({"kind": k, "items": []} if k is Msg.BATCH else {"kind": k, "n": 2})
        assert [heard.get(timeout=10) for _ in Msg] == [{"kind": k.value, "items": []} if k is Msg.BATCH
                                                          else {"kind": k.value, "n": 2} for k in Msg]
        with pytest.raises(ValueError, match="kind 'progres' is not one of tfnb._protocol.Msg"):
            task.send("progres", n=3)
        with pytest.raises(ValueError, match="kind 'halt' is not one of"):
            driver.broadcast({"kind": "halt"})
        with pytest.raises(ValueError, match="kind 'lgo' is not one of"):
            task.post(Msg.LOG, stream="stdout", line="kept")
            task.post("lgo", line="x")
            task.flush()  # a batch is checked item by item
        task.send(Msg.STATE, state="done")  # the connection survived the refusals
        assert driver.got.next()[1] == {"kind": "state", "state": "done"}
    finally:
        task.close()


def test_the_events_pipe_carries_every_event_kind_and_refuses_others(monkeypatch):
    from tfnb._task import events

    read, write = os.pipe()
    monkeypatch.setenv("TFNB_EVENT_FD", str(write))
    monkeypatch.setattr(events, "_stream", None)
    with os.fdopen(read) as received:
        try:
            for k in sorted(PIPE_KINDS):
                events.emit(k, n=1)
            with pytest.raises(ValueError, match="event kind 'epoch' is not one of tfnb._protocol.EventKind"):
                events.emit("epoch", n=1)
        finally:
            events._stream.close()  # not its descriptor (closefd=False): that one ends the pipe
            os.close(write)
        assert [json.loads(line)["kind"] for line in received] == sorted(PIPE_KINDS)


def test_a_run_of_lines_travels_as_one_item_in_order_with_the_rest(driver):
    task = _task(driver, window=None)
    try:
        task.post_line("stdout", "a")
        task.post_line("stdout", "b")
        task.post_line("stderr", "c")
        task.post("log", merge="stdout", stream="stdout", line="bar 1", partial=True)
        task.post("log", merge="stdout", stream="stdout", line="bar 2", partial=True)
        task.post_line("stdout", "d")
        task.send("state", state="done")
        got = [driver.got.next()[1] for _ in range(5)]
        assert got == [{"kind": "log", "stream": "stdout", "lines": ["a", "b"]},
                       {"kind": "log", "stream": "stderr", "lines": ["c"]},
                       {"kind": "log", "stream": "stdout", "line": "bar 2", "partial": True},
                       {"kind": "log", "stream": "stdout", "lines": ["d"]},
                       {"kind": "state", "state": "done"}]
    finally:
        task.close()


def test_wrong_token_is_refused(driver):
    with pytest.raises(ConnectionError, match="refused"):
        TaskChannel(driver.address, "not-the-secret", PEER)
    honest = _task(driver)
    honest.send("log", stream="stdout", line="still here")
    assert driver.got.next() == (1, {"kind": "log", "stream": "stdout", "line": "still here"})
    honest.close()
    assert driver.got.next() == (1, {"kind": "disconnected"})
    assert driver.got.lines() == []  # nothing from the refused one
    assert driver.rejected == 1


def test_tampered_forged_and_replayed_frames_close_only_that_connection(driver):
    honest = _task(driver, index=0)
    victim_lost = threading.Event()
    victim = _task(driver, index=1, on_lost=victim_lost.set)
    victim.send("log", stream="stdout", line="genuine")
    assert driver.got.next() == (1, {"kind": "log", "stream": "stdout", "line": "genuine"})

    # someone on the path flips one byte of the next frame: "loss": 0.9 becomes "loss": 0.1
    frame = bytearray(victim._tx.seal({"kind": "event", "event": "progress", "data": {"loss": 0.9}}))
    frame[frame.rindex(b"0.9") + 2] = ord("1")
    victim._sock.sendall(bytes(frame))
    assert victim_lost.wait(10), "the driver kept a connection that sent a tampered frame"

    honest.send("log", stream="stdout", line="after")
    got = [driver.got.next() for _ in range(2)]
    assert (1, {"kind": "disconnected"}) in got and (0, {"kind": "log", "stream": "stdout", "line": "after"}) in got
    assert driver.rejected == 1

    # a replayed genuine frame on a new connection: its sequence number does not match
    replayer = _task(driver, index=2)
    genuine = replayer._tx.seal({"kind": "log", "stream": "stdout", "line": "once"})
    replayer._sock.sendall(genuine + genuine)
    assert driver.got.next() == (2, {"kind": "log", "stream": "stdout", "line": "once"})
    assert driver.got.next() == (2, {"kind": "disconnected"})

    # a frame sent without the handshake is taken as a hello and refused
    sock, _ = _raw(driver)
    body = json.dumps({"kind": "log", "line": "injected"}).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)
    assert _closed_by_peer(sock)
    sock.close()
    honest.send("log", stream="stdout", line="end")
    assert driver.got.next() == (0, {"kind": "log", "stream": "stdout", "line": "end"})
    assert driver.rejected == 3
    honest.close()


def test_a_16_mib_garbage_hello_is_cut_off(driver):
    sock, _ = _raw(driver)
    garbage = os.urandom(16 << 20)
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        # the driver closes after the length prefix, so this send fails long before its end
        sock.sendall(garbage)
    sock.close()
    # a small length prefix with garbage behind it: not JSON, refused too
    sock, _ = _raw(driver)
    sock.sendall(struct.pack(">I", 100) + os.urandom(100))
    assert _closed_by_peer(sock)
    sock.close()
    task = _task(driver)
    task.send("log", stream="stdout", line="fine")
    assert driver.got.next()[1]["line"] == "fine"
    task.close()


def test_an_authenticated_frame_over_the_size_limit_closes_only_that_connection(driver):
    honest = _task(driver, index=0)
    lost = threading.Event()
    big = _task(driver, index=1, on_lost=lost.set)
    # a frame of exactly the limit, authenticated, is taken
    head = len(json.dumps({"kind": "log", "line": ""}, separators=(",", ":")))
    line = "x" * (_MAX_FRAME - _MAC - head)
    frame = big._tx.seal({"kind": "log", "line": line})
    assert len(frame) == 4 + _MAX_FRAME
    big._sock.sendall(frame)
    assert driver.got.next() == (1, {"kind": "log", "line": line})
    # one byte more: the driver closes the connection on reading the length, before any of the body
    over = big._tx.seal({"kind": "log", "line": line + "x"})
    big._sock.sendall(over[:4 + _MAC])
    assert lost.wait(10), "the driver kept a connection announcing an oversized frame"
    assert driver.got.next() == (1, {"kind": "disconnected"}) and driver.rejected == 1
    honest.send("log", stream="stdout", line="still here")
    assert driver.got.next() == (0, {"kind": "log", "stream": "stdout", "line": "still here"})
    assert driver.got.lines() == []
    honest.close()
    big.close()


def test_slow_and_idle_connections_are_capped_and_timed_out():
    got = Received()
    chan = DriverChannel("127.0.0.1", got, max_pending=4, handshake_timeout=30)
    idle = []
    try:
        for _ in range(20):
            idle.append(socket.create_connection(chan.address, timeout=10))
        challenged = set()
        while len(challenged) < 4:  # the first max_pending get their challenge, however busy the machine
            ready, _, _ = select.select([s for s in idle if s not in challenged], [], [], 30)
            assert ready, f"only {len(challenged)} connections were challenged"
            challenged.update(ready)
        # only max_pending connections are being served before they authenticate, on no extra thread: a
        # fifth would have its challenge at once, so a second without one shows there is none
        assert select.select([s for s in idle if s not in challenged], [], [], 1.0)[0] == []
        assert [t.name for t in threading.enumerate() if t.name.startswith("tfnb-channel")] == ["tfnb-channel"]
        for s in idle:
            s.close()
        task = _task(chan)  # served once the idle ones are gone
        task.send("log", stream="stdout", line="in")
        assert got.next()[1]["line"] == "in"
        task.close()
    finally:
        for s in idle:
            s.close()
        chan.close()

    # a sender dribbling its hello is cut off at the handshake deadline
    chan = DriverChannel("127.0.0.1", got, handshake_timeout=1.0)
    try:
        sock, _ = _raw(chan)
        sock.sendall(b"\x00\x00")
        assert _closed_by_peer(sock)
        sock.close()
        assert chan.rejected == 1
    finally:
        chan.close()


def _fake_driver(welcome_auth: str | None):
    """A server that does not know the run's secret, answering the hello with ``welcome_auth``."""
    listener = socket.create_server(("127.0.0.1", 0))
    heard = {}

    def serve():
        conn, _ = listener.accept()
        with conn:
            body = json.dumps({"nonce": "0" * 32}).encode()
            conn.sendall(struct.pack(">I", len(body)) + body)
            (n,) = struct.unpack(">I", conn.recv(4, socket.MSG_WAITALL))
            heard["hello"] = json.loads(conn.recv(n, socket.MSG_WAITALL))
            body = json.dumps({"kind": "welcome", "auth": welcome_auth}).encode()
            conn.sendall(struct.pack(">I", len(body)) + body)
            heard["after"] = conn.recv(65536)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return listener, t, heard


@pytest.mark.parametrize("auth", [None, "0" * 64])
def test_a_task_refuses_a_driver_that_cannot_prove_the_secret(auth):
    listener, t, heard = _fake_driver(auth)
    try:
        with pytest.raises(ConnectionError, match="could not prove"):
            TaskChannel(listener.getsockname(), "the-real-secret", PEER)
        t.join(10)
        assert "the-real-secret" not in json.dumps(heard["hello"])
        assert heard["after"] == b""  # the task sent nothing more and hung up
    finally:
        listener.close()
