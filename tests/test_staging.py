"""tfnb.stage against a real S3 server on loopback (rclone serve s3; moto's server for IAM denials),
fsspec sources, and inside tfnb.run on a real local[2] Spark session."""
from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components import free_port
from s3region import start_region_front
from s3server import moto_enforce_iam, put_tree  # fixtures rclone_s3 and moto_s3 come from conftest
from tfnb.errors import ConfigError, MissingDependencyError, StorageError
from tfnb.data.staging import MANIFEST_NAME, RemoteFile, StageResult, assign_shard, stage
from tfnb.storage import PART as PART_SUFFIX

MiB = 1024 * 1024
BUCKET = "tfnb-data"
PREFIX = "train"


def _tree() -> dict[str, bytes]:
    """Files below s3://tfnb-data/train/: varied sizes, an empty file, a nested folder, and one object
    bigger than the 1 MiB chunk so it is fetched as parallel ranged GETs."""
    rng = random.Random(7)
    files = {f"part-{i:03d}.tfrecord": rng.randbytes(rng.randrange(1, 300_000)) for i in range(14)}
    files["empty.tfrecord"] = b""
    files["nested/deeper/a.tfrecord"] = rng.randbytes(40_000)
    files["nested/b.tfrecord"] = rng.randbytes(123_457)
    files["big.tfrecord"] = rng.randbytes(int(2.5 * MiB) + 3)
    return files


TREE = _tree()


@pytest.fixture(scope="module")
def s3(rclone_s3):  # noqa: F811
    """The rclone server with the training tree uploaded (plus a sibling prefix that must not match)."""
    client = rclone_s3.client()
    put_tree(client, BUCKET, {f"{PREFIX}/{k}": v for k, v in TREE.items()})
    put_tree(client, BUCKET, {"train-extra/not-mine.tfrecord": b"sibling prefix"})
    put_tree(client, "tfnb-empty", {"other/x.bin": b"x"})
    return rclone_s3


def opts(server) -> dict:
    return {"aws_access_key_id": server.access_key, "aws_secret_access_key": server.secret_key,
            "region_name": "us-east-1"}


def s3_stage(server, dest, url=f"s3://{BUCKET}/{PREFIX}", **kw) -> StageResult:
    # more connections than files, so the big file is fetched in ranges (fewer: one GET per file)
    kw.setdefault("concurrency", 2 * len(TREE))
    return stage(url, dest, endpoint_url=server.endpoint_url, storage_options=opts(server),
                 chunk_size=MiB, **kw)


def read_tree(root: Path) -> dict[str, bytes]:
    """Visible files below root (what a user's glob sees), by relative path."""
    out = {}
    for p in root.rglob("*"):
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts):
            out[p.relative_to(root).as_posix()] = p.read_bytes()
    return out


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob(f"*{PART_SUFFIX}*"))


# ---------------------------------------------------------------- S3 happy paths


def test_stages_everything_with_paths_kept(s3, tmp_path):
    seen = []
    r = s3_stage(s3, tmp_path / "all", callback=seen.append)
    assert read_tree(tmp_path / "all") == TREE
    assert r.files == len(TREE) and r.bytes == sum(map(len, TREE.values()))
    assert r.downloaded_files == r.files and r.downloaded_bytes == r.bytes and r.skipped_files == 0
    assert r.seconds > 0 and r.mb_per_s == pytest.approx(r.bytes / r.seconds / 1e6)
    assert r.dest == str(tmp_path / "all") and (r.index, r.count) == (0, 1)
    assert sorted(r.paths) == sorted(str(tmp_path / "all" / k) for k in TREE)
    assert leftovers(tmp_path / "all") == []
    manifest = json.loads((tmp_path / "all" / MANIFEST_NAME).read_text())
    assert set(manifest["files"]) == set(TREE)
    assert manifest["files"]["big.tfrecord"]["version"] == hashlib.md5(TREE["big.tfrecord"]).hexdigest()
    # progress: monotonic, from the calling thread, ending at the total
    assert seen[0].bytes_done == 0 and seen[-1].bytes_done == seen[-1].bytes_total == r.bytes
    assert seen[-1].files_done == seen[-1].files_total == r.files
    assert all(a.bytes_done <= b.bytes_done for a, b in zip(seen, seen[1:]))


