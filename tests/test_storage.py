"""The storage layer's contract, asserted alike on three real backends: a local folder, S3 on loopback
(``rclone serve s3``) and fsspec's memory filesystem; then its error mapping and URL/option rules."""
from __future__ import annotations

import hashlib
import os
import re
import threading
import uuid
from pathlib import Path

import pytest

from components import free_port
from tfnb.storage.base import PART, normalize
from tfnb.storage import open_store
from tfnb.errors import ConfigError, MissingDependencyError, StorageError

BACKENDS = ["local", "s3", "memory"]
TREE = {"a.txt": b"alpha", "d/b.bin": bytes(range(256)) * 40, "d/e/c.txt": b"gamma"}


def s3_options(server) -> dict:
    return {"key": server.access_key, "secret": server.secret_key, "endpoint_url": server.endpoint_url,
            "region": "us-east-1"}


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    if request.param == "local":
        s = open_store(str(tmp_path / "root"))
    elif request.param in ("s3", "s3-moto"):
        server = request.getfixturevalue("rclone_s3" if request.param == "s3" else "moto_s3")
        bucket = f"contract-{uuid.uuid4().hex[:10]}"
        server.client().create_bucket(Bucket=bucket)
        s = open_store(f"s3://{bucket}/root", s3_options(server))
    else:
        s = open_store(f"memory://tfnb-{uuid.uuid4().hex[:10]}/root")
    for rel, data in TREE.items():
        s.write(rel, data)
    yield s
    s.close()


def test_list_shallow_and_recursive(store):
    assert {rel: e.size for rel, e in store.list().items()} == {rel: len(d) for rel, d in TREE.items()}
    assert set(store.list(recursive=False)) == {"a.txt"}
    assert set(store.list("d")) == {"b.bin", "e/c.txt"}
    assert store.list("nowhere") == {}


def test_stat_gives_size_mtime_and_a_version_that_changes_with_the_content(store):
    before = store.stat("d/b.bin")
    assert before.size == len(TREE["d/b.bin"]) and before.version and before.mtime >= 0
    assert store.stat("missing") is None and store.stat("d") is None      # a folder is not a file
    store.write("d/b.bin", b"other content")
    after = store.stat("d/b.bin")
    assert after.size == 13 and after.version != before.version


def test_read_whole_and_ranges(store):
    data = TREE["d/b.bin"]
    assert store.read("d/b.bin") == data
    assert store.read("d/b.bin", 100, 50) == data[100:150]   # ranged: no whole-object checksum applies
    assert store.read("d/b.bin", len(data) - 7) == data[-7:]
    assert store.read("d/b.bin", 0, 0) == b""


def test_get_to_a_local_file_with_progress_if_version_and_cancel(store, tmp_path):
    dest = tmp_path / "local" / "b.bin"
    seen = []
    entry = store.stat("d/b.bin")
    store.get("d/b.bin", str(dest), size=entry.size, version=entry.version, on_bytes=seen.append)
    assert dest.read_bytes() == TREE["d/b.bin"] and sum(seen) == entry.size
    store.write("d/b.bin", b"replaced")                   # the listed version is gone: refuse, keep old copy
    with pytest.raises(StorageError, match="d/b.bin"):
        store.get("d/b.bin", str(dest), version=entry.version)
    assert dest.read_bytes() == TREE["d/b.bin"]
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(StorageError, match="cancelled"):
        store.get("a.txt", str(tmp_path / "local" / "a.txt"), cancel=cancel)
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == ["b.bin"]   # no temp, no partial file


def test_put_write_and_put_dir_replace_whole_files(store, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "one").write_bytes(b"1" * 1000)
    (src / "sub" / "two").write_bytes(b"2")
    store.put("up/file", str(src / "one"))
    assert store.read("up/file") == b"1" * 1000
    store.put_dir("tree", str(src))
    store.write("tree/stale", b"from before")
    store.put_dir("tree", str(src))                       # a mirror: what is not in src goes
    assert {r: store.read(f"tree/{r}") for r in store.list("tree")} == {"one": b"1" * 1000, "sub/two": b"2"}


