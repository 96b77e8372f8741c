"""Benchmark tfnb.EventSync: bytes sent / bytes produced and lag, against a naive whole-file copy loop.

A simulated training run (its own process, as the chief would be) writes TensorBoard event files with
tf.summary for ``--minutes`` (default 2; the issue's figure is ``--minutes 10``): 8 scalars per step
at 10 steps/s to ``train``, 4 validation scalars every 5 s, and a 64x64 image every 20 s, flushing
after every step and logging (time, file size) after each flush.

In the same run, at the same ``--interval`` (default 10 s), these copy the same files:

* ``EventSync local``  worker dir -> local dir (append mode);
* ``EventSync S3``     worker dir -> ``s3://`` on a real S3 server on loopback (``rclone serve s3``),
  parts mode;
* ``EventSync driver`` S3 -> local dir (reassembles the parts; its lag is measured from the moment the
  bytes were on S3);
* ``naive local`` / ``naive S3``: every interval, copy each changed file whole (the anchor).

A probe samples how many bytes of each file every destination holds, every 0.2 s. Lag of a flush =
first sample at which the destination holds that many bytes - time of the flush. Goals (issue 4):
bytes sent / bytes produced <= 1.05 and p95 lag <= interval + 1 s.

Usage:
    .venv/bin/python bench/sync.py [--minutes 2] [--interval 10]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness import ROOT, report, use_checkout

use_checkout()
sys.path.insert(1, os.path.join(ROOT, "tests"))  # s3server, on the driver only

BUCKET = "benchsync"
PROBE_EVERY = 0.2


def _writer(log_dir: str, seconds: float, out: str) -> None:
    """The simulated training run: scalars every step, validation and images now and then."""
    import tensorflow as tf

    train = tf.summary.create_file_writer(os.path.join(log_dir, "train"))
    val = tf.summary.create_file_writer(os.path.join(log_dir, "validation"))
    files = {}
    start = time.monotonic()
    step = 0
    with open(out, "w") as log:
        while time.monotonic() - start < seconds:
            elapsed = time.monotonic() - start
            touched = [train]
            with train.as_default():
                for i in range(8):
                    tf.summary.scalar(f"batch_metric_{i}", (step % 97) / (i + 1.0), step=step)
                if step % 200 == 0:
                    tf.summary.image("samples", tf.random.uniform((1, 64, 64, 3), seed=step), step=step)
            if step % 50 == 0:
                touched.append(val)
                with val.as_default():
                    for i in range(4):
                        tf.summary.scalar(f"epoch_metric_{i}", step / (i + 1.0), step=step)
            for w in touched:
                w.flush()
            now = time.time()
            for name in ("train", "validation"):
                d = os.path.join(log_dir, name)
                for f in os.listdir(d) if os.path.isdir(d) else ():
                    rel = f"{name}/{f}"
                    size = os.path.getsize(os.path.join(d, f))
                    if files.get(rel) != size:
                        files[rel] = size
                        log.write(json.dumps({"t": now, "file": rel, "size": size}) + "\n")
            log.flush()
            step += 1
            time.sleep(max(0.0, start + step * 0.1 - time.monotonic()))
    train.close()
    val.close()


class Naive:
    """Every interval, copy each file whose size changed, whole: what a plain `cp -r` loop does."""

    def __init__(self, src: Path, put, interval: float):
        self.src, self.put, self.interval = src, put, interval
        self.sent = 0
        self._seen: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _pass(self):
        for p in sorted(self.src.rglob("*")):
            if p.is_file():
                rel = str(p.relative_to(self.src))
                data = p.read_bytes()
                if self._seen.get(rel) != len(data):
                    self.put(rel, data)
                    self._seen[rel] = len(data)
                    self.sent += len(data)

    def _loop(self):
        while not self._stop.wait(self.interval):
            self._pass()

    def stop(self):
        self._stop.set()
        self._thread.join()
        self._pass()


def _local_put(root: Path):
    def put(rel: str, data: bytes) -> None:
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(".naive-tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
    return put


def _local_sizes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*tfevents*") if p.is_file()}


def _s3_sizes(client, prefix: str) -> dict[str, int]:
    """Bytes per logical file under ``prefix``: whole objects, or the sum of a file's parts."""
    from tfnb.monitor.sync import _PART_RE

    out: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        for obj in page.get("Contents", ()):
            rel = obj["Key"][len(prefix) + 1:]
            m = _PART_RE.match(rel)
            name = m.group("base") if m else rel
            out[name] = out.get(name, 0) + int(obj["Size"])
    return out


def _lags(writes: list[dict], samples: list[tuple[float, dict[str, int]]]) -> list[float]:
    """For each (time, file, size) written: first sample time the destination held >= size, minus time."""
    out = []
    by_file: dict[str, list[dict]] = {}
    for w in writes:
        by_file.setdefault(w["file"], []).append(w)
    for name, ws in by_file.items():
        j = 0  # sizes and times only grow, so the matching sample only moves forward
        for w in sorted(ws, key=lambda w: w["t"]):
            while j < len(samples) and (samples[j][0] < w["t"] or samples[j][1].get(name, 0) < w["size"]):
                j += 1
            out.append(samples[j][0] - w["t"] if j < len(samples) else float("inf"))
    return out