@pytest.mark.parametrize("client", ["boto3", "native, 206 ranges (moto)"])
def test_every_s3_client_stages_the_same_files(s3, moto_s3, tmp_path, monkeypatch, client):  # noqa: F811
    """boto3 alone (TFNB_S3_NATIVE=0), and obstore against a server that answers ranges with 206;
    the test above is obstore against rclone, which answers them with 200 (one GET per object)."""
    server = s3
    if client == "boto3":
        monkeypatch.setenv("TFNB_S3_NATIVE", "0")
    else:
        pytest.importorskip("obstore")
        server = moto_s3
        put_tree(server.client(), BUCKET, {f"{PREFIX}/{k}": v for k, v in TREE.items()})
    r = s3_stage(server, tmp_path)
    assert read_tree(tmp_path) == TREE and leftovers(tmp_path) == []
    assert r.downloaded_bytes == sum(map(len, TREE.values()))


@pytest.fixture
def eu_bucket(moto_s3, tmp_path, monkeypatch):  # noqa: F811
    """The training tree in bucket tfnb-eu of region eu-west-1, and no region configured anywhere."""
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    client = moto_s3.client()
    try:
        client.create_bucket(Bucket="tfnb-eu", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    put_tree(client, "tfnb-eu", {f"{PREFIX}/{k}": v for k, v in TREE.items()})
    return moto_s3


@pytest.mark.parametrize("name_region", [True, False], ids=["AWS's 301", "a bare 301"])
def test_a_bucket_in_another_region_with_no_region_set(eu_bucket, tmp_path, name_region):
    """A request signed for the wrong region gets 301 PermanentRedirect, as from AWS. botocore follows
    it; obstore cannot, so the store asks the bucket's region once and downloads natively in it. A
    server that names no region makes one error that says which setting to give."""
    pytest.importorskip("obstore")
    front = start_region_front(eu_bucket.endpoint_url, {"tfnb-eu": "eu-west-1"}, name_region=name_region)
    run = lambda: stage("s3://tfnb-eu/train", tmp_path / "eu", endpoint_url=front.endpoint_url,  # noqa: E731
                        storage_options={"key": "testing", "secret": "testing"}, chunk_size=MiB, concurrency=4)
    try:
        if not name_region:
            with pytest.raises(StorageError, match=r"^bucket 'tfnb-eu' is in another region, not us-east-1.*"
                                                   r"storage_options=\{'region': \.\.\.\} or AWS_DEFAULT_REGION"):
                run()
            return
        run()
    finally:
        front.stop()
    assert read_tree(tmp_path / "eu") == TREE and leftovers(tmp_path / "eu") == []
    reads = {(region, agent.split("/")[0]) for method, path, region, agent in front.seen
             if method == "GET" and path.startswith("/tfnb-eu/train/")}
    assert reads == {("eu-west-1", "object_store")}, front.seen


def test_rerun_downloads_nothing(s3, tmp_path):
    first = s3_stage(s3, tmp_path)
    mtimes = {p: os.stat(p).st_mtime_ns for p in first.paths}
    again = s3_stage(s3, tmp_path)
    assert (again.downloaded_files, again.downloaded_bytes) == (0, 0)
    assert again.skipped_files == again.files == first.files and again.bytes == first.bytes
    assert {p: os.stat(p).st_mtime_ns for p in again.paths} == mtimes


def test_shards_are_disjoint_complete_and_balanced(s3, tmp_path):
    results = [s3_stage(s3, tmp_path / f"w{i}", index=i, count=3) for i in range(3)]
    trees = [read_tree(tmp_path / f"w{i}") for i in range(3)]
    names = [set(t) for t in trees]
    assert set().union(*names) == set(TREE)
    assert sum(map(len, names)) == len(TREE)                      # disjoint
    for t in trees:
        assert all(TREE[k] == v for k, v in t.items())
    loads = [r.bytes for r in results]
    assert max(loads) - min(loads) <= max(map(len, TREE.values()))
    assert [r.files for r in results] == [len(n) for n in names]
    # deterministic: the same shard again is the same files
    assert s3_stage(s3, tmp_path / "w1-again", index=1, count=3).paths == tuple(
        p.replace(str(tmp_path / "w1"), str(tmp_path / "w1-again")) for p in results[1].paths)


def test_assign_shard_rules():
    files = [RemoteFile(f"s3://b/{i}", str(i), size, "") for i, size in
             enumerate([100, 90, 50, 50, 40, 10, 0, 0, 0, 0])]
    shards = [assign_shard(files, i, 2) for i in range(2)]
    assert sorted(f.rel for s in shards for f in s) == sorted(f.rel for f in files)
    loads = [sum(f.size for f in s) for s in shards]
    assert loads == [160, 180] and max(loads) - min(loads) <= 100   # greedy: within one file's size
    empties = [RemoteFile(f"s3://b/e{i}", f"e{i}", 0, "") for i in range(4)]
    assert [len(assign_shard(empties, i, 2)) for i in range(2)] == [2, 2]   # equal bytes: by count
    assert assign_shard(files, 0, 1) == sorted(files, key=lambda f: f.rel)
    assert assign_shard(list(reversed(files)), 1, 2) == shards[1]
    assert assign_shard(files[:2], 4, 5) == []                  # more shards than files
    with pytest.raises(ConfigError, match=r"index=2 .* 0\.\.1 for count=2.*ctx\.task_index"):
        assign_shard(files, 2, 2)
    with pytest.raises(ConfigError, match="count=0"):
        assign_shard(files, 0, 0)


def test_single_object_url_and_env_endpoint(s3, tmp_path, monkeypatch):
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("TFNB_S3_ENDPOINT_URL", s3.endpoint_url)
    r = stage(f"s3a://{BUCKET}/{PREFIX}/nested/b.tfrecord", tmp_path)
    assert read_tree(tmp_path) == {"b.tfrecord": TREE["nested/b.tfrecord"]}
    assert r.files == 1


def test_workers_sharing_one_dest_dir_merge_the_manifest(s3, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda i: s3_stage(s3, tmp_path, index=i, count=2), range(2)))
    assert sum(r.files for r in results) == len(TREE)
    assert read_tree(tmp_path) == TREE
    whole = s3_stage(s3, tmp_path)            # both shards are in the one manifest
    assert whole.downloaded_files == 0 and whole.skipped_files == len(TREE)


