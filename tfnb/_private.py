"""Per-user private folders for the state tfnb keeps on a machine (TensorBoard bookkeeping, model cache).

Names under ``/tmp`` are predictable and another user could plant files tfnb would trust, so each folder is created
0700 and checked on each use: a directory owned by this user, writable by no one else.
"""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile

from .errors import UnsafePathError


def check_private(path: str, setting: str = "TFNB_STATE_DIR") -> str:
    """UnsafePathError (naming ``setting``, which moves it) unless ``path`` is this user's private directory."""
    st = os.lstat(path)
    problem = None
    if not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory (a symlink or a file)"
    elif st.st_uid != os.getuid():
        problem = f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    elif st.st_mode & 0o022:
        problem = f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    if problem:
        raise UnsafePathError(
            f"{path} {problem}, so tfnb will not trust what is in it; remove it (another user may have "
            f"created it) or point tfnb elsewhere ({setting})")
    return path


def state_dir() -> str:
    """Where private folders go unless told otherwise: ``TFNB_STATE_DIR``, else the system temporary folder."""
    return os.environ.get("TFNB_STATE_DIR") or tempfile.gettempdir()


def private_dir(name: str, base: str | None = None, setting: str = "TFNB_STATE_DIR") -> str:
    """``<base or state_dir()>/tfnb-<name>-<uid>``, created 0700 if missing, checked (:func:`check_private`)."""
    path = os.path.join(base or state_dir(), f"tfnb-{name}-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.makedirs(path, mode=0o700)
    return check_private(path, setting)
