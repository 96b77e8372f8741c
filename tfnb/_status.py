"""The run status file tfnb keeps in ``model_dir`` so other processes (the evaluator) know when training ended."""
from __future__ import annotations

import json
import time
from typing import Any, Mapping

from .storage import Store, open_store

STATUS_FILE = "tfnb_status.json"
FINAL_STATES = ("succeeded", "failed", "cancelled")


def write_status(model_dir: str, state: str, *, storage_options: Mapping[str, Any] | None = None, **info: Any) -> None:
    """Write ``{"state": state, ...}`` atomically: a reader sees the previous status or this one."""
    body = json.dumps({"state": state, "time": time.time(), **info}, default=str).encode()
    open_store(model_dir, storage_options, purpose="writing the run status to").write(STATUS_FILE, body)


def read_status(model_dir: str | Store) -> dict | None:
    """The last status written to ``model_dir``, or None when there is none (yet); StorageError when it cannot be
    read (credentials, bucket, endpoint, permission)."""
    store = model_dir if isinstance(model_dir, Store) else open_store(model_dir, purpose="reading the run status in")
    try:
        return json.loads(store.read(STATUS_FILE))
    except (FileNotFoundError, ValueError):
        return None
