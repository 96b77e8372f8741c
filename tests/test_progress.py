"""The live progress display: widget model and HTML, console output, and a real 2-worker run."""
from __future__ import annotations

import copy
import io
import json
import re
import threading
import time

import pytest
import browser
from browser import chromium_page, jupyter_lab  # noqa: F401  (fixtures)

from tfnb.errors import ConfigError, WorkerError
from tfnb._protocol import RunEvent
from tfnb._task.callbacks import keras_callback
from tfnb.notebook import ProgressWidget
from tfnb.monitor.display import make_display
from tfnb.monitor.progress import CHART_TASKS, SUMMARY_ABOVE
from tfnb.notebook.console import ConsoleDisplay

EPOCHS, STEPS, BATCH = 2, 4, 16


def _ev(kind, job, idx, **data):
    return RunEvent(kind, job, idx, data)


def _rows(table: str) -> list[list[str]]:
    """The cells of a rendered table, row by row, as text."""
    return [[re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", table)]


def _training_events():
    """What a 2-worker run sends, in a plausible order (no TensorFlow needed): the chief got GPU 0,
    worker 1 GPUs 1 and 2."""
    out = []
    for job, idx, gpus in (("chief", 0, ["0"]), ("worker", 1, ["1", "2"])):
        out.append(_ev("state", job, idx, state="starting", pid=10 + idx, gpus=gpus))
    for job, idx in (("chief", 0), ("worker", 1)):
        out.append(_ev("state", job, idx, state="training", pid=20 + idx))
        out.append(_ev("log", job, idx, stream="stdout", line=f"hello from {job} <{idx}>"))
        out.append(_ev("progress", job, idx, epochs=EPOCHS, steps=STEPS, batch_size=BATCH))
    for epoch in range(1, EPOCHS + 1):
        for step in range(1, STEPS + 1):
            for job, idx in (("chief", 0), ("worker", 1)):
                out.append(_ev("progress", job, idx, epoch=epoch, epochs=EPOCHS, step=step, steps=STEPS,
                               loss=1.0 / (epoch * step), accuracy=0.5, steps_per_sec=10.0,
                               examples_per_sec=160.0, batch_size=BATCH))
        for job, idx in (("chief", 0), ("worker", 1)):
            out.append(_ev("progress", job, idx, epoch=epoch, epochs=EPOCHS, step=STEPS, steps=STEPS,
                           loss=0.25 / epoch, accuracy=0.75, epoch_end=True, steps_per_sec=12.0,
                           examples_per_sec=192.0, batch_size=BATCH))
    for job, idx in (("chief", 0), ("worker", 1)):
        out.append(_ev("state", job, idx, state="done"))
    out.append(_ev("state", "driver", 0, state="succeeded", attempt=1))
    return out


# ---------------------------------------------------------------- widget, fed by hand


def test_widget_model_and_html_follow_the_events():
    widget = ProgressWidget(num_workers=2, max_attempts=2, refresh_interval=0)
    assert [w.state for w in widget.run.rows()] == ["pending", "pending"]
    for event in _training_events():
        widget(event)
    widget.close()

    for key in (("chief", 0), ("worker", 1)):
        w = widget.workers[key]
        assert w.history == ["starting", "training", "done"]
        assert (w.epoch, w.epochs, w.step, w.steps) == (EPOCHS, EPOCHS, STEPS, STEPS)
        assert w.loss == pytest.approx(0.125)
        assert w.examples_per_sec == pytest.approx(192.0)
        assert w.metrics == {"accuracy": 0.75}
    table = widget.table.value
    assert table.index("chief 0") < table.index("worker 1")
    # each row says which GPUs its task got, in a column of its own
    assert (widget.workers[("chief", 0)].gpus, widget.workers[("worker", 1)].gpus) == (["0"], ["1", "2"])
    assert [row[:3] for row in _rows(table)] == [["task", "GPUs", "state"], ["chief 0", "0", "done"],
                                                 ["worker 1", "1,2", "done"]]
    assert "done" in table and "2/2" in table and "4/4" in table and "0.125" in table and "192" in table
    assert "Succeeded (attempt 1/2)" in widget.status.value
    # log lines keep their text (the Output area renders text, not HTML) and say which task wrote them
    assert "[chief 0] hello from chief <0>" in widget.log_text()
    assert "[worker 1] hello from worker <1>" in widget.log_text()


def test_widget_escapes_html_from_user_code():
    widget = ProgressWidget(refresh_interval=0)
    widget(_ev("failed", "worker", 1, exc_type="ValueError", message="<script>alert(1)</script>"))
    assert "<script>" not in widget.table.value
    assert "&lt;script&gt;" in widget.table.value
    assert widget.workers[("worker", 1)].state == "failed"


def test_widget_throttles_rendering_and_renders_the_end():
    widget = ProgressWidget(num_workers=1, log_lines=50, refresh_interval=3600)
    first = widget.renders
    for i in range(1000):
        widget(_ev("log", "chief", 0, stream="stderr", line=f"chatty line {i}"))
    assert widget.renders == first  # a thousand lines, no re-render yet
    assert widget.run.logs[-1] == "[chief 0] chatty line 999"
    widget.close()
    assert widget.renders == first + 1
    text = widget.log_text()
    assert "chatty line 999" in text and "chatty line 949" not in text and text.count("\n") == 50


def test_widget_renders_the_latest_state_without_a_further_event():
    widget = ProgressWidget(num_workers=1, refresh_interval=0.05)
    widget(_ev("state", "chief", 0, state="starting"))
    widget(_ev("log", "chief", 0, stream="stdout", line="the last word"))
    done = threading.Event()
    # the trailing render runs on a timer; wait for it (bounded) rather than for another event
    deadline = time.monotonic() + 10
    while "the last word" not in widget.log_text() and time.monotonic() < deadline:
        done.wait(0.02)
    assert "the last word" in widget.log_text()
    assert "starting" in widget.table.value
    widget.close()


def test_widget_relaunch_resets_rows_and_reports_the_attempt():
    widget = ProgressWidget(num_workers=2, refresh_interval=0)
    widget(_ev("state", "chief", 0, state="training"))
    widget(_ev("failed", "worker", 1, exc_type="ProcessDied", message="killed by SIGKILL"))
    widget(_ev("attempt", "driver", 0, attempt=2, max_attempts=3, reason="worker 1: killed by SIGKILL"))
    assert [w.state for w in widget.run.rows()] == ["pending", "pending"]
    assert "attempt 2/3" in widget.status.value and "relaunched after worker 1" in widget.status.value
    widget(_ev("state", "worker", 1, state="starting"))
    widget(_ev("state", "driver", 0, state="failed", attempt=2))
    assert "Failed (attempt 2/3)" in widget.status.value
    widget.close()


def test_a_run_ending_without_an_outcome_shows_as_stopped():
    widget = ProgressWidget(num_workers=1, refresh_interval=0)
    widget(_ev("state", "chief", 0, state="training"))
    assert "Running (attempt 1)" in widget.status.value and "1/1 training" in widget.status.value
    widget.close()  # what tfnb.run does after a Ctrl-C or a timeout: no driver outcome came
    assert "Stopped (attempt 1)" in widget.status.value


def test_a_reused_widget_starts_clean():
    widget = ProgressWidget(num_workers=2, refresh_interval=0)
    for event in _training_events():
        widget(event)
    widget.close()
    widget(_ev("state", "chief", 0, state="starting"))
    assert widget.workers[("chief", 0)].history == ["starting"]
    assert widget.workers[("worker", 1)].state == "pending"
    assert widget.run.outcome is None
    widget.close()


# ---------------------------------------------------------------- console


def test_console_prints_logs_states_epochs_and_few_progress_lines(capsys):
    display = ConsoleDisplay(num_workers=2)  # capsys stdout is no terminal: plain lines
    for event in _training_events():
        display(event)
    display.close()
    out = capsys.readouterr().out.splitlines()
    assert "[chief 0] hello from chief <0>" in out
    assert "[worker 1] training" in out and "[worker 1] done" in out
    assert "[chief 0] starting on GPU 0" in out and "[worker 1] starting on GPUs 1,2" in out
    assert "[chief 0] epoch 2/2 loss=0.125 accuracy=0.75 192 examples/s" in out
    step_lines = [line for line in out if line.startswith("[tfnb] ") and "step" in line]
    # 16 step updates arrive within the 30 s interval: one line says training is under way, no more
    assert len(step_lines) == 1 and "epoch 1/2 step 1/4" in step_lines[0]
    assert out[-1].startswith("[tfnb] Succeeded (attempt 1)")
    assert len(out) < 20


def test_console_failure_and_custom_metrics(capsys):
    display = ConsoleDisplay()
    display(_ev("progress", "chief", 0, images=128, lr=0.01))
    display(_ev("failed", "worker", 1, exc_type="ValueError", message="bad shard"))
    display(_ev("state", "driver", 0, state="failed", attempt=1))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[chief 0] images=128 lr=0.01"
    assert "[worker 1] FAILED ValueError: bad shard" in out
    assert out[-1].startswith("[tfnb] Failed (attempt 1)") and "worker 1 ValueError: bad shard" in out[-1]


def test_console_on_a_terminal_draws_a_tqdm_bar():
    stream = io.StringIO()
    display = ConsoleDisplay(stream, num_workers=2, tty=True)
    for event in _training_events():
        display(event)
    display.close()
    text = stream.getvalue()
    assert "\r" in text and "8/8" in text and "loss=0.125" in text and "ex/s" in text
    assert "[chief 0] hello from chief <0>" in text


def test_auto_display_modes(monkeypatch, capsys):
    monkeypatch.delenv("TFNB_DISPLAY", raising=False)
    assert isinstance(make_display(None, num_workers=2), ConsoleDisplay)  # pytest is no notebook
    monkeypatch.setenv("TFNB_DISPLAY", "widget")
    widget = make_display(None, num_workers=2, max_attempts=2)
    assert isinstance(widget, ProgressWidget) and list(widget.workers) == [("chief", 0), ("worker", 1)]
    monkeypatch.setenv("TFNB_DISPLAY", "none")
    quiet = make_display(None, num_workers=2)
    quiet(_ev("log", "chief", 0, line="not shown"))
    quiet.close()
    assert "not shown" not in capsys.readouterr().out
    monkeypatch.setenv("TFNB_DISPLAY", "fancy")
    with pytest.raises(ConfigError, match="TFNB_DISPLAY"):
        make_display(None, num_workers=2)


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"interval": -1}, {"every_n_steps": 0}])
def test_keras_callback_rejects_bad_options(kwargs):
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        keras_callback(None, **kwargs)


