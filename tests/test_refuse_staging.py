"""Refusals of ``tfnb.stage``: arguments, URLs, missing sources, unreachable endpoints (no Spark)."""
from __future__ import annotations

import tfnb
from tfnb import ConfigError, StorageError

from refusals import Refusals, case


@case("staging", "`tfnb.stage(..., count=0)`", ConfigError, "count=0", "count=ctx.num_workers",
      says="count=ctx.num_workers (or 1 for everything)")
def stage_count_zero(env):
    tfnb.stage(str(env.tmp), str(env.tmp / "out"), index=0, count=0)


@case("staging", "`index=2, count=2`", ConfigError, "index=2", "index=ctx.task_index",
      says="index=ctx.task_index, count=ctx.num_workers")
def stage_index_out_of_range(env):
    tfnb.stage(str(env.tmp), str(env.tmp / "out"), index=2, count=2)


@case("staging", "`src=''`", ConfigError, "src=''", "'s3://bucket/prefix'",
      says="a URL or path, e.g. 's3://bucket/prefix'")
def stage_empty_url(env):
    tfnb.stage("", str(env.tmp / "out"), index=0, count=1)


@case("staging", "`dest=None`", ConfigError, "dest=None", "'/local_disk0/train'",
      says="a local folder path")
def stage_dest_none(env):
    tfnb.stage(str(env.tmp), None, index=0, count=1)


@case("staging", "`concurrency=0`", ConfigError, "concurrency=0", "e.g. 16", says="an int >= 1, e.g. 16")
def stage_concurrency_zero(env):
    tfnb.stage(str(env.tmp), str(env.tmp / "out"), index=0, count=1, concurrency=0)


@case("staging", "`chunk_size=1000`", ConfigError, "chunk_size=1000", "at least 1 MiB",
      says="at least 1 MiB, e.g. 8388608")
def stage_chunk_too_small(env):
    tfnb.stage(str(env.tmp), str(env.tmp / "out"), index=0, count=1, chunk_size=1000)


@case("staging", "`s3:///train` (no bucket)", ConfigError, "s3:///train", "s3://BUCKET/",
      says="write s3://BUCKET/PREFIX")
def stage_s3_no_bucket(env):
    tfnb.stage("s3:///train", str(env.tmp / "out"), index=0, count=1, endpoint_url="http://127.0.0.1:9")


@case("staging", "`nosuch://bucket/x` (unknown scheme)", ConfigError, "'nosuch'", "install the fsspec backend",
      says="use s3://, file://, a local path, or install the fsspec backend")
def stage_unknown_scheme(env):
    tfnb.stage("nosuch://bucket/x", str(env.tmp / "out"), index=0, count=1)


@case("staging", "a source folder with no files", StorageError, "empty-src", "check the URL or path",
      says="check the path or URL (the message names it)")
def stage_empty_source(env):
    (env.tmp / "empty-src").mkdir()
    tfnb.stage(str(env.tmp / "empty-src"), str(env.tmp / "out"), index=0, count=1)


@case("staging", "a source folder that does not exist", StorageError, "no-such-src", "check the URL or path",
      says="check the path or URL (the message names it)")
def stage_missing_source(env):
    tfnb.stage(str(env.tmp / "no-such-src"), str(env.tmp / "out"), index=0, count=1)


@case("staging", "`dest` that is a file", StorageError, "not-a-dir", "pick a writable local folder",
      says="pick a writable local folder")
def stage_dest_is_file(env):
    (env.tmp / "src").mkdir()
    (env.tmp / "src" / "a.bin").write_bytes(b"x" * 10)
    (env.tmp / "not-a-dir").write_text("")
    tfnb.stage(str(env.tmp / "src"), str(env.tmp / "not-a-dir" / "sub"), index=0, count=1)


@case("staging", "an S3 endpoint that refuses connections", StorageError, "http://127.0.0.1:9",
      "check endpoint_url", says="check endpoint_url and that the server is reachable")
def stage_endpoint_unreachable(env):
    env.setenv("AWS_ACCESS_KEY_ID", "k")  # credentials are there; the server is not
    env.setenv("AWS_SECRET_ACCESS_KEY", "s")
    tfnb.stage("s3://bucket/train", str(env.tmp / "out"), index=0, count=1, endpoint_url="http://127.0.0.1:9")


class TestRefusals(Refusals):
    """The cases above."""