# S3 on moto, not rclone: rclone's local backend rewrites an object in place, so a GET racing a PUT can
# return mixed bytes of the right length there. moto builds a new object per PUT, as S3 does: what this
# test then checks is tfnb, not the server.
@pytest.mark.parametrize("store", ["local", "s3-moto", "memory"], indirect=True)
def test_a_reader_never_sees_a_partial_file_under_the_final_name(store):
    """Every read racing the writes returns one whole version, by checksum, and none fails."""
    versions = [os.urandom(1 << 20), os.urandom(2 << 20)]
    digests = {hashlib.sha256(v).hexdigest() for v in versions}
    store.write("big", versions[0])
    started = done = 0                        # writes begun and finished, counted by the writer
    overlapped, reads, errors, stop = [], [], [], threading.Event()
    read_done = threading.Condition()

    def reader():
        while not stop.is_set():
            before = done
            try:
                digest = hashlib.sha256(store.read("big")).hexdigest()
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                stop.set()
                digest = None
            with read_done:
                reads.append(digest)
                if started > before:          # a write was under way at some point during this read
                    overlapped.append(digest)
                read_done.notify_all()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        # Write on until reads have raced writes a few times; after each write wait for two more reads
        # (the second begins after the write), so both versions are read back whatever the scheduling.
        for i in range(500):
            if len(overlapped) >= 5 and i >= 6 or stop.is_set():
                break
            started += 1
            store.write("big", versions[(i + 1) % 2])
            done += 1
            with read_done:
                n = len(reads)
                assert read_done.wait_for(lambda: len(reads) >= n + 2 or stop.is_set(), 60)
    finally:
        stop.set()
        t.join(60)
    assert not errors, f"a read racing the writes failed: {errors[0]!r}"
    assert len(overlapped) >= 5, f"only {len(overlapped)} of {len(reads)} reads raced a write"
    assert set(reads) == digests, "a read returned bytes that are neither the old nor the new object"
    assert not [rel for rel in store.list() if PART in rel]
    with pytest.raises(StorageError):                     # a failed upload leaves the old content
        store.put("big", "/nonexistent/file")
    assert hashlib.sha256(store.read("big")).hexdigest() in digests


def test_append_where_the_backend_can(store):
    if store.appendable:
        store.append("a.txt", b"+more")
        assert store.read("a.txt") == b"alpha+more"
    else:
        with pytest.raises(StorageError, match="cannot be appended"):
            store.append("a.txt", b"+more")
        assert store.read("a.txt") == b"alpha"


def test_delete_and_missing_files(store):
    store.delete("a.txt")
    store.delete("a.txt")                                 # already gone: not an error
    assert store.stat("a.txt") is None
    with pytest.raises(StorageError, match=r"a\.txt.*does not exist") as e:
        store.read("a.txt")
    assert isinstance(e.value, FileNotFoundError) and store.url("a.txt") in str(e.value)


# ---------------------------------------------------------------- error mapping (S3)


def test_s3_errors_name_the_url_and_the_fix(rclone_s3, tmp_path):
    good = s3_options(rclone_s3)
    with pytest.raises(StorageError, match=r"bucket 'no-such-bucket' does not exist at http://127.*"
                                           r"\(s3://no-such-bucket/x\); check the bucket name"):
        open_store("s3://no-such-bucket/x", good).list()
    with pytest.raises(StorageError, match=r"rejected the credentials for s3://b/x/f .*AWS_ACCESS_KEY_ID"):
        open_store("s3://b/x", dict(good, key="tfnbwrongkey1", secret="wrong-secret-77")).read("f")
    with pytest.raises(StorageError, match=r"cannot connect to the S3 endpoint for s3://b/x/f .*endpoint_url"):
        open_store("s3://b/x", dict(good, endpoint_url=f"http://127.0.0.1:{free_port()}",
                                    config={"retries": {"max_attempts": 1}})).read("f")
    with pytest.raises(ConfigError, match=r"storage option 'password' is not understood.*key, secret"):
        open_store("s3://b/x", {"password": "x"})
    with pytest.raises(ConfigError, match="names no bucket"):
        open_store("s3:///x")


def test_s3_without_credentials(rclone_s3, no_aws_credentials):
    with pytest.raises(StorageError, match=r"no AWS credentials for s3://b/x: set AWS_ACCESS_KEY_ID"):
        open_store("s3://b/x", {"endpoint_url": rclone_s3.endpoint_url}).list()


def test_missing_backend_and_unknown_scheme(no_gcsfs):
    pytest.importorskip("fsspec")
    with pytest.raises(MissingDependencyError, match=r"staging gs://b/x needs .*gcsfs"):
        open_store("gs://b/x", purpose="staging")
    with pytest.raises(ConfigError, match=r"scheme 'nosuchfs'.*use s3://, file://"):
        open_store("nosuchfs://x/y")


# ---------------------------------------------------------------- URLs and endpoint resolution