# ---------------------------------------------------------------- resume


def test_resume_after_partial_state(s3, tmp_path):
    """A kill leaves: a partial temp file (file missing), a renamed file the manifest does not know
    yet, and one whose bytes were damaged. A rerun fetches only what is missing or wrong."""
    s3_stage(s3, tmp_path)
    manifest = tmp_path / MANIFEST_NAME
    data = json.loads(manifest.read_text())
    missing, unrecorded, damaged = "part-003.tfrecord", "nested/b.tfrecord", "big.tfrecord"
    (tmp_path / missing).unlink()
    (tmp_path / f".{missing}{PART_SUFFIX}").write_bytes(TREE[missing][:10])
    (tmp_path / f".{missing}{PART_SUFFIX}.a1B2c3D4").write_bytes(TREE[missing][:7])
    del data["files"][unrecorded]
    del data["files"][damaged]
    (tmp_path / damaged).write_bytes(bytes(len(TREE[damaged])))   # same size, wrong bytes
    manifest.write_text(json.dumps(data))
    assert missing not in read_tree(tmp_path)
    # the temps match neither a user's "*.tfrecord" nor, being hidden, glob's "*.tfrecord*"
    assert not [p for p in tmp_path.glob("*.tfrecord") if p.name.startswith(".")]
    assert not [p for p in glob.glob(str(tmp_path / "*.tfrecord*")) if PART_SUFFIX in p]

    r = s3_stage(s3, tmp_path)
    assert r.downloaded_files == 2
    assert r.downloaded_bytes == len(TREE[missing]) + len(TREE[damaged])
    assert r.skipped_files == len(TREE) - 2
    assert read_tree(tmp_path) == TREE
    assert leftovers(tmp_path) == []
    assert set(json.loads(manifest.read_text())["files"]) == set(TREE)


class Stop(Exception):
    pass