# ---------------------------------------------------------------- carriage returns and large runs

BAR = "\r".join(f"{i}/10 [{'=' * i}{'.' * (10 - i)}] - loss: {1 / i:.4f}" for i in range(1, 11))


def _bar_events(job, idx):
    """A Keras verbose=1 bar: partial updates (folded by the task), then the finished line."""
    out = [_ev("log", job, idx, stream="stdout", line=BAR.split("\r")[i], partial=True) for i in range(9)]
    out.append(_ev("log", job, idx, stream="stdout", line="\r" + BAR + "\r"))
    return out


def test_widget_shows_one_updating_line_per_worker_for_carriage_returns():
    widget = ProgressWidget(num_workers=2, refresh_interval=0)
    for event in _bar_events("chief", 0)[:5] + _bar_events("worker", 1)[:3]:
        widget(event)
    live = widget.live.value
    assert live.count("[chief 0]") == 1 and "5/10 [=====.....]" in live
    assert live.count("[worker 1]") == 1 and "3/10 [===.......]" in live
    assert widget.log_text() == "\n"  # partial updates are not log lines
    for event in _bar_events("chief", 0)[5:]:
        widget(event)
    widget.close()
    # the finished bar leaves its last state, once, as the chief's log line; worker 1's bar still runs
    assert widget.log_text().splitlines() == ["[chief 0] 10/10 [==========] - loss: 0.1000"]
    assert "[chief 0]" not in widget.live.value and "3/10" in widget.live.value


