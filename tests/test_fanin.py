"""Fan-in: a burst far above the driver's rate loses no line, state or failure and stays bounded;
progress bars are folded at the source and the run's log file keeps every line.

The burst test runs the real DriverChannel and the driver's real message path (``cluster._Attempt``:
inbox, run log, RunEvents to the display) against real TaskChannels on loopback, no Spark. The last
test runs a real Keras progress bar inside ``tfnb.run`` on Spark local[2].
"""
from __future__ import annotations

import io
import os
import re
import threading
from collections import defaultdict

import pytest

from tfnb.launcher.channel import DriverChannel
from tfnb._task.channel import TaskChannel
from tfnb._task.supervisor import _MAX_LINE, _Lines
from tfnb.launcher.attempt import _Attempt
from tfnb.launcher.hooks import LaunchHooks
from tfnb.launcher.options import RunOptions

TASKS = 32
LINES = 500        # per task
REPORTS = 300      # progress reports per task, one epoch end every 100
BOUND = 100        # the driver's queue bound for this test: far below what is sent


def _burst_task(address, token, index, start):
    chan = TaskChannel(address, token, {"job_name": "worker", "task_index": index, "rank": index,
                                        "host": "127.0.0.1"}, window=0.05)
    start.wait()
    chan.send("state", state="training")
    for i in range(max(LINES, REPORTS)):
        if i < LINES:
            chan.post_line("stdout", f"task {index} line {i}")
        if i < REPORTS:
            end = (i + 1) % 100 == 0
            data = {"step": i + 1, "loss": 1.0 / (i + 1), **({"epoch_end": True} if end else {})}
            if i == 0:  # as the supervisor sends a task's first report: at once, never merged away
                chan.send("event", event="progress", data=data, first=True)
            else:
                chan.post("event", merge=None if end else "progress", event="progress", data=data)
    if index % 8 == 0:
        chan.send("failed", failure={"exc_type": "ValueError", "message": f"task {index} gave up", "traceback": ""})
    else:
        chan.send("state", state="done")
    chan.close()


@pytest.mark.timeout(300)
def test_a_burst_far_above_the_drivers_rate_loses_no_line_state_or_failure(tmp_path):
    seen = defaultdict(list)

    def display(event):
        seen[(event.kind, event.task_index if event.job_name == "worker" else event.job_name)].append(dict(event.data))

    att = _Attempt(None, dict(run_id="burst", attempt=1, num_workers=TASKS),
                   RunOptions(TASKS, max_attempts=1, model_dir=str(tmp_path)), LaunchHooks(), display)
    att.q.bound = BOUND
    att.channel = DriverChannel("127.0.0.1", att._on_message)
    start = threading.Event()
    senders = [threading.Thread(target=_burst_task, args=(att.channel.address, att.channel.token, i, start))
               for i in range(TASKS)]
    try:
        for t in senders:
            t.start()
        start.set()
        gone = 0
        while gone < TASKS:
            # no timeout: a message the inbox holds without waking its reader hangs here
            (item,) = att.q.get_many(None, 1)
            if item[2].get("kind") == "disconnected":
                gone += 1
            else:
                att._handle(item[1], item[2])
        for t in senders:
            t.join(30)
    finally:
        att.q.put(("closed",))
        att.channel.close()
        att.runlog.close()

    sent = TASKS * (LINES + REPORTS + 2)
    assert att.q.peak <= BOUND + 2 * TASKS + 2000, f"the queue held {att.q.peak} of {sent} messages at once"
    assert seen[("state", "driver")] == [{"log_file": str(tmp_path / "tfnb-logs" / "run-burst.log")}]
    assert att.channel.rejected == 0
    file_lines = (tmp_path / "tfnb-logs" / "run-burst.log").read_text().splitlines()
    for i in range(TASKS):
        # every line, once and in order, on the display and in the run's log file
        assert [d["line"] for d in seen[("log", i)]] == [f"task {i} line {n}" for n in range(LINES)]
        assert sum(f" worker {i} stdout: task {i} line " in x for x in file_lines) == LINES
        states = [d["state"] for d in seen[("state", i)]]
        if i % 8 == 0:
            assert states == ["training"] and seen[("failed", i)][0]["message"] == f"task {i} gave up"
        else:
            assert states == ["training", "done"]
        reports = seen[("progress", i)]
        # the first report and every epoch end arrive; reports in between may be merged, the latest value wins
        assert reports[0]["step"] == 1
        assert [d["step"] for d in reports if d.get("epoch_end")] == list(range(100, REPORTS + 1, 100))
        assert reports[-1]["step"] == REPORTS and len(reports) <= REPORTS
    assert sum(len(seen[("progress", i)]) for i in range(TASKS)) + att.q.dropped <= TASKS * REPORTS
    assert any("FAILED ValueError: task 0 gave up" in x for x in file_lines)


