"""Refusals of ``tfnb.tensorboard``: ``Failed`` outcomes and ConfigErrors; no process is started."""
from __future__ import annotations

import tfnb
from tfnb import ConfigError
from tfnb.monitor.tensorboard import Failed

from refusals import Refusals, case


@case("tensorboard", "`tfnb.tensorboard(log_dir=<missing dir>)`", Failed, "does not exist", "os.makedirs",
      says="returns Failed: check the path, or create the directory first")
def tensorboard_missing_logdir(env):
    return tfnb.tensorboard(str(env.tmp / "nope"), display=False)


@case("tensorboard", "`log_dir` that is a file", Failed, "is a file", "pass the directory",
      says="returns Failed: pass the directory holding the event files")
def tensorboard_logdir_is_file(env):
    (env.tmp / "events").write_text("")
    return tfnb.tensorboard(str(env.tmp / "events"), display=False)


@case("tensorboard", "`log_dir=''`", ConfigError, "log_dir is empty", "tfnb.tensorboard('/tmp/run1/logs')",
      says="pass the event-file directory")
def tensorboard_empty_logdir(env):
    tfnb.tensorboard("", display=False)


@case("tensorboard", "`log_dir=42`", ConfigError, "log_dir=42", "tfnb.tensorboard('/tmp/run1/logs')",
      says="pass the event-file directory")
def tensorboard_logdir_not_path(env):
    tfnb.tensorboard(42, display=False)


@case("tensorboard", "`port=70000`", ConfigError, "port=70000", "port=None", says="0-65535, or port=None")
def tensorboard_bad_port(env):
    tfnb.tensorboard(str(env.tmp), port=70000, display=False)


@case("tensorboard", "`host=''`", ConfigError, "host=''", "'127.0.0.1'", says="'127.0.0.1' (default) or '0.0.0.0'")
def tensorboard_bad_host(env):
    tfnb.tensorboard(str(env.tmp), host="", display=False)


@case("tensorboard", "`reload_interval=0`", ConfigError, "reload_interval=0", "positive number of seconds",
      says="a positive number of seconds")
def tensorboard_reload_interval(env):
    tfnb.tensorboard(str(env.tmp), reload_interval=0, display=False)


@case("tensorboard", "`height=10`", ConfigError, "height=10", ">= 100", says="pixels >= 100")
def tensorboard_height(env):
    tfnb.tensorboard(str(env.tmp), height=10, display=False)


@case("tensorboard", "`timeout=-1`", ConfigError, "timeout=-1", "positive number of seconds",
      says="a positive number of seconds")
def tensorboard_timeout(env):
    tfnb.tensorboard(str(env.tmp), timeout=-1, display=False)


@case("tensorboard", "`TFNB_TENSORBOARD_TIMEOUT=later`", ConfigError, "TFNB_TENSORBOARD_TIMEOUT='later'",
      "fix or unset", says="fix or unset the variable")
def tensorboard_timeout_env(env):
    env.setenv("TFNB_TENSORBOARD_TIMEOUT", "later")
    tfnb.tensorboard(str(env.tmp), display=False)


class TestRefusals(Refusals):
    """The cases above."""