def test_console_throttles_carriage_return_output(capsys):
    display = ConsoleDisplay(num_workers=2, interval=30)
    for event in _bar_events("chief", 0) + _bar_events("worker", 1)[:9]:
        display(event)
    display.close()
    out = capsys.readouterr().out.splitlines()
    # the first partial update shows at once, the rest wait for the interval; the finished line shows
    # its final state; close() prints worker 1's latest unfinished state
    assert out == ["[chief 0] 1/10 [=.........] - loss: 1.0000",
                   "[chief 0] 10/10 [==========] - loss: 0.1000",
                   "[worker 1] 9/10 [=========.] - loss: 0.1111"], out


LARGE = 200  # tasks, far above SUMMARY_ABOVE


def _large_run_events(rounds=10):
    """A 200-task run: worker 7 lags, worker 9 stalls, worker 11 fails, the rest train in step."""
    out = [_ev("state", "chief" if r == 0 else "worker", r, state="training") for r in range(LARGE)]
    for step in range(1, rounds + 1):
        if step == 6:
            out.append(_ev("state", "worker", 9, state="stalled"))
            out.append(_ev("failed", "worker", 11, exc_type="ValueError", message="bad shard 11"))
        for r in range(LARGE):
            job = "chief" if r == 0 else "worker"
            if r == 7 and step > 2 or r in (9, 11) and step > 5:
                continue
            out.append(_ev("progress", job, r, epoch=1, epochs=1, step=step + (r == 3), steps=100,
                           loss=0.5, examples_per_sec=10.0, batch_size=1))
    return out