def test_ctrl_c_during_a_pass_leaves_what_it_did_not_handle_for_the_next(tmp_path):
    shown = []
    att = _Attempt(None, dict(run_id="ctrl-c", attempt=1, num_workers=1),
                   RunOptions(1, max_attempts=1, model_dir=str(tmp_path)), LaunchHooks(), shown.append)
    peer = {"job_name": "chief", "task_index": 0, "rank": 0}
    for i in range(10):
        att.q.put_message(peer, {"kind": "log", "stream": "stdout", "lines": [f"line {i}", f"more {i}"]})
    handle, calls = att._handle, []

    def interrupted(peer, msg):
        calls.append(msg)
        if len(calls) == 4:
            raise KeyboardInterrupt  # pressed while the fourth message was being handled
        handle(peer, msg)

    att._handle = interrupted
    with pytest.raises(KeyboardInterrupt):
        att._drain(1.0)
    att._handle = handle
    att._drain(1.0)
    att.runlog.close()
    lines = [e.data["line"] for e in shown if e.kind == "log"]
    assert lines == [x for i in range(10) if i != 3 for x in (f"line {i}", f"more {i}")]
    assert att.q.qsize() == 0


# ---------------------------------------------------------------- carriage returns and long lines


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _fold(chunks, clock=None):
    out = []
    lines = _Lines(lambda line, partial=False: out.append((line, partial)), **({"clock": clock} if clock else {}))
    for c in chunks:
        lines.feed(c)
    lines.end()
    return out


def keras_bar(steps: int) -> bytes:
    """What tf-keras' Progbar writes on a pipe: backspaces, a carriage return, the new state."""
    out, prev = [], 0
    for s in range(1, steps + 1):
        text = f"{s:4d}/{steps} [{'=' * (30 * s // steps):<30}] - ETA: 0s - loss: {1 / s:.4f}"
        out.append("\b" * prev + "\r" + text)
        prev = len(text)
    out.append(" - 3s 2ms/step - loss: 0.0100\n")
    return "".join(out).encode()


def test_a_keras_bar_arrives_as_its_latest_state():
    data = b"Epoch 1/2\n" + keras_bar(2000) + b"done\r\n" + b"tail without newline"
    clock = Clock()
    out = _fold([data[i:i + 4096] for i in range(0, len(data), 4096)], clock)  # one burst: no time passes
    finals = [line for line, partial in out if not partial]
    assert finals == ["Epoch 1/2", f"2000/2000 [{'=' * 30}] - ETA: 0s - loss: 0.0005 - 3s 2ms/step - loss: 0.0100",
                      "done", "tail without newline"]
    assert [line for line, partial in out if partial] == [f"   1/2000 [{'':<30}] - ETA: 0s - loss: 1.0000"]
    # split anywhere, even inside a UTF-8 character, the result is the same
    text = "é\r" * 3 + "ü\n"
    assert _fold([bytes([b]) for b in text.encode()], Clock()) == [("é", True), ("ü", False)]