def test_interrupted_staging_cleans_up_and_reruns(s3, tmp_path):
    """An exception mid-download (here from the callback, as Ctrl-C would) cancels the transfers,
    ends their threads and removes the temp files; the next call completes the shard."""
    import threading

    before = set(threading.enumerate())

    def stop(progress):
        raise Stop()

    with pytest.raises(Stop):
        s3_stage(s3, tmp_path, callback=stop)
    assert leftovers(tmp_path) == []
    assert [t.name for t in set(threading.enumerate()) - before if t.is_alive()] == []
    assert read_tree(tmp_path) == {}
    again = s3_stage(s3, tmp_path)
    assert again.downloaded_files == len(TREE) and read_tree(tmp_path) == TREE


KILL_CHILD = r"""
import json, sys
from tfnb.data.staging import stage
url, dest, endpoint = sys.argv[1:4]
stage(url, dest, index=0, count=2, endpoint_url=endpoint, chunk_size=1 << 20)

def block(p):
    print(json.dumps(p.__dict__), flush=True)
    sys.stdin.readline()          # wait here, downloads running, until the parent kills us

stage(url, dest, endpoint_url=endpoint, chunk_size=1 << 20, concurrency=2, callback=block)
"""


def test_killed_staging_leaves_no_file_that_looks_complete(s3, tmp_path):
    """SIGKILL while the second half is downloading; the rerun fetches only that half."""
    client = s3.client()
    rng = random.Random(3)
    files = {f"kill/f{i:02d}.bin": rng.randbytes(256 * 1024 + i) for i in range(12)}
    put_tree(client, BUCKET, files)
    url, dest = f"s3://{BUCKET}/kill", tmp_path / "dest"
    env = dict(os.environ, **s3.env())
    proc = subprocess.Popen([sys.executable, "-c", KILL_CHILD, url, str(dest), s3.endpoint_url],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line, "the child ended before it started downloading"
        deadline = time.monotonic() + 30
        while not leftovers(dest) and time.monotonic() < deadline:
            time.sleep(0.02)      # poll the filesystem for the first temp file
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
        proc.stdin.close()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    shard0 = {f.rel for f in assign_shard([RemoteFile("", k[5:], len(v), "") for k, v in files.items()], 0, 2)}
    visible = read_tree(dest)
    assert set(visible) == shard0                                  # nothing of shard 1 looks complete
    assert all(visible[k] == files["kill/" + k] for k in visible)
    assert leftovers(dest)                                         # in-flight temps were hidden

    r = s3_stage(s3, dest, url=url)
    assert r.downloaded_files == len(files) - len(shard0) and r.skipped_files == len(shard0)
    assert read_tree(dest) == {k[5:]: v for k, v in files.items()}
    assert leftovers(dest) == []


# ---------------------------------------------------------------- disk space


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 1 MiB tmpfs (needs root, which this project's machines and CI have)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_not_enough_disk_fails_before_downloading_with_the_numbers(s3, tiny_disk):
    need = sum(map(len, TREE.values()))
    free = os.statvfs(tiny_disk).f_bavail * os.statvfs(tiny_disk).f_frsize
    with pytest.raises(StorageError) as e:
        s3_stage(s3, tiny_disk / "data")
    msg = str(e.value)
    assert f"needs {need} bytes" in msg and f"only {free} bytes" in msg
    assert f"s3://{BUCKET}/{PREFIX}" in msg and "bigger disk" in msg
    assert read_tree(tiny_disk) == {} and leftovers(tiny_disk) == []
    small = s3_stage(s3, tiny_disk / "small", url=f"s3://{BUCKET}/{PREFIX}/nested")
    assert small.files == 2                                        # what fits is staged


# ---------------------------------------------------------------- errors


def test_no_such_bucket(s3, tmp_path):
    with pytest.raises(StorageError, match=r"bucket 'no-such-bucket' does not exist at http://127\.0\.0\.1:\d+ "
                                           r"\(s3://no-such-bucket/x\); check the bucket name"):
        s3_stage(s3, tmp_path, url="s3://no-such-bucket/x")


def test_empty_prefix(s3, tmp_path):
    with pytest.raises(StorageError, match=r"s3://tfnb-empty/nothing-here has no files.*check the URL"):
        s3_stage(s3, tmp_path, url="s3://tfnb-empty/nothing-here")
    assert not (tmp_path / MANIFEST_NAME).exists()


def test_rejected_credentials(s3, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(StorageError, match=r"rejected the credentials for s3://tfnb-data/train "
                                           r"\(InvalidAccessKeyId.*check AWS_ACCESS_KEY_ID"):
        stage(f"s3://{BUCKET}/{PREFIX}", tmp_path, endpoint_url=s3.endpoint_url,
              storage_options={"aws_access_key_id": "tfnbwrongkey1", "aws_secret_access_key": "wrong-secret-77"})
    assert "wrong-secret-77" not in caplog.text


def test_no_credentials(s3, tmp_path, no_aws_credentials):
    with pytest.raises(StorageError, match=r"no AWS credentials for s3://tfnb-data/train: set "
                                           r"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.*instance profile"):
        stage(f"s3://{BUCKET}/{PREFIX}", tmp_path, endpoint_url=s3.endpoint_url)


def test_unreachable_endpoint(tmp_path):
    from botocore.config import Config

    port = free_port()  # nothing listens there, and no other test is handed it
    with pytest.raises(StorageError, match=r"cannot connect to the S3 endpoint for s3://b/p .*endpoint_url"):
        stage("s3://b/p", tmp_path, endpoint_url=f"http://127.0.0.1:{port}",
              storage_options={"aws_access_key_id": "k", "aws_secret_access_key": "s",
                               "config": Config(retries={"max_attempts": 1})})


def test_access_denied_from_iam(moto_s3, tmp_path):  # noqa: F811
    import boto3

    admin = moto_s3.client()
    put_tree(admin, "locked", {"data/a.bin": b"secret data"})
    iam = boto3.client("iam", endpoint_url=moto_s3.endpoint_url, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    iam.create_user(UserName="no-rights")
    key = iam.create_access_key(UserName="no-rights")["AccessKey"]
    moto_enforce_iam(moto_s3)
    with pytest.raises(StorageError, match=r"access denied listing s3://locked/data at http.*"
                                           r"s3:ListBucket on bucket 'locked' and s3:GetObject"):
        stage("s3://locked/data", tmp_path, endpoint_url=moto_s3.endpoint_url,
              storage_options={"aws_access_key_id": key["AccessKeyId"],
                               "aws_secret_access_key": key["SecretAccessKey"], "region_name": "us-east-1"})
    assert read_tree(tmp_path) == {}


def test_bad_arguments(tmp_path):
    with pytest.raises(ConfigError, match=r"scheme 'nosuchfs'.*use s3://, file://"):
        stage("nosuchfs://x/y", tmp_path)
    with pytest.raises(ConfigError, match="concurrency=0"):
        stage(str(tmp_path), tmp_path / "d", concurrency=0)
    with pytest.raises(ConfigError, match="index=-1"):
        stage(str(tmp_path), tmp_path / "d", index=-1, count=2)
    with pytest.raises(ConfigError, match="names no bucket"):
        stage("s3:///x", tmp_path)
    with pytest.raises(ConfigError, match=r"Invalid endpoint.*check endpoint_url \(now 'not a url'\)"):
        stage("s3://b/x", tmp_path, endpoint_url="not a url")


def test_missing_fsspec_backend(tmp_path, no_gcsfs):
    pytest.importorskip("fsspec")
    with pytest.raises(MissingDependencyError, match=r"staging gs://bucket/train needs .*gcsfs"):
        stage("gs://bucket/train", tmp_path)


def test_importable_without_boto3(tmp_path):
    """Blocking boto3: the module imports, local staging works, S3 says what to install."""
    code = (
        "import sys; sys.modules['boto3'] = None\n"
        "import tfnb.data.staging as s\n"
        f"r = s.stage({str(tmp_path / 'src')!r}, {str(tmp_path / 'dst')!r}); print(r.files)\n"
        "try:\n    s.stage('s3://b/p', '/tmp/never')\n"
        "except s.MissingDependencyError as e:\n    print(e)\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"x")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["1", "boto3 is needed for staging s3://b/p but is not installed; "
                                            "pip install boto3"]


# ---------------------------------------------------------------- fsspec sources


@pytest.mark.parametrize("as_url", [False, True], ids=["path", "file-url"])
def test_local_and_file_url_sources(tmp_path, as_url):
    src = tmp_path / "src"
    for rel, data in TREE.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    url = src.as_uri() if as_url else str(src)
    results = [stage(url, tmp_path / "dst", index=i, count=2) for i in range(2)]
    assert read_tree(tmp_path / "dst") == TREE
    assert sum(r.files for r in results) == len(TREE)
    assert not set(results[0].paths) & set(results[1].paths)
    again = stage(url, tmp_path / "dst")
    assert again.downloaded_bytes == 0 and again.skipped_files == len(TREE)
    (src / "part-001.tfrecord").write_bytes(b"changed")            # a changed source is fetched again
    os.utime(src / "part-001.tfrecord", ns=(1, 1))
    changed = stage(url, tmp_path / "dst")
    assert changed.downloaded_files == 1 and (tmp_path / "dst" / "part-001.tfrecord").read_bytes() == b"changed"
    with pytest.raises(StorageError, match=r"has no files .*check the URL or path"):
        stage(str(tmp_path / "nowhere"), tmp_path / "dst2")


# ---------------------------------------------------------------- progress display, CLI


def test_progress_bar_goes_to_stderr(s3, tmp_path, capsys):
    s3_stage(s3, tmp_path, progress=True)
    out, err = capsys.readouterr()
    assert out == ""
    assert "stage 0/1" in err and "100%" in err


def test_command_line(s3, tmp_path):
    env = dict(os.environ, **s3.env())
    ok = subprocess.run([sys.executable, "-m", "tfnb", "stage", f"s3://{BUCKET}/{PREFIX}", str(tmp_path),
                         "--index", "1", "--count", "2", "--chunk-size", str(MiB)],
                        capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"shard 1/2 of s3://{BUCKET}/{PREFIX}: ") and "MB/s" in ok.stdout
    assert ok.stderr == ""                                           # no bar: not a terminal
    bad = subprocess.run([sys.executable, "-m", "tfnb", "stage", f"s3://{BUCKET}/nothing", str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1
    assert bad.stderr.startswith("tfnb stage: s3://tfnb-data/nothing has no files")


# ---------------------------------------------------------------- inside tfnb.run


def stage_my_shard(ctx, url, dest_root, marker_dir):
    """train_fn: each worker stages its shard and writes what it got; the chief returns its result."""
    from tfnb.data.staging import stage as stage_

    r = stage_(url, os.path.join(dest_root, f"worker{ctx.task_index}"), index=ctx.task_index,
               count=ctx.num_workers, chunk_size=1 << 20)
    rels = sorted(os.path.relpath(p, r.dest) for p in r.paths)
    with open(os.path.join(marker_dir, f"{ctx.task_index}.json"), "w") as f:
        json.dump({"index": r.index, "count": r.count, "rels": rels, "pid": os.getpid()}, f)
    return r


def test_each_worker_stages_its_shard_inside_run(spark, s3, tmp_path, no_orphans):
    import tfnb

    env = {k: v for k, v in s3.env().items() if k != "AWS_ENDPOINT_URL"}
    env["TFNB_S3_ENDPOINT_URL"] = s3.endpoint_url
    (tmp_path / "markers").mkdir()
    chief = tfnb.run(stage_my_shard, num_workers=2, spark=spark, env=env, display=False,
                     args=(f"s3://{BUCKET}/{PREFIX}", str(tmp_path / "local"), str(tmp_path / "markers")))
    assert isinstance(chief, StageResult) and (chief.index, chief.count) == (0, 2)
    markers = [json.loads((tmp_path / "markers" / f"{i}.json").read_text()) for i in range(2)]
    assert [m["index"] for m in markers] == [0, 1] and markers[0]["pid"] != markers[1]["pid"]
    shards = [set(m["rels"]) for m in markers]
    assert not shards[0] & shards[1] and shards[0] | shards[1] == set(TREE)
    for i, names in enumerate(shards):
        assert read_tree(tmp_path / "local" / f"worker{i}") == {k: TREE[k] for k in names}
    assert chief.files == len(shards[0])
