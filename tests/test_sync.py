"""tfnb.EventSync with real tf.summary event files, a real S3 server and TensorBoard's own reader."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from s3server import rclone_s3  # noqa: F401

from tfnb.errors import ConfigError, TfnbError
from tfnb.monitor.sync import EventSync, complete_records
from tfnb.storage import PART as TMP_MARK

import tensorflow as tf  # a hard dependency: a broken install fails here, it does not skip


class Run:
    """A training run's TensorBoard writers (train and validation), flushed on demand."""

    def __init__(self, log_dir: Path):
        self.writers = {name: tf.summary.create_file_writer(str(log_dir / name)) for name in ("train", "validation")}
        self.step = 0

    def write(self, steps: int = 1, image: bool = False) -> None:
        for _ in range(steps):
            for name, writer in self.writers.items():
                with writer.as_default():
                    tf.summary.scalar("epoch_loss", 1.0 / (self.step + 1), step=self.step)
                    tf.summary.scalar("epoch_accuracy", self.step / 1000.0, step=self.step)
                    if image:
                        tf.summary.image("sample", tf.random.uniform((1, 32, 32, 3), seed=self.step), step=self.step)
            self.step += 1
        for writer in self.writers.values():
            writer.flush()

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()


def event_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*tfevents*"))}


def tb_scalars(log_dir: Path, run: str) -> dict[str, list[int]]:
    """Steps per tag, as TensorBoard's own reader loads them from ``log_dir/run``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir / run), size_guidance={"tensors": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Tensors(tag)] for tag in acc.Tags()["tensors"]}


def s3_options(server) -> dict:
    return {"endpoint_url": server.endpoint_url, "aws_access_key_id": server.access_key,
            "aws_secret_access_key": server.secret_key, "region_name": "us-east-1"}


def test_local_sync_sends_only_new_bytes(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    run = Run(src)
    sync = EventSync(str(src), str(dst), interval=3600)   # passes only when flushed: deterministic
    sizes_seen = []
    for _ in range(5):
        run.write(steps=20)
        sync.flush()
        sizes_seen.append(sum(len(b) for b in event_files(src).values()))
    run.close()
    stats = sync.stop()
    produced = sum(len(b) for b in event_files(src).values())
    assert event_files(dst) == event_files(src)              # byte for byte, both runs
    assert stats.event_bytes == produced                     # every byte sent exactly once
    assert stats.bytes_sent < sum(sizes_seen) / 2            # a whole-file copy per flush sends ~3x
    assert tb_scalars(dst, "train")["epoch_loss"] == list(range(100))
    assert not list(dst.rglob(f"*{TMP_MARK}*"))


def test_only_whole_records_reach_the_destination(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    run = Run(src)
    run.write(steps=3)
    run.close()
    (name, data), = [(k, v) for k, v in event_files(src).items() if k.startswith("train")]
    whole = complete_records(data)
    assert whole == len(data)
    # another writer's file, caught mid-record: all of it but the last 5 bytes
    (src / "other").mkdir()
    torn = src / "other" / "events.out.tfevents.1.host.1.v2"
    torn.write_bytes(data[:-5])
    sync = EventSync(str(src), str(dst), interval=3600)
    sync.flush()
    shipped = (dst / "other" / torn.name).read_bytes()
    assert len(shipped) < len(data) - 5 and complete_records(shipped) == len(shipped)
    assert list(tf.data.TFRecordDataset(str(dst / "other" / torn.name)))   # TensorFlow reads it cleanly
    with open(torn, "ab") as f:
        f.write(data[-5:])
    sync.stop()
    assert (dst / "other" / torn.name).read_bytes() == data


def test_no_partial_file_visible_while_syncing(tmp_path):
    """A reader listing the destination during the sync never meets a file before it is whole."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    run = Run(src)
    first_sight: dict[str, bytes] = {}
    strays: list[str] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            for p in list(dst.rglob("*")) if dst.exists() else []:
                if not p.is_file() or p.name in first_sight:
                    continue
                if "tfevents" in p.name:
                    first_sight[p.name] = p.read_bytes()
                elif TMP_MARK not in p.name:
                    strays.append(p.name)
            time.sleep(0.002)  # a reader, not a spinner hogging the GIL

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with EventSync(str(src), str(dst), interval=0.05):
            for _ in range(10):
                run.write(steps=5, image=True)
                time.sleep(0.05)
    finally:
        stop.set()
        watcher.join()
    run.close()
    assert len(first_sight) == 2 and not strays
    # a new file appears under its name only once complete (written under a temp name, then renamed);
    # later appends are whole records too (a reader racing one append sees a truncated record, which
    # TensorBoard's loader retries: event_file_loader.py "Truncated record ... retrying can resume")
    for name, data in first_sight.items():
        assert data and complete_records(data) == len(data), name
    assert event_files(dst) == event_files(src)


