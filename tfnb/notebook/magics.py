"""IPython magics: ``%load_ext tfnb`` (or ``%load_ext tfnb.notebook``) adds ``%tfnb_tensorboard``.

``%tfnb_tensorboard --logdir DIR`` shows the same panel as ``tfnb.tensorboard(DIR)``.

TensorBoard's own magic is left alone: ``%load_ext tensorboard`` then ``%tensorboard --logdir DIR``
works as before, whether it is loaded before or after tfnb. tfnb does not register a
``%tensorboard`` of its own, so there is never a question of which one runs. (TensorBoard's
magic keeps its own instance list and does not see or reuse tfnb's instances, nor the reverse.)
"""
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
_PARSER.add_argument("--port", type=int, help="port (default: a free one)")
_PARSER.add_argument("--host", help="bind address (default 127.0.0.1)")
_PARSER.add_argument("--reload_interval", type=float, help="seconds between log_dir scans")
_PARSER.add_argument("--timeout", type=float, help="seconds to wait for TensorBoard to start")
_PARSER.add_argument("--height", type=int, help="iframe height in pixels")


def tfnb_tensorboard_magic(line: str):
    """``%tfnb_tensorboard --logdir DIR [--port N] [--host H] [--reload_interval S] [--timeout S] [--height PX]``.

    Raises:
        ConfigError: the line does not parse.

    Example:
        >>> %load_ext tfnb
        >>> %tfnb_tensorboard --logdir /tmp/run1/logs
    """
    try:
        words = shlex.split(line, comments=True)
    except ValueError as e:
        raise ConfigError(f"%{MAGIC_NAME}: cannot parse {line!r}: {e}; quote paths with spaces") from e
    args = _PARSER.parse_args(words)
    from .tensorboard import tensorboard

    tensorboard(**vars(args))
    # nothing returned: the panel (or URL) is already shown, and a value would show as Out[n]


def load_ipython_extension(ipython) -> None:
    """Register ``%tfnb_tensorboard`` (called by ``%load_ext tfnb``).

    Example:
        >>> %load_ext tfnb
    """
    ipython.register_magic_function(tfnb_tensorboard_magic, magic_kind="line", magic_name=MAGIC_NAME)


__all__ = ["load_ipython_extension", "tfnb_tensorboard_magic", "MAGIC_NAME"]
