"""``%load_ext tfnb`` adds ``%tfnb_tensorboard --logdir DIR``, the panel of ``tfnb.tensorboard(DIR)``. It leaves
TensorBoard's own ``%tensorboard`` alone, so there is never a question of which one runs."""
from __future__ import annotations

import argparse
import shlex

from ..errors import ConfigError

MAGIC_NAME = "tfnb_tensorboard"


class _Parser(argparse.ArgumentParser):
    # argparse would call sys.exit() on a bad line, which in a kernel only prints "SystemExit".
    def error(self, message):
        raise ConfigError(f"%{MAGIC_NAME}: {message}\n{self.format_usage().strip()}")


_PARSER = _Parser(prog=f"%{MAGIC_NAME}", add_help=False,
                  description="Show TensorBoard for a log_dir inline (see tfnb.tensorboard).")
_PARSER.add_argument("--logdir", "--log_dir", dest="log_dir", required=True, help="directory holding the event files")
for _flag, _type, _help in (("--port", int, "port (default: a free one)"), ("--host", str, "bind address (127.0.0.1)"),
                            ("--reload_interval", float, "seconds between log_dir scans"),
                            ("--timeout", float, "seconds to wait for TensorBoard to start"),
                            ("--height", int, "iframe height in pixels")):
    _PARSER.add_argument(_flag, type=_type, help=_help)


def tfnb_tensorboard_magic(line: str):
    """``%tfnb_tensorboard --logdir DIR [--port N] [--host H] [--reload_interval S] [--timeout S] [--height PX]``;
    ConfigError when the line does not parse."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError as e:
        raise ConfigError(f"%{MAGIC_NAME}: cannot parse {line!r}: {e}; quote paths with spaces") from e
    from .tensorboard import tensorboard

    tensorboard(**vars(_PARSER.parse_args(words)))  # returns nothing: a value would show as Out[n] under the panel


def load_ipython_extension(ipython) -> None:
    """Register ``%tfnb_tensorboard`` (called by ``%load_ext tfnb``)."""
    ipython.register_magic_function(tfnb_tensorboard_magic, magic_kind="line", magic_name=MAGIC_NAME)


__all__ = ["load_ipython_extension", "tfnb_tensorboard_magic", "MAGIC_NAME"]
