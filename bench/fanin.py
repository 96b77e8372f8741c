"""Benchmark the driver's fan-in: N tasks streaming logs and progress to one driver, no Spark.

For each configuration a fresh driver process opens the real ``DriverChannel`` and consumes it the
way ``tfnb.run`` does (``cluster._Attempt``: bounded inbox, run log file, ``RunEvent`` -> display).
Eight sender processes open one real ``TaskChannel`` per fake task (authenticated like a Spark task)
and, per task, post a Keras-like progress report at 2 Hz and L log lines per second, flushing once per
send window as the task's batching thread does (``batch_window``: 0.1 s, 0.34 s at 2,048 tasks). Each
line and report carries the time it was made; the display records when it got it.

Printed per configuration: messages/s offered and handled, the driver's CPU seconds per second (the
driver process only, the senders excluded), lag made -> displayed (p50 / p99 / max), progress reports
merged by the driver while it was behind, and the driver's peak RSS. Goal (issue 17): 2048 tasks x
20 lines/s with driver CPU <= 0.5 s/s and lag p99 <= 500 ms, memory bounded.

The machine is shared: the senders run on the same cores as the driver, so the load average is
printed with the table.

Usage:
    .venv/bin/python bench/fanin.py [--tasks 256,512,1024,2048] [--lines 5,20] [--seconds 10]
        [--display widget|console|none] [--replay]

``--replay`` measures the display alone: the same events, handed over in real time one 50 ms
drain pass at a time, without channel or senders; its CPU figure barely depends on the load.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from harness import report, use_checkout

use_checkout()

from tfnb.monitor.display import show  # noqa: E402 - after use_checkout, which puts this checkout first

SENDERS = 8
WARMUP = 3.0
TICK = 0.05


# ---------------------------------------------------------------- a sender process


def sender(address: str, token: str, first: int, count: int, lines_per_s: float, seconds: float) -> None:
    from tfnb._protocol import batch_window
    from tfnb._task.channel import TaskChannel

    # the tasks of a real run are on other machines: give the driver the first claim on these cores
    os.nice(10)
    host, port = address.rsplit(":", 1)
    chans = [TaskChannel((host, int(port)), token, {"job_name": "worker", "task_index": i, "rank": i,
                                                   "host": "127.0.0.1"}, window=None)
             for i in range(first, first + count)]
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()  # go
    start = time.monotonic()
    end = start + seconds
    due = [0.0] * count
    flush_every = round(batch_window(count * SENDERS) / TICK)
    tick = 0
    while True:
        now_m = time.monotonic()
        if now_m >= end:
            break
        now = time.time()
        for j, chan in enumerate(chans):
            due[j] += lines_per_s * TICK
            while due[j] >= 1.0:
                due[j] -= 1.0
                chan.post_line("stdout", f"{now:.6f} 1875/1875 [==============================] "
                                         f"- 12s 6ms/step - loss: 0.2931 - accuracy: 0.9153")
            if (tick + j) % 10 == 0:  # 2 Hz, tasks out of phase
                chan.post("event", merge="progress", event="progress",
                          data={"t": now, "epoch": 1, "epochs": 10, "step": tick, "steps": 100000,
                                "loss": 0.25, "accuracy": 0.9, "steps_per_sec": 20.0, "batch_size": 64})
            if (tick + j) % flush_every == 0:  # what the task's batching thread does
                chan.flush()
        tick += 1
        time.sleep(max(0.0, start + tick * TICK - time.monotonic()))
    for chan in chans:
        chan.close()
    r = resource.getrusage(resource.RUSAGE_SELF)
    sys.stderr.write(f"sender cpu {(r.ru_utime + r.ru_stime) / (time.monotonic() - start):.2f} s/s\n")


# ---------------------------------------------------------------- the driver process


class Lag:
    """The display under test, wrapped: counts what it got, records made -> displayed lag of a sample."""

    def __init__(self, display):
        self.display = display
        self.lags: list[float] = []
        self.count = 0
        self.measuring = False

    def __call__(self, event) -> None:
        self.batch([event])

    def batch(self, batch) -> None:
        # tfnb.run hands the display each pass over its inbox as one batch (tfnb.progress.show)
        show(self.display, batch)
        if not self.measuring:
            return
        now = time.time()
        # the lag of every 4th line and report: the measuring runs in the measured process
        sample = batch[::4]
        lags = [now - float(e.data["line"][:17]) for e in sample if e.kind == "log"]
        lags += [now - e.data["t"] for e in sample if e.kind == "progress" and "t" in e.data]
        self.count += len(batch)
        self.lags += lags


def _display(kind: str, tasks: int):
    if kind == "widget":
        from tfnb.notebook import ProgressWidget

        return ProgressWidget(num_workers=tasks)  # the ipywidgets model, rendered, with no browser
    if kind == "console":
        from tfnb.notebook.console import ConsoleDisplay

        return ConsoleDisplay(open(os.devnull, "w"), num_workers=tasks, tty=False)
    return lambda event: None


def replay(tasks: int, lines_per_s: float, seconds: float, display: str) -> dict:
    """The display alone: the events of ``seconds`` of the load, handed over in real time as
    ``tfnb.run`` does (one batch per 50 ms drain pass), no channel. CPU of all threads (renders
    happen on a timer thread too), so a loaded machine changes it little."""
    from tfnb._protocol import RunEvent

    shown = _display(display, tasks)
    made = time.time()
    line = f"{made:.6f} 1875/1875 [==============================] - 12s 6ms/step - loss: 0.2931 - accuracy: 0.9153"
    logs = [RunEvent("log", "chief" if i == 0 else "worker", i, {"stream": "stdout", "line": line})
            for i in range(tasks)]
    count, due, tick = 0, [0.0] * tasks, 0
    start = time.monotonic()
    warm_ticks = round(WARMUP / TICK)  # the first chart frame imports matplotlib: not the steady state
    while tick < warm_ticks + round(seconds / TICK):
        if tick == warm_ticks:
            cpu0, count, measured = _cpu(), 0, time.monotonic()
        batch = []
        for i in range(tasks):
            due[i] += lines_per_s * TICK
            while due[i] >= 1.0:
                due[i] -= 1.0
                batch.append(logs[i])
            if (tick + i) % 10 == 0:
                batch.append(RunEvent("progress", logs[i].job_name, i, {
                    "epoch": 1, "epochs": 10, "step": tick, "steps": 100000, "loss": 0.25 + 1 / (tick + 1),
                    "accuracy": 0.9, "steps_per_sec": 20.0, "batch_size": 64}))
        show(shown, batch)
        count += len(batch)
        tick += 1
        time.sleep(max(0.0, start + tick * TICK - time.monotonic()))
    cpu, wall = _cpu() - cpu0, time.monotonic() - measured
    if hasattr(shown, "close"):
        shown.close()
    return {"tasks": tasks, "lines": lines_per_s, "display": display, "events": count,
            "us_per_event": cpu / count * 1e6, "cpu": cpu / wall}


def driver(tasks: int, lines_per_s: float, seconds: float, display: str) -> dict:
    from tfnb.launcher.attempt import _Attempt
    from tfnb.launcher.channel import DriverChannel
    from tfnb.launcher.hooks import LaunchHooks
    from tfnb.launcher.options import RunOptions

    shown = Lag(_display(display, tasks))
    with tempfile.TemporaryDirectory() as model_dir:
        att = _Attempt(None, dict(run_id="fanin", attempt=1, num_workers=tasks),
                       RunOptions(tasks, max_attempts=1, model_dir=model_dir), LaunchHooks(), shown)
        att.channel = DriverChannel("127.0.0.1", att._on_message)
        address = "%s:%d" % att.channel.address
        per = tasks // SENDERS
        procs = [subprocess.Popen([sys.executable, __file__, "--_sender", address, str(i * per), str(per),
                                   str(lines_per_s), str(seconds + WARMUP)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, TFNB_BENCH_TOKEN=att.channel.token))
                 for i in range(SENDERS)]
        try:
            for p in procs:
                assert p.stdout.readline().strip() == "ready", "a sender failed to connect"
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            warm_end = time.monotonic() + WARMUP
            while time.monotonic() < warm_end:
                att._drain(0.1)
            shown.measuring = True
            dropped0 = att.q.dropped
            cpu0, wall0 = _cpu(), time.monotonic()
            end = wall0 + seconds
            while time.monotonic() < end:
                att._drain(0.1)
            cpu, wall = _cpu() - cpu0, time.monotonic() - wall0
            shown.measuring = False
            finish = time.monotonic() + 120
            while any(p.poll() is None for p in procs) and time.monotonic() < finish:
                att._drain(0.1)  # the senders hang up once the driver has read all they sent
            while att.q.qsize():
                att._drain(0.1)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            att.q.put(("closed",))
            att.channel.close()
            att.runlog.close()
        log_lines = sum(1 for _ in open(att.runlog.path))
    lags = sorted(shown.lags) or [float("nan")]
    offered = tasks * (lines_per_s + 2)
    return {"tasks": tasks, "lines": lines_per_s, "display": display, "offered": offered,
            "handled": shown.count / wall, "cpu": cpu / wall, "us_per_msg": cpu / max(shown.count, 1) * 1e6,
            "p50": lags[len(lags) // 2] * 1000, "p99": lags[int(len(lags) * 0.99)] * 1000, "max": lags[-1] * 1000,
            "dropped": att.q.dropped - dropped0, "peak_queue": att.q.peak, "log_lines": log_lines,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---------------------------------------------------------------- the table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="256,512,1024,2048")
    p.add_argument("--lines", default="5,20", help="log lines per second per task")
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per configuration")
    p.add_argument("--display", default="widget", choices=("widget", "console", "none"))
    p.add_argument("--replay", action="store_true",
                   help="measure the display alone: the same events in real time, no channel or senders")
    p.add_argument("--_sender", nargs=5, help=argparse.SUPPRESS)
    p.add_argument("--_driver", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a._sender:
        address, first, count, lines, seconds = a._sender
        sender(address, os.environ["TFNB_BENCH_TOKEN"], int(first), int(count), float(lines), float(seconds))
        return
    if a._driver:
        tasks, lines, seconds, display = a._driver
        print(json.dumps(driver(int(tasks), float(lines), float(seconds), display)))
        return
    if a.replay:
        print(f"display alone ({a.display}), events of the load replayed in real time, {a.seconds:g} s per row")
        print("| tasks | lines/s per task | display | events | display CPU us/event | display CPU s/s |")
        print("|---|---|---|---|---|---|")
        for lines in a.lines.split(","):
            for tasks in a.tasks.split(","):
                r = replay(int(tasks), float(lines), a.seconds, a.display)
                print(f"| {r['tasks']} | {r['lines']:g} | {r['display']} | {r['events']:,} | {r['us_per_event']:.2f} "
                      f"| {r['cpu']:.3f} |", flush=True)
        return
    print(f"fan-in: {SENDERS} sender processes, {a.seconds:g} s measured per row, display={a.display}, "
          f"{os.cpu_count()} cores, load average before {os.getloadavg()[0]:.1f}")
    print("| tasks | lines/s per task | display | msgs/s offered | msgs/s handled | driver CPU s/s "
          "| CPU us/msg | lag p50 / p99 / max | progress merged | peak queue | peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    last = None
    for lines in a.lines.split(","):
        for tasks in a.tasks.split(","):
            out = subprocess.run([sys.executable, __file__, "--_driver", tasks, lines, str(a.seconds), a.display],
                                 capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                print(f"| {tasks} | {lines} | failed: {out.stderr.strip().splitlines()[-1:]} |")
                continue
            r = last = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"| {r['tasks']} | {r['lines']:g} | {r['display']} | {r['offered']:,.0f} | {r['handled']:,.0f} "
                  f"| {r['cpu']:.2f} | {r['us_per_msg']:.1f} | {r['p50']:.0f} / {r['p99']:.0f} / {r['max']:.0f} ms | {r['dropped']:,} "
                  f"| {r['peak_queue']:,} | {r['rss_mb']:.0f} MB |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    if last is not None:  # the largest configuration, held to the goal
        report("fanin", {"fan-in driver CPU s/s": last["cpu"], "fan-in lag p99 vs 500 ms": last["p99"] / 500},
               {"fan-in driver CPU s/s": 0.5, "fan-in lag p99 vs 500 ms": 1.0})


if __name__ == "__main__":
    main()
