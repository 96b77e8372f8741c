"""The run status file tfnb keeps in ``model_dir`` so other processes (the evaluator) know when training ended."""
from __future__ import annotations

import json
import time
from typing import Any

STATUS_FILE = "tfnb_status.json"
FINAL_STATES = ("succeeded", "failed", "cancelled")


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def write_status(model_dir: str, state: str, **info: Any) -> None:
    """Write ``{"state": state, ...}`` atomically where the filesystem allows (local: rename)."""
    import fsspec

    from fsspec.implementations.local import LocalFileSystem

    fs, path = fsspec.core.url_to_fs(_join(model_dir, STATUS_FILE))
    fs.makedirs(fs._parent(path), exist_ok=True)
    body = json.dumps({"state": state, "time": time.time(), **info}, default=str)
    if isinstance(fs, LocalFileSystem):
        # a reader never sees a half-written file
        tmp = path + ".tmp"
        with fs.open(tmp, "w") as f:
            f.write(body)
        fs.mv(tmp, path)
    else:
        with fs.open(path, "w") as f:
            f.write(body)


def read_status(model_dir: str) -> dict | None:
    """The last status written to ``model_dir``, or None when there is none (yet)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(_join(model_dir, STATUS_FILE))
    try:
        with fs.open(path, "r") as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def is_finished(model_dir: str) -> bool:
    """True once the run that writes to ``model_dir`` has ended (succeeded, failed or cancelled)."""
    status = read_status(model_dir)
    return bool(status) and status.get("state") in FINAL_STATES