class VirtualTime:
    """The panel's clock and timers (tfnb.notebook.progress's ``time.monotonic`` and ``threading.Timer``), moved
    on only by :meth:`advance`, which runs the timers that came due, in order, on the calling thread."""

    def __init__(self, monkeypatch):
        import types

        from tfnb.notebook import progress

        self.now, self.due = 0.0, []
        monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: self.now))
        monkeypatch.setattr(progress, "threading", types.SimpleNamespace(
            Lock=threading.Lock, current_thread=threading.current_thread, Timer=self._timer))

    def _timer(self, wait, fn):
        clock = self

        class Timer:
            daemon = False

            def start(self):
                clock.due.append((clock.now + wait, self, fn))

            def cancel(self):
                clock.due = [d for d in clock.due if d[1] is not self]

            def join(self):
                pass

        return Timer()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        while ready := sorted((d for d in self.due if d[0] <= self.now), key=lambda d: d[0]):
            self.due.remove(ready[0])
            ready[0][2]()


def test_widget_summarises_a_large_run_and_pages_its_rows(monkeypatch):
    clock = VirtualTime(monkeypatch)
    widget = ProgressWidget(num_workers=LARGE, refresh_interval=0)
    events = _large_run_events()
    for event in events:  # ~2,000 events, a millisecond apart
        widget(event)
        clock.advance(0.001)
    # a large run re-renders once a second while its events come, not once per event
    assert 2 <= widget.renders <= clock.now + 1, (widget.renders, clock.now)
    widget.close()

    summary = widget.summary.value
    assert f"{LARGE} tasks" in summary
    assert "198 training" in summary and "1 stalled" in summary and "1 failed" in summary
    assert "slowest worker 7 (epoch 1/1 step 2/100" in summary and "fastest worker 3 (epoch 1/1 step 11/100" in summary
    assert "1 straggler: worker 7" in summary and "stalled: worker 9" in summary
    assert "page 1/13" in summary
    # the table shows one page, the tasks of note first
    rows = widget.table.value.count("<tr>") - 1
    assert rows == SUMMARY_ABOVE
    table = widget.table.value
    assert table.index("worker 11") < table.index("worker 9") < table.index("worker 7") < table.index("chief 0")
    assert "bad shard 11" in table
    assert "1.98k examples/s in total" in summary
    widget.show_page(12)
    assert widget.table.value.count("<tr>") - 1 == LARGE - 12 * SUMMARY_ABOVE and "page 13/13" in widget.summary.value


def _colour_share(png: bytes, hex_colour: str) -> float:
    """Share of the image's pixels drawn in ``hex_colour`` (a line of the chart)."""
    import matplotlib.image
    import numpy as np

    rgb = matplotlib.image.imread(io.BytesIO(png))[..., :3]
    want = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return float((np.abs(rgb - want).max(axis=-1) < 0.06).mean())


def test_widget_charts_each_workers_loss_and_redraws_at_most_every_chart_interval(tmp_path):
    widget = ProgressWidget(num_workers=2, refresh_interval=0, chart_interval=3600)
    assert widget.chart.layout.display == "none" and widget.frames == 0  # nothing to draw yet
    events = _training_events()
    half = len(events) // 2
    widget.batch(events[:half])
    deadline = time.monotonic() + 60
    while widget.frames == 0 and time.monotonic() < deadline:  # frames are drawn on a thread of their own
        time.sleep(0.05)
    first = bytes(widget.chart.value)
    assert widget.frames == 1 and first.startswith(b"\x89PNG") and widget.chart.layout.display == ""
    # a line (and legend entry) per worker in matplotlib's first two colours; the page is mostly white
    assert _colour_share(first, "#1f77b4") > 1e-4 and _colour_share(first, "#ff7f0e") > 1e-4
    assert _colour_share(first, "#ffffff") > 0.8
    widget.batch(events[half:])
    assert widget.frames == 1 and bytes(widget.chart.value) == first  # within chart_interval: no new frame
    widget.close()
    assert widget.frames == 2 and bytes(widget.chart.value) != first  # the end always gets its frame
    (tmp_path / "chart.png").write_bytes(widget.chart.value)
    # the curve is the loss by fractional epoch, ending on the last epoch's summary
    curve = widget.run.curves[("worker", 1)]
    assert curve[0] == (0.25, {"loss": 1.0, "accuracy": 0.5})
    assert curve[-1] == (2.0, {"loss": 0.125, "accuracy": 0.75})
    assert widget._chosen_metric() == "accuracy"


