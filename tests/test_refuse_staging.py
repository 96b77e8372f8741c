"""Refusals of ``tfnb.stage``: arguments, URLs, missing sources, unreachable endpoints (no Spark)."""
from __future__ import annotations

import tfnb
from tfnb import ConfigError, StorageError

from refusals import Refusals, case, table


def _stage(env, src: str | None = ".", dest: str | None = "out", index=0, count=1, **options):
    """tfnb.stage(src, dest, index=, count=, **options), a relative ``src`` or ``dest`` taken in the case's
    scratch folder."""
    def at(path):
        return str(env.tmp / path) if path and "://" not in path else path

    tfnb.stage(at(src), at(dest), index=index, count=count, **options)


table("staging", ConfigError, _stage, [
    ("stage_count_zero", dict(count=0),
     "`tfnb.stage(..., count=0)`", ("count=0", "count=ctx.num_workers"), "count=ctx.num_workers (or 1 for everything)"),
    ("stage_index_out_of_range", dict(index=2, count=2),
     "`index=2, count=2`", ("index=2", "index=ctx.task_index"), "index=ctx.task_index, count=ctx.num_workers"),
    ("stage_empty_url", dict(src=""),
     "`src=''`", ("src=''", "'s3://bucket/prefix'"), "a URL or path, e.g. 's3://bucket/prefix'"),
    ("stage_dest_none", dict(dest=None), "`dest=None`", ("dest=None", "'/local_disk0/train'"), "a local folder path"),
    ("stage_concurrency_zero", dict(concurrency=0),
     "`concurrency=0`", ("concurrency=0", "e.g. 16"), "an int >= 1, e.g. 16"),
    ("stage_chunk_too_small", dict(chunk_size=1000),
     "`chunk_size=1000`", ("chunk_size=1000", "at least 1 MiB"), "at least 1 MiB, e.g. 8388608"),
    ("stage_s3_no_bucket", dict(src="s3:///train", endpoint_url="http://127.0.0.1:9"),
     "`s3:///train` (no bucket)", ("s3:///train", "s3://BUCKET/"), "write s3://BUCKET/PREFIX"),
    ("stage_unknown_scheme", dict(src="nosuch://bucket/x"),
     "`nosuch://bucket/x` (unknown scheme)", ("'nosuch'", "install the fsspec backend"),
     "use s3://, file://, a local path, or install the fsspec backend"),
])


@case("staging", "a source folder with no files", StorageError, "empty-src", "check the URL or path",
      says="check the path or URL (the message names it)")
def stage_empty_source(env):
    (env.tmp / "empty-src").mkdir()
    _stage(env, src="empty-src")


@case("staging", "a source folder that does not exist", StorageError, "no-such-src", "check the URL or path",
      says="check the path or URL (the message names it)")
def stage_missing_source(env):
    _stage(env, src="no-such-src")


@case("staging", "`dest` that is a file", StorageError, "not-a-dir", "pick a writable local folder",
      says="pick a writable local folder")
def stage_dest_is_file(env):
    (env.tmp / "src").mkdir()
    (env.tmp / "src" / "a.bin").write_bytes(b"x" * 10)
    (env.tmp / "not-a-dir").write_text("")
    _stage(env, src="src", dest="not-a-dir/sub")


@case("staging", "an S3 endpoint that refuses connections", StorageError, "http://127.0.0.1:9",
      "check endpoint_url", says="check endpoint_url and that the server is reachable")
def stage_endpoint_unreachable(env):
    env.setenv("AWS_ACCESS_KEY_ID", "k")  # credentials are there; the server is not
    env.setenv("AWS_SECRET_ACCESS_KEY", "s")
    _stage(env, src="s3://bucket/train", endpoint_url="http://127.0.0.1:9")


class TestRefusals(Refusals):
    """The cases above."""