@pytest.mark.parametrize("url, expected", [
    ("dbfs:/data/x", "/dbfs/data/x"), ("dbfs:///data/x", "/dbfs/data/x"), ("file:///tmp/a", "/tmp/a"),
    ("s3a://b/k", "s3://b/k"), ("s3n://b/k", "s3://b/k"), ("S3://b/k", "s3://b/k"),
    ("/Volumes/c/s/v", "/Volumes/c/s/v"), ("gs://b/k", "gs://b/k")])
def test_one_url_normaliser(url, expected):
    assert normalize(url) == expected


def test_relative_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert normalize("data") == str(tmp_path / "data") and normalize(Path("x")) == str(tmp_path / "x")


def test_dbfs_and_volumes_mounts_do_not_append_in_place():
    assert not open_store("dbfs:/logs").appendable and not open_store("/Volumes/c/s/v").appendable
    assert open_store("/tmp/x").appendable


def test_endpoint_resolution_order(monkeypatch):
    for k in ("TFNB_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    opts = {"key": "k", "secret": "s", "region": "us-east-1"}
    assert open_store("s3://b", opts).endpoint is None
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    assert open_store("s3://b", opts).endpoint == "http://127.0.0.1:1"
    monkeypatch.setenv("TFNB_S3_ENDPOINT_URL", "http://127.0.0.1:2")
    assert open_store("s3://b", opts).endpoint == "http://127.0.0.1:2"
    assert open_store("s3a://b", dict(opts, endpoint_url="http://127.0.0.1:3")).endpoint == "http://127.0.0.1:3"


# ---------------------------------------------------------------- the model cache


def _plant(root: Path, folder_key: str, record: str, uid: int | None, mode: int | None) -> Path:
    """Another user's model where this user's cache entry would be, with a record that vouches for it."""
    entry = root / folder_key
    entry.mkdir(parents=True)
    (entry / "m.keras").write_bytes(b"PLANTED" * 3)
    (entry / "source.json").write_text(record)
    for p in (root, entry, entry / "m.keras", entry / "source.json"):
        if uid is not None:
            os.chown(p, uid, uid)
        if mode is not None:
            os.chmod(p, mode)
    return entry / "m.keras"


@pytest.mark.parametrize("uid, mode, why", [(65534, None, "is owned by uid 65534, not by this user"),
                                            (None, 0o777, r"is writable by other users \(mode 777\)")],
                         ids=["other-owner", "world-writable"])
def test_a_planted_cached_model_is_not_used(rclone_s3, tmp_path, monkeypatch, caplog, uid, mode, why):
    import json
    import logging

    from tfnb.data import model

    client, bucket = rclone_s3.client(), f"models-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    real = os.urandom(21)                                  # the same size as the planted file
    client.put_object(Bucket=bucket, Key="m.keras", Body=real)
    options, url = s3_options(rclone_s3), f"s3://{bucket}/m.keras"
    source, version, files = model._locate(url, options)
    key = hashlib.sha256(f"{url}\n{version}".encode()).hexdigest()[:24]
    record = json.dumps({"url": url, "version": version, "files": files})
    monkeypatch.setenv("TFNB_STATE_DIR", str(tmp_path))    # where the cache goes without TFNB_MODEL_CACHE_DIR
    cache = tmp_path / f"tfnb-model-cache-{os.getuid()}"
    planted = _plant(cache, key, record, uid, mode)
    with caplog.at_level(logging.WARNING, logger="tfnb.data.model"):
        got = model._fetch(source, version, files, options, "")
    model._fresh_cache.cache_clear()
    assert Path(got).read_bytes() == real and Path(got) != planted
    assert planted.read_bytes() == b"PLANTED" * 3          # nothing in the foreign folder touched
    assert re.search(rf"{cache} {why}.*so tfnb will not trust what is in it; remove it .*\(TFNB_MODEL_CACHE_DIR\); "
                     rf"downloading models to {Path(got).parents[1]} instead", caplog.text), caplog.text


def test_a_cached_model_that_does_not_match_the_source_is_fetched_again(rclone_s3, tmp_path):
    from tfnb.data import model

    client = rclone_s3.client()
    client.create_bucket(Bucket="models2")
    client.put_object(Bucket="models2", Key="m.keras", Body=b"version one")
    options, url = s3_options(rclone_s3), "s3://models2/m.keras"
    first = model._fetch(*model._locate(url, options), options, str(tmp_path))
    Path(first).write_bytes(b"tampered")                   # same record, wrong size: not trusted
    again = model._fetch(*model._locate(url, options), options, str(tmp_path))
    assert again == first and Path(again).read_bytes() == b"version one"
    client.put_object(Bucket="models2", Key="m.keras", Body=b"version two!")
    assert Path(model._fetch(*model._locate(url, options), options, str(tmp_path))).read_bytes() \
        == b"version two!"
    assert oct(os.stat(tmp_path / f"tfnb-model-cache-{os.getuid()}").st_mode & 0o777) == "0o700"


# ---------------------------------------------------------------- S3 with nothing but the environment

ONLY_ENV = r"""
import hashlib, json, os, sys
import numpy as np
bucket, work = sys.argv[1:3]
import boto3
admin = boto3.client("s3", endpoint_url=os.environ["TFNB_S3_ENDPOINT_URL"])   # test set-up only
admin.create_bucket(Bucket=bucket)
data = {f"data/part-{i}.bin": bytes([i]) * (1000 + i) for i in range(4)}
for k, v in data.items():
    admin.put_object(Bucket=bucket, Key=k, Body=v)
import tfnb
from tfnb.data.model import _locate

staged = tfnb.stage(f"s3://{bucket}/data", f"{work}/staged")
assert {os.path.basename(p): open(p, "rb").read() for p in staged.paths} == {k[5:]: v for k, v in data.items()}

from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
out = tfnb.run(lambda ctx: ctx.model_dir, num_workers=1, model_dir=f"s3://{bucket}/run1", preimport=(),
               spark=spark, display=False)
assert out == f"s3://{bucket}/run1", out
status = json.loads(admin.get_object(Bucket=bucket, Key="run1/tfnb_status.json")["Body"].read())
assert status["state"] == "succeeded", status

import tensorflow as tf, tf_keras
x = np.random.RandomState(0).rand(12, 4).astype("float32")
def dense(init):
    return tf_keras.Sequential([tf_keras.layers.Input((4,)), tf_keras.layers.Dense(3, kernel_initializer=init)])
model = dense("glorot_uniform")
model.save(f"{work}/m.keras")
admin.upload_file(f"{work}/m.keras", bucket, "models/m.keras")
url = f"s3://{bucket}/models/m.keras"
# another user's model where this user's cache entry would be, vouched for by a forged record
source, version, files = _locate(url, {})
root = os.path.join(os.environ["TFNB_MODEL_CACHE_DIR"], f"tfnb-model-cache-{os.getuid()}")
entry = os.path.join(root, hashlib.sha256(f"{url}\n{version}".encode()).hexdigest()[:24])
os.makedirs(entry)
dense("ones").save(os.path.join(entry, "m.keras"))
with open(os.path.join(entry, "source.json"), "w") as f:
    f.write(json.dumps({"url": url, "version": version, "files": files}))
for d, _, names in os.walk(root):
    for p in [d] + [os.path.join(d, n) for n in names]:
        os.chown(p, 65534, 65534)
df = spark.createDataFrame([(i, x[i].tolist()) for i in range(len(x))], "id long, features array<float>")
rows = sorted(tfnb.predict(df, url, input_cols=["features"]).collect())
np.testing.assert_allclose(np.array([r.prediction for r in rows]), model.predict(x, verbose=0), rtol=1e-5)

with tf.summary.create_file_writer(f"{work}/tb/train").as_default():
    for step in range(3):
        tf.summary.scalar("loss", 1.0 / (step + 1), step=step)
tfnb.EventSync(f"{work}/tb", f"s3://{bucket}/logs").stop()
tfnb.EventSync(f"s3://{bucket}/logs", f"{work}/tb2").stop()
def tree(d):
    return {os.path.relpath(os.path.join(p, n), d): open(os.path.join(p, n), "rb").read()
            for p, _, ns in os.walk(d) for n in ns}
assert tree(f"{work}/tb") == tree(f"{work}/tb2") and tree(f"{work}/tb"), tree(f"{work}/tb2")
spark.stop()
print("ALL OK")
"""


def test_s3_everywhere_with_only_an_endpoint_and_credentials_in_the_environment(rclone_s3, tmp_path):
    """stage, run(model_dir=s3://), predict from s3:// (past a planted cache) and EventSync both ways,
    with boto3 alone: no storage options anywhere, only TFNB_S3_ENDPOINT_URL and AWS keys."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TFNB_"))}
    env.update(AWS_ACCESS_KEY_ID=rclone_s3.access_key, AWS_SECRET_ACCESS_KEY=rclone_s3.secret_key,
               TFNB_S3_ENDPOINT_URL=rclone_s3.endpoint_url, TFNB_MODEL_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", ONLY_ENV, f"only-env-{uuid.uuid4().hex[:8]}", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ALL OK"), done.stderr[-3000:]