def test_widget_handles_a_batch_as_one_render_and_keeps_few_curves():
    widget = ProgressWidget(num_workers=LARGE, refresh_interval=0, chart_interval=0)
    before = widget.renders
    widget.batch(_large_run_events())
    widget.close()
    assert widget.renders == before + 1 and widget.frames == 1  # ~2,000 events, one re-render
    assert sorted(widget.run.curves) == [("chief", 0)] + [("worker", i) for i in range(1, CHART_TASKS)]

    # a row is rebuilt only when its task changed
    small = ProgressWidget(num_workers=2, refresh_interval=0)
    small.batch(_training_events()[:10])
    rows = dict(small._rows)
    small.batch([_ev("progress", "worker", 1, epoch=1, epochs=1, step=50, steps=100, loss=0.1)])
    assert small._rows[("chief", 0)] is rows[("chief", 0)] and small._rows[("worker", 1)] != rows[("worker", 1)]
    assert "50/100" in small.table.value


def test_a_batch_folds_as_its_events_one_by_one():
    from tfnb.monitor.progress import RunProgress

    events = [_ev("log", "worker", 1, stream="stdout", line="a"),
              _ev("log", "worker", 1, stream="stdout", line="bar 1/3", partial=True),
              _ev("progress", "worker", 1, epoch=1, step=3, steps=10, loss=0.5),
              _ev("log", "worker", 1, stream="stdout", line="b"),       # ends worker 1's bar
              _ev("log", "worker", 7, stream="stdout", line="new task"),  # a task not in the run's shape
              _ev("log", "chief", 0, stream="stdout", line="x\ry"),
              _ev("state", "worker", 1, state="done")]
    for cut in range(len(events) + 1):
        one, batched = RunProgress.for_run(2, log_lines=3), RunProgress.for_run(2, log_lines=3)
        for event in events:
            one.apply(event)
        batched.apply_batch(events[:cut])
        changed, lines, tasks = batched.apply_batch(events[cut:])
        assert list(batched.logs) == list(one.logs) and batched.workers == one.workers, cut
        assert changed == bool(events[cut:]) and lines == any(e.kind == "log" for e in events[cut:])
    assert list(one.logs) == ["[worker 1] b", "[worker 7] new task", "[chief 0] y"]
    assert one.workers[("worker", 1)].live is None
    assert RunProgress.for_run(2).apply_batch(events)[2] == {("worker", 1)}  # the rows to redraw


def test_console_writes_a_batch_of_lines_at_once():
    class Writes(io.StringIO):
        calls = 0

        def write(self, text):
            Writes.calls += 1
            return super().write(text)

    out = Writes()
    display = ConsoleDisplay(out, num_workers=2, tty=False, interval=3600)
    display.batch([_ev("log", "worker", 1, stream="stdout", line=f"line {i}") for i in range(500)])
    assert out.getvalue().splitlines() == [f"[worker 1] line {i}" for i in range(500)]
    assert Writes.calls <= 2  # print writes the text and its newline


