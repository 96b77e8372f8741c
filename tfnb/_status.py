"""The run status file tfnb keeps in ``model_dir`` so other processes (the evaluator) know when training ended."""
from __future__ import annotations

import json
import time
from typing import Any, Mapping

from ._storage import Store, open_store

STATUS_FILE = "tfnb_status.json"
FINAL_STATES = ("succeeded", "failed", "cancelled")


def _store(model_dir: str | Store, options: Mapping[str, Any] | None, purpose: str) -> Store:
    return model_dir if isinstance(model_dir, Store) else open_store(model_dir, options, purpose=purpose)


def write_status(model_dir: str | Store, state: str, options: Mapping[str, Any] | None = None, **info: Any) -> None:
    """Write ``{"state": state, ...}`` atomically: a reader sees the previous status or this one."""
    body = json.dumps({"state": state, "time": time.time(), **info}, default=str).encode()
    _store(model_dir, options, "writing the run status to").write(STATUS_FILE, body)


def read_status(model_dir: str | Store, options: Mapping[str, Any] | None = None) -> dict | None:
    """The last status written to ``model_dir``, or None when there is none (yet).

    Raises:
        StorageError: the file exists (or may) but cannot be read: credentials, bucket, endpoint.
    """
    try:
        return json.loads(_store(model_dir, options, "reading the run status in").read(STATUS_FILE))
    except (FileNotFoundError, ValueError):
        return None


def is_finished(model_dir: str | Store, options: Mapping[str, Any] | None = None) -> bool:
    """True once the run that writes to ``model_dir`` has ended (succeeded, failed or cancelled)."""
    status = read_status(model_dir, options)
    return bool(status) and status.get("state") in FINAL_STATES