def test_final_flush_when_the_with_block_raises(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    run = Run(src)
    with pytest.raises(RuntimeError, match="training diverged"):
        with EventSync(str(src), str(dst), interval=3600):   # no pass but the first and the final one
            run.write(steps=30)
            raise RuntimeError("training diverged")
    run.close()
    assert tb_scalars(dst, "train")["epoch_loss"] == list(range(30))
    assert tb_scalars(dst, "validation")["epoch_accuracy"] == list(range(30))


def test_restarted_sync_resumes_without_duplicates(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    run = Run(src)
    run.write(steps=10)
    first = EventSync(str(src), str(dst), interval=3600).stop()
    run.write(steps=10)
    run.close()
    second = EventSync(str(src), str(dst), interval=3600).stop()
    produced = sum(len(b) for b in event_files(src).values())
    assert first.event_bytes + second.event_bytes == produced
    assert event_files(dst) == event_files(src)


def test_other_files_are_copied_whole(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    asset = src / "plugins" / "projector" / "projector_config.pbtxt"
    asset.parent.mkdir(parents=True)
    asset.write_text("embeddings { tensor_name: 'x' }")
    old = time.time() - 10
    os.utime(asset, (old, old))                              # settled: copied on the next pass
    sync = EventSync(str(src), str(dst), interval=3600)
    sync.flush()
    assert (dst / "plugins" / "projector" / "projector_config.pbtxt").read_text() == asset.read_text()
    before = sync.stats.bytes_sent
    sync.flush()
    assert sync.stats.bytes_sent == before                   # unchanged: not copied again
    sync.stop()


def test_s3_parts_then_driver_side_reassembly(tmp_path, rclone_s3):
    """Chief: local -> S3 as immutable part objects. Driver: S3 -> local dir, read by TensorBoard."""
    client = rclone_s3.client()
    client.create_bucket(Bucket="syncrun")
    options = s3_options(rclone_s3)
    src, local = tmp_path / "worker-logs", tmp_path / "tensorboard"
    run = Run(src)
    chief = EventSync(str(src), "s3://syncrun/run1/logs", interval=3600, storage_options=options)
    assert chief.mode == "parts"
    driver = EventSync("s3://syncrun/run1/logs", str(local), interval=3600, storage_options=options)
    assert driver.mode == "append"
    for i in range(4):
        run.write(steps=25, image=(i == 0))
        chief.flush()
        driver.flush()
        assert tb_scalars(local, "train")["epoch_loss"] == list(range(25 * (i + 1)))
    run.close()
    chief.stop()
    driver.stop()

    objects = client.list_objects_v2(Bucket="syncrun", Prefix="run1/logs/")["Contents"]
    produced = sum(len(b) for b in event_files(src).values())
    assert sum(o["Size"] for o in objects) == produced       # nothing uploaded twice
    assert all(".part-" in o["Key"] for o in objects)
    assert chief.stats.event_bytes == produced
    assert event_files(local) == event_files(src)            # reassembled byte for byte
    steps = tb_scalars(local, "validation")
    assert steps["epoch_loss"] == steps["epoch_accuracy"] == list(range(100))
    assert steps["sample"] == list(range(25))                # the images of the first 25 steps


def test_driver_reads_growing_event_files_on_s3_by_range(tmp_path, rclone_s3):
    """Event files rewritten whole on the store (another uploader): only the new bytes are fetched."""
    client = rclone_s3.client()
    client.create_bucket(Bucket="rangerun")
    src = tmp_path / "src"
    run = Run(src)
    run.write(steps=10)
    (name, data), = [(k, v) for k, v in event_files(src).items() if k.startswith("train")]
    client.put_object(Bucket="rangerun", Key=f"logs/{name}", Body=data)
    local = tmp_path / "tb"
    sync = EventSync("s3://rangerun/logs", str(local), interval=3600, storage_options=s3_options(rclone_s3))
    sync.flush()
    run.write(steps=10)
    run.close()
    (_, longer), = [(k, v) for k, v in event_files(src).items() if k.startswith("train")]
    client.put_object(Bucket="rangerun", Key=f"logs/{name}", Body=longer)
    stats = sync.stop()
    assert (local / name).read_bytes() == longer
    assert stats.event_bytes == len(longer)
    assert tb_scalars(local, "train")["epoch_loss"] == list(range(20))


def test_s3_outage_is_retried_and_reported(tmp_path):
    """A destination that refuses connections: the background loop keeps going; flush() raises."""
    src = tmp_path / "src"
    Run(src).write(steps=2)
    options = {"endpoint_url": "http://127.0.0.1:9", "aws_access_key_id": "x" * 16,
               "aws_secret_access_key": "y" * 32, "region_name": "us-east-1",
               "client_kwargs": {"config": __import__("botocore.config").config.Config(
                   connect_timeout=1, retries={"max_attempts": 1})}}
    sync = EventSync(str(src), "s3://nobucket/logs", interval=0.05, storage_options=options).start()
    deadline = time.monotonic() + 60
    while sync.stats.errors < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sync.running and sync.stats.errors >= 2 and "Connect" in sync.stats.last_error
    with pytest.raises(TfnbError, match="event sync .* failed"):
        sync.stop()


@pytest.mark.parametrize("kwargs, fix", [
    ({"interval": 0}, "interval=0"),
    ({"mode": "rsync"}, "mode='rsync'"),
    ({"mode": "append", "dst": "/dbfs/logs"}, "mode='parts'"),
])
def test_bad_arguments_fail_at_construction(tmp_path, kwargs, fix):
    dst = kwargs.pop("dst", str(tmp_path / "dst"))
    with pytest.raises(ConfigError, match=fix):
        EventSync(str(tmp_path / "src"), dst, **kwargs)


def test_overlapping_directories_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="overlap"):
        EventSync(str(tmp_path), str(tmp_path / "mirror"))