def test_without_matplotlib_the_panel_works_and_says_how_to_get_the_chart(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    widget = ProgressWidget(num_workers=2, refresh_interval=0)
    for event in _training_events():
        widget(event)
    widget.close()
    assert widget.chart is None and widget.frames == 0
    hint = [c.value for c in widget.box.children if "tfnb-chart-missing" in getattr(c, "value", "")]
    assert len(hint) == 1 and "pip install matplotlib" in hint[0]
    assert "Succeeded" in widget.status.value and "done" in widget.table.value


def test_console_summarises_a_large_run(capsys):
    display = ConsoleDisplay(num_workers=LARGE, interval=0)
    for event in _large_run_events(rounds=7) + _bar_events("chief", 0)[-1:] + _bar_events("worker", 5)[-1:]:
        display(event)
    display(_ev("state", "driver", 0, state="failed", attempt=1))
    display.close()
    out = capsys.readouterr().out.splitlines()
    # no per-task state lines for 200 tasks; the stall and the failure are always shown
    assert not any(line.endswith("] training") for line in out)
    assert "[worker 9] stalled" in out and "[worker 11] FAILED ValueError: bad shard 11" in out
    # finished carriage-return bars: the chief's final state only
    assert [line for line in out if "10/10 [" in line] == ["[chief 0] 10/10 [==========] - loss: 0.1000"]
    summaries = [line for line in out if line.startswith("[tfnb] slowest")]
    assert summaries and "worker 7 (epoch 1/1 step 2/100" in summaries[-1]
    assert any(line.startswith("[tfnb] 1 straggler: worker 7") for line in out)
    progress = [line for line in out if line.startswith("[tfnb] epoch")]
    assert progress and "1 stalled" in progress[-1] and "1 failed" in progress[-1]


# ---------------------------------------------------------------- real runs


class Recorder:
    """Passes events to the widget and keeps a copy of its model and table after each one."""

    def __init__(self, widget: ProgressWidget):
        self.widget = widget
        self.snapshots: list = []

    def __call__(self, event: RunEvent) -> None:
        self.widget(event)
        self.snapshots.append((event, copy.deepcopy(self.widget.workers), self.widget.table.value))

    def close(self) -> None:
        self.widget.close()


def train_small(ctx, epochs, steps, batch):
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(ctx.task_index)
    x = rng.normal(size=(steps * batch, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch).with_options(options)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input(shape=(8,)),
                                     tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    history = model.fit(ds, epochs=epochs, steps_per_epoch=steps, verbose=0,
                        callbacks=[ctx.progress_callback(batch_size=batch, interval=0)])
    print("HISTORY " + json.dumps(history.history), flush=True)
    return history.history


@pytest.mark.slow
def test_widget_follows_a_real_two_worker_run(spark, no_orphans):
    import tfnb

    widget = ProgressWidget(num_workers=2, max_attempts=1, refresh_interval=0)  # a render per event
    rec = Recorder(widget)
    history = tfnb.run(train_small, num_workers=2, args=(EPOCHS, STEPS, BATCH), spark=spark,
                       max_attempts=1, display=rec)

    # every task went starting -> training -> done, in that order, as the events came in
    for key in (("chief", 0), ("worker", 1)):
        seen = []
        for _, workers, _ in rec.snapshots:
            state = workers[key].state
            if state != "pending" and (not seen or seen[-1] != state):
                seen.append(state)
        assert seen == ["starting", "training", "done"], key
        assert widget.workers[key].history == ["starting", "training", "done"]
    # each task said which GPUs Spark gave it (none in this CPU session) and its row shows that
    assert [widget.workers[key].gpus for key in (("chief", 0), ("worker", 1))] == [[], []]
    assert [row[:2] for row in _rows(widget.table.value)[1:]] == [["chief 0", "none"], ["worker 1", "none"]]

    # during the run the widget showed both tasks training, mid-epoch, with a loss and a throughput
    during = [(w, table) for ev, w, table in rec.snapshots if ev.kind == "progress"
              and w[("chief", 0)].state == w[("worker", 1)].state == "training"
              and w[("chief", 0)].step is not None and w[("chief", 0)].epoch == 1
              and w[("chief", 0)].loss is not None]
    assert during, "no progress update arrived while both workers were training"
    assert any("training" in table and "1/2" in table for _, table in during)
    # a task's rate, wherever the run's frames showed one while it trained (4 short steps an epoch: under load
    # a worker's reports of epoch 1 may arrive only once the chief is in epoch 2)
    for key in (("chief", 0), ("worker", 1)):
        mids = [w[key] for ev, w, _ in rec.snapshots
                if ev.kind == "progress" and w[key].state == "training" and w[key].steps_per_sec]
        assert mids and all(m.examples_per_sec == pytest.approx(m.steps_per_sec * BATCH) for m in mids)

    # the final rows hold what the run produced; worker 1's own history came through its log line
    logs = widget.log_text()
    line = next(x for x in logs.splitlines() if x.startswith("[worker 1] HISTORY "))
    produced = {("chief", 0): history, ("worker", 1): json.loads(line.split("HISTORY ", 1)[1])}
    for key, hist in produced.items():
        w = widget.workers[key]
        assert (w.epoch, w.epochs, w.step, w.steps) == (EPOCHS, EPOCHS, STEPS, STEPS)
        assert w.loss == pytest.approx(hist["loss"][-1], rel=1e-5)
        assert w.metrics["accuracy"] == pytest.approx(hist["accuracy"][-1], rel=1e-5)
        assert w.examples_per_sec > 0
    # per-batch numbers are the means Keras reports at epoch end, not sums over the workers: the last
    # batch's running value equals the epoch's (both workers see equal batches), and accuracy stays <= 1
    for key in (("chief", 0), ("worker", 1)):
        sent = [ev.data for ev, _, _ in rec.snapshots if (ev.job_name, ev.task_index) == key
                and ev.kind == "progress" and "accuracy" in ev.data]
        assert all(0 <= d["accuracy"] <= 1 for d in sent), sent
        for epoch in range(1, EPOCHS + 1):
            last = [d for d in sent if d["epoch"] == epoch and d["step"] == STEPS]
            end = next(d for d in last if d.get("epoch_end"))
            # the task may merge the last batch's report into the epoch end's (same window)
            for batch in (d for d in last if not d.get("epoch_end")):
                assert batch["accuracy"] == pytest.approx(end["accuracy"], rel=1e-4), (batch, end)
                assert batch["loss"] == pytest.approx(end["loss"], rel=1e-4), (batch, end)
    table = widget.table.value
    assert table.count("done") == 2 and f"{EPOCHS}/{EPOCHS}" in table and f"{STEPS}/{STEPS}" in table
    assert f"{widget.workers[('chief', 0)].loss:.4g}" in table
    assert "Succeeded (attempt 1/1)" in widget.status.value


def fail_on_worker_1(ctx):
    import time

    print(f"task {ctx.task_index} up", flush=True)
    if ctx.task_index == 1:
        raise ValueError("bad shard 1")
    time.sleep(120)  # the driver stops this task once worker 1 has failed


def test_widget_shows_the_failed_worker(spark, no_orphans):
    import tfnb

    widget = ProgressWidget(num_workers=2)
    with pytest.raises(WorkerError) as info:
        tfnb.run(fail_on_worker_1, num_workers=2, spark=spark, max_attempts=1, display=widget)
    assert info.value.exc_type == "ValueError"
    failed = widget.workers[("worker", 1)]
    assert failed.state == "failed" and failed.error == "ValueError: bad shard 1"
    assert widget.workers[("chief", 0)].state != "done"
    assert "failed" in widget.table.value and "ValueError: bad shard 1" in widget.table.value
    assert "Failed (attempt 1/1)" in widget.status.value and "worker 1 ValueError" in widget.status.value
    assert "[worker 1] task 1 up" in widget.log_text()


# ---------------------------------------------------------------- in JupyterLab, as a user sees it

NOTEBOOK_RUN = '''
import tfnb

def train_fn(ctx, flag):
    import pathlib, time
    print(f"LIVE-MARKER from task {ctx.task_index}", flush=True)
    print("\\r".join(f"bar {i}/5" for i in range(1, 6)), flush=True)  # a carriage-return progress bar
    step = 1
    ctx.report(epoch=1, epochs=1, step=step, steps=400, loss=0.5, accuracy=0.5, examples_per_sec=100.0)
    while not pathlib.Path(flag).exists():  # the test lets the run finish once it saw the live widget
        time.sleep(0.2)
        step = min(step + 1, 399)  # a curve that keeps moving while the test watches it
        ctx.report(epoch=1, epochs=1, step=step, steps=400, loss=0.5 / (1 + step / 20),
                   accuracy=0.9 - 0.4 / (1 + step / 20), examples_per_sec=100.0)
    ctx.report(epoch=1, epochs=1, step=400, steps=400, loss=0.0125, accuracy=0.89, epoch_end=True)
    return "ok"

result = tfnb.run(train_fn, num_workers=2, args=(FLAG,), max_attempts=1)
print("RESULT", result)
'''


LARGE_RUN = '''
import tfnb
from tfnb import RunEvent

w = tfnb.ProgressWidget(num_workers=200, refresh_interval=0)
for r in range(200):
    job = "chief" if r == 0 else "worker"
    w(RunEvent("state", job, r, {"state": "training"}))
    w(RunEvent("progress", job, r, {"epoch": 1, "epochs": 1, "step": 2 if r == 7 else 10, "steps": 100,
                                    "examples_per_sec": 10.0}))
    w(RunEvent("log", job, r, {"line": f"{r} [==>....]", "partial": True}))
w(RunEvent("state", "worker", 9, {"state": "stalled"}))
w.close()
'''


@pytest.mark.browser
@pytest.mark.slow
def test_notebook_shows_the_widget_live(jupyter_lab, chromium_page, artifacts):
    page = chromium_page
    flag = jupyter_lab.workdir / "go.flag"
    nb = jupyter_lab.write_notebook("progress.ipynb", [
        f"FLAG = {str(flag)!r}" + NOTEBOOK_RUN,
        "from pyspark.sql import SparkSession\nSparkSession.getActiveSession().stop()",
        LARGE_RUN,
    ])
    ms = 300_000
    # the test acts mid-run, so it starts "Run All" without waiting for the end
    browser.start_run_all(page, jupyter_lab.notebook_url(nb), timeout=ms / 1000)

    # while tfnb.run is still blocked in the cell, the widget already shows both tasks and their logs
    first = page.locator(".jp-CodeCell").first
    first.get_by_text("LIVE-MARKER from task 1").wait_for(timeout=ms)
    first.get_by_text("LIVE-MARKER from task 0").wait_for(timeout=ms)
    table = first.locator("table.tfnb-progress")
    # both rows training, each with reports (renders are throttled, so wait for both)
    page.wait_for_function(
        """() => { const t = document.querySelector('table.tfnb-progress')?.innerText || '';
                   return (t.match(/training/g) || []).length == 2 && (t.match(/\\d+\\/400/g) || []).length >= 2; }""",
        timeout=ms)
    assert "[*]" in first.locator(".jp-InputPrompt").inner_text()
    rows = table.locator("tr").all_inner_texts()
    assert any(r.startswith("chief 0") and "/400" in r and "100" in r for r in rows), rows
    assert any(r.startswith("worker 1") and "/400" in r for r in rows), rows
    assert rows[0].split("\t")[:2] == ["task", "GPUs"] and all(r.split("\t")[1] == "none" for r in rows[1:]), rows
    # the live chart: a drawn image, which a later report redraws while the run goes on
    chart = first.locator("img.tfnb-chart")
    chart.wait_for(state="visible", timeout=ms)
    page.wait_for_function("() => document.querySelector('img.tfnb-chart')?.naturalWidth > 300", timeout=ms)

    def next_frame():
        src = chart.get_attribute("src")
        page.wait_for_function("old => { const img = document.querySelector('img.tfnb-chart');"
                               "         return img.src !== old && img.complete; }", arg=src, timeout=ms)

    next_frame()  # a few points into the curve
    shot = chart.screenshot(path=str(artifacts / "progress-chart-1.png"))
    page.screenshot(path=str(artifacts / "progress-live.png"))
    first.locator(".tfnb-panel").screenshot(path=str(artifacts / "progress-panel.png"))
    next_frame()
    assert chart.screenshot(path=str(artifacts / "progress-chart-2.png")) != shot
    assert "[*]" in first.locator(".jp-InputPrompt").inner_text()  # still mid-run

    flag.touch()
    first.get_by_text("RESULT ok").wait_for(timeout=ms)
    first.get_by_text("Succeeded (attempt 1").wait_for(timeout=ms)
    rows = table.locator("tr").all_inner_texts()
    assert sum("done" in r for r in rows) == 2 and any("0.0125" in r and "400/400" in r for r in rows), rows
    page.wait_for_function(
        """() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
                 .every(p => /\\[\\d+\\]/.test(p.textContent))""", timeout=ms)
    page.screenshot(path=str(artifacts / "progress-done.png"))
    # the bar's carriage-return updates became its final state, once per task
    logs = first.locator(".jp-OutputArea-output").all_inner_texts()
    assert any("[chief 0] bar 5/5" in t for t in logs) and not any("bar 1/5" in t for t in logs), logs

    # a 200-task run: the summary, one page of rows with the tasks of note first, and a working pager
    large = page.locator(".jp-CodeCell").nth(2)
    summary = large.locator(".tfnb-summary")
    summary.get_by_text("200 tasks").wait_for(timeout=ms)
    text = summary.inner_text()
    assert "1 stalled" in text and "stalled: worker 9" in text and "1 straggler: worker 7" in text, text
    rows = large.locator("table.tfnb-progress tr").all_inner_texts()
    assert len(rows) == 1 + SUMMARY_ABOVE and rows[1].startswith("worker 9") and rows[2].startswith("worker 7"), rows
    assert large.locator(".tfnb-live").inner_text().count("\n") == SUMMARY_ABOVE - 1  # one bar line per row shown
    page.screenshot(path=str(artifacts / "progress-large.png"))
    large.get_by_role("button", name="▶").click()
    summary.get_by_text("page 2/13").wait_for(timeout=ms)