def test_updates_are_sent_at_most_once_a_second_and_long_lines_are_cut():
    clock = Clock()
    out = []
    lines = _Lines(lambda line, partial=False: out.append((line, partial)), clock=clock)
    for s in range(50):
        clock.now = s * 0.1  # 10 updates a second for 5 s
        lines.feed(f"\rstep {s}".encode())
    lines.feed(b"\n")
    assert [x for x in out if x[1]] == [(f"step {s}", True) for s in range(0, 50, 10)]
    assert out[-1] == ("step 49", False)

    out = _fold([b"x" * (_MAX_LINE + 10) + b"\n"])
    assert len(out) == 1 and out[0][0].endswith("… [10 more characters cut]")


# ---------------------------------------------------------------- through tfnb.run


def keras_progbar_fn(ctx):
    import tf_keras

    print("before the bar", flush=True)
    bar = tf_keras.utils.Progbar(target=3000)
    for step in range(1, 3001):
        bar.update(step, values=[("loss", 1.0 / step)])
    for i in range(200):
        print(f"line {i}", flush=True)
    return "ok"


def test_keras_bar_through_tfnb_run_is_one_line_per_worker_and_the_log_file_has_everything(spark, tmp_path):
    import tfnb
    from tfnb.notebook.console import ConsoleDisplay

    out = io.StringIO()
    console = ConsoleDisplay(out, num_workers=2, tty=False)
    events = []

    def display(event):
        events.append(event)
        console(event)

    assert tfnb.run(keras_progbar_fn, num_workers=2, spark=spark, model_dir=str(tmp_path), display=display) == "ok"
    log_file = [e.data["log_file"] for e in events if e.job_name == "driver" and "log_file" in e.data]
    assert len(log_file) == 1 and log_file[0].startswith(str(tmp_path))
    text = open(log_file[0]).read()
    for worker in ("chief 0", "worker 1"):
        lines = [e.data for e in events if e.kind == "log" and e.label == worker]
        finals = [d["line"] for d in lines if not d.get("partial")]
        bar_lines = [line for line in finals if re.match(r"\s*\d+/3000 \[", line)]
        assert len(bar_lines) == 1 and bar_lines[0].startswith("3000/3000 ["), finals[:5]
        assert len(bar_lines[0]) < 200
        assert sum(1 for d in lines if d.get("partial")) < 30
        assert finals[-200:] == [f"line {i}" for i in range(200)]
        # the file keeps every finished line, not the intermediate bar states
        for line in ["before the bar", bar_lines[0], "line 0", "line 199"]:
            assert f"{worker} stdout: {line}\n" in text
        assert text.count(f"{worker} stdout: line ") == 200
    printed = out.getvalue().splitlines()
    assert not any(len(p) > 2100 for p in printed)
    assert sum("/3000 [" in p for p in printed) <= 2 * 30


# ---------------------------------------------------------------- where the run's log file goes


def test_the_run_log_is_local_never_at_a_remote_url(tmp_path, monkeypatch):
    from tfnb.launcher.runlog import RunLog, run_log_path

    monkeypatch.setenv("TFNB_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir()
    assert run_log_path("r1", str(tmp_path / "model")) == str(tmp_path / "model" / "tfnb-logs" / "run-r1.log")
    private = str(tmp_path / "state" / f"tfnb-runs-{os.getuid()}" / "r2" / "run.log")
    for remote in ("s3://bucket/model", "dbfs:/models/m", "gs://b/m"):
        assert run_log_path("r2", remote) == private
    # a model_dir that cannot be written: the private run folder instead, and the run goes on
    blocked = tmp_path / "file"
    blocked.write_text("")
    runlog = RunLog.for_run("r3", str(blocked / "model"))
    runlog.message({"job_name": "chief", "task_index": 0}, {"kind": "log", "stream": "stderr", "line": "kept"})
    runlog.close()
    assert runlog.path.endswith(os.path.join("r3", "run.log"))
    assert open(runlog.path).read().endswith(" chief 0 stderr: kept\n")