def _arrivals(samples: list[tuple[float, dict[str, int]]]) -> list[dict]:
    """Moments a destination's files grew, as 'writes' for the next hop's lag."""
    out, last = [], {}
    for t, sizes in samples:
        for f, size in sizes.items():
            if size > last.get(f, 0):
                out.append({"t": t, "file": f, "size": size})
                last[f] = size
    return out


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))] if s else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=2.0, help="length of the simulated run (issue: 10)")
    p.add_argument("--interval", type=float, default=10.0, help="sync interval in seconds")
    p.add_argument("--_writer", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._writer:
        _writer(a._writer[0], float(a._writer[1]), a._writer[2])
        return 0

    from s3server import start_rclone

    from tfnb.monitor.sync import EventSync

    work = Path(tempfile.mkdtemp(prefix="tfnb-bench-sync-"))
    server = start_rclone(work / "s3")
    try:
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        options = {"endpoint_url": server.endpoint_url, "aws_access_key_id": server.access_key,
                   "aws_secret_access_key": server.secret_key, "region_name": "us-east-1"}
        src, writes_log = work / "worker", work / "writes.jsonl"
        src.mkdir()
        dst_local, dst_driver, dst_naive = work / "dst-local", work / "dst-driver", work / "dst-naive"

        syncs = {
            "EventSync local": EventSync(str(src), str(dst_local), interval=a.interval),
            "EventSync S3": EventSync(str(src), f"s3://{BUCKET}/tfnb", interval=a.interval, storage_options=options),
            "EventSync driver": EventSync(f"s3://{BUCKET}/tfnb", str(dst_driver), interval=a.interval,
                                          storage_options=options),
        }
        naive = {
            "naive local": Naive(src, _local_put(dst_naive), a.interval),
            "naive S3": Naive(src, lambda rel, data: client.put_object(Bucket=BUCKET, Key=f"naive/{rel}", Body=data),
                              a.interval),
        }
        probes = {
            "EventSync local": lambda: _local_sizes(dst_local),
            "EventSync S3": lambda: _s3_sizes(client, "tfnb"),
            "EventSync driver": lambda: _local_sizes(dst_driver),
            "naive local": lambda: _local_sizes(dst_naive),
            "naive S3": lambda: _s3_sizes(client, "naive"),
        }
        samples: dict[str, list] = {k: [] for k in probes}
        probing = threading.Event()

        def probe():
            while not probing.wait(PROBE_EVERY):
                for k, fn in probes.items():
                    samples[k].append((time.time(), fn()))

        writer = subprocess.Popen([sys.executable, __file__, "--_writer", str(src), str(a.minutes * 60),
                                   str(writes_log)])
        for s in syncs.values():
            s.start()
        for n in naive.values():
            n.start()
        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        rc = writer.wait()
        for n in naive.values():
            n.stop()
        stats = {k: s.stop() for k, s in syncs.items()}   # S3 before driver: the driver's final pass sees all
        time.sleep(2 * PROBE_EVERY)
        probing.set()
        prober.join()
        for k, fn in probes.items():
            samples[k].append((time.time(), fn()))
        if rc:
            print(f"writer failed with exit code {rc}")
            return 1

        writes = [json.loads(line) for line in writes_log.read_text().splitlines()]
        final = _local_sizes(src)
        produced = sum(final.values())
        complete = {k: probes[k]() == final for k in probes}
        sent = {**{k: s.bytes_sent for k, s in stats.items()}, **{k: n.sent for k, n in naive.items()}}
        lags = {k: _lags(writes, samples[k]) for k in probes if k != "EventSync driver"}
        lags["EventSync driver"] = _lags(_arrivals(samples["EventSync S3"]), samples["EventSync driver"])
        end_to_end = _lags(writes, samples["EventSync driver"])
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    bound = a.interval + 1.0
    print(f"tfnb.EventSync: {a.minutes:g}-minute simulated run, interval {a.interval:g} s, "
          f"{len(writes)} flushes, {produced / 1e6:.2f} MB produced in {len(final)} event files")
    print(f"  {'':18} {'bytes sent':>12} {'sent/produced':>14} {'p50 lag':>8} {'p95 lag':>8} {'max lag':>8} "
          f"{'p95/(interval+1s)':>18} {'copy complete':>14}")
    for k in ["EventSync local", "EventSync S3", "EventSync driver", "naive local", "naive S3"]:
        lag = lags[k]
        print(f"  {k:18} {sent[k]:12,d} {sent[k] / produced:14.3f} {_pct(lag, 50):7.2f}s {_pct(lag, 95):7.2f}s "
              f"{max(lag):7.2f}s {_pct(lag, 95) / bound:18.2f} {str(complete[k]):>14}")
    print(f"  (driver lag is from the bytes landing on S3; worker -> S3 -> driver end to end: "
          f"p95 {_pct(end_to_end, 95):.2f} s)")
    print(f"  objects on S3 (EventSync parts): {stats['EventSync S3'].writes}; lag resolution {PROBE_EVERY} s")
    ok = all(sent[k] / produced <= 1.05 and _pct(lags[k], 95) <= bound and complete[k] for k in syncs)
    ratio = sent["naive S3"] / max(1, sent["EventSync S3"])
    print(f"  naive S3 sends {ratio:.1f}x the bytes of EventSync S3;  goal met: {ok}")
    report("sync", {"sync: naive bytes / EventSync bytes": ratio}, {"sync: naive bytes / EventSync bytes": 1.0},
           produced=produced, goal_met=ok)
    return 0


if __name__ == "__main__":
    sys.exit(main())
