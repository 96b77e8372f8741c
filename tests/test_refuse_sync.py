"""Refusals of ``tfnb.EventSync``: arguments, locations, storage options, unreachable endpoints (no Spark)."""
from __future__ import annotations

import tfnb
from tfnb import ConfigError, StorageError

from refusals import Refusals, case


@case("sync", "`EventSync(..., interval=0)`", ConfigError, "interval=0", "interval=10",
      says="seconds > 0, e.g. interval=10")
def sync_interval_zero(env):
    tfnb.EventSync(str(env.tmp / "a"), str(env.tmp / "b"), interval=0)


@case("sync", "`EventSync(None, ...)`", ConfigError, "src=None", "'/tmp/tb/run1'", says="a directory path or URL")
def sync_src_none(env):
    tfnb.EventSync(None, str(env.tmp / "b"))


@case("sync", "`dest='nosuch://b/x'` (unknown scheme)", ConfigError, "'nosuch://b/x'", "install the fsspec backend",
      says="install the fsspec backend, or use a local path / s3://")
def sync_unknown_scheme(env):
    tfnb.EventSync(str(env.tmp / "a"), "nosuch://b/x")


@case("sync", "`TFNB_SYNC_INTERVAL=often`", ConfigError, "TFNB_SYNC_INTERVAL='often'", "fix or unset",
      says="fix or unset the variable")
def sync_interval_env(env):
    env.setenv("TFNB_SYNC_INTERVAL", "often")
    tfnb.EventSync(str(env.tmp / "a"), str(env.tmp / "b"))


@case("sync", "`mode='rsync'`", ConfigError, "mode='rsync'", "auto", says="one of auto, append, parts")
def sync_bad_mode(env):
    tfnb.EventSync(str(env.tmp / "a"), str(env.tmp / "b"), mode="rsync")


@case("sync", "`dest` inside `src`", ConfigError, "overlap", "outside the source",
      says="sync into a directory outside the source")
def sync_overlap(env):
    tfnb.EventSync(str(env.tmp / "logs"), str(env.tmp / "logs" / "copy"))


@case("sync", "`mode='append'` to S3", ConfigError, "mode='append'", "mode='parts'",
      says="mode='parts' (or 'auto') for object stores")
def sync_append_to_s3(env):
    tfnb.EventSync(str(env.tmp / "logs"), "s3://bucket/logs", mode="append",
                   storage_options={"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1",
                                    "aws_access_key_id": "k", "aws_secret_access_key": "s"})


@case("sync", "unknown S3 `storage_options` key", ConfigError, "'endpoint'", "endpoint_url",
      says="use endpoint_url, region_name, aws_* keys or client_kwargs")
def sync_s3_unknown_option(env):
    tfnb.EventSync(str(env.tmp / "logs"), "s3://bucket/logs", storage_options={"endpoint": "http://127.0.0.1:9"})


@case("sync", "`flush()` to an S3 endpoint that refuses connections", StorageError, "s3://bucket/logs",
      "endpoint_url", says="check both locations and the store's storage_options")
def sync_endpoint_unreachable(env):
    (env.tmp / "logs").mkdir()
    (env.tmp / "logs" / "events.out.tfevents.1").write_bytes(b"x" * 100)
    sync = tfnb.EventSync(str(env.tmp / "logs"), "s3://bucket/logs",
                          storage_options={"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1",
                                           "aws_access_key_id": "k", "aws_secret_access_key": "s"})
    yield
    sync.flush()


class TestRefusals(Refusals):
    """The cases above."""
