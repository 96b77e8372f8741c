"""Local paths, including the ``/dbfs`` and ``/Volumes`` FUSE mounts (which cannot append in place)."""
from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from typing import Iterator

from ..errors import StorageError
from . import PART, Entry, Store, appendable, guarded, is_temp, os_error

_BLOCK = 1 << 20


def temp_name(path: str, named: bool = False) -> str:
    """A hidden temporary name beside ``path``: ``.NAME.tfnb-part-X`` when ``named`` (so the owner of
    ``NAME`` can find its leftovers), else ``.tfnb-part-X`` (no part of the name: an event file's
    temporary copy must not look like an event file to TensorBoard)."""
    head, name = os.path.split(path)
    return os.path.join(head, f".{name if named else ''}{PART}-{uuid.uuid4().hex[:12]}")


def atomic_write(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that readers see the old content or all of the new."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """An exclusive lock on ``path`` across processes (a no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # Windows: one process per folder is assumed
        yield
        return
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def _entry(rel: str, st: os.stat_result) -> Entry:
    return Entry(rel, st.st_size, st.st_mtime, f"mtime_ns={st.st_mtime_ns}")


class LocalStore(Store):
    local = True

    def __init__(self, root: str, purpose: str):
        self.root = root
        self.appendable = appendable(root)

    def url(self, rel: str = "") -> str:
        return os.path.join(self.root, *rel.split("/")) if rel else self.root

    def error(self, e: BaseException, url: str, doing: str) -> StorageError:
        return os_error(e, url, doing)

    @guarded("listing")
    def list(self, rel: str = "", recursive: bool = True) -> dict[str, Entry]:
        base = self.url(rel)
        out: dict[str, Entry] = {}
        for dirpath, dirnames, filenames in os.walk(base):
            if not recursive:
                dirnames.clear()
            dirnames[:] = [d for d in dirnames if not is_temp(d)]
            for name in filenames:
                if is_temp(name):
                    continue
                full = os.path.join(dirpath, name)
                try:
                    st = os.stat(full)
                except FileNotFoundError:  # deleted between listing and stat
                    continue
                sub = os.path.relpath(full, base).replace(os.sep, "/")
                out[sub] = _entry(sub, st)
        return out

    @guarded("reading")
    def stat(self, rel: str = "") -> Entry | None:
        try:
            st = os.stat(self.url(rel))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return _entry(rel, st) if os.path.isfile(self.url(rel)) else None

    @guarded("reading")
    def read(self, rel: str = "", offset: int = 0, length: int | None = None) -> bytes:
        with open(self.url(rel), "rb") as f:
            f.seek(offset)
            return f.read() if length is None else f.read(length)

    @guarded("downloading")
    def get(self, rel, local_path, *, size=None, version=None, on_bytes=None, cancel=None) -> None:
        src = self.url(rel)
        if version is not None and _entry(rel, os.stat(src)).version != version:
            raise StorageError(f"{src} changed since it was listed; run again")
        os.makedirs(os.path.dirname(local_path) or ".", exist_ok=True)
        tmp = temp_name(local_path, named=True)
        try:
            with open(src, "rb") as fin, open(tmp, "wb") as fout:
                for block in iter(lambda: fin.read(_BLOCK), b""):
                    if cancel is not None and cancel.is_set():
                        raise StorageError(f"downloading {src} was cancelled")
                    fout.write(block)
                    if on_bytes:
                        on_bytes(len(block))
            got = os.path.getsize(tmp)
            if size is not None and got != size:
                raise StorageError(f"{src} has {got} bytes but was listed with {size}; it changed, run again")
            os.replace(tmp, local_path)
        except BaseException:
            _remove(tmp)
            raise

    @guarded("uploading to")
    def put(self, rel: str, local_path: str = "") -> None:
        dest = self.url(rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = temp_name(dest)
        try:
            shutil.copyfile(local_path, tmp)
            os.replace(tmp, dest)
        except BaseException:
            _remove(tmp)
            raise

    @guarded("writing")
    def write(self, rel: str, data: bytes = b"") -> None:
        atomic_write(self.url(rel), data)

    @guarded("appending to")
    def append(self, rel: str, data: bytes = b"") -> None:
        if not self.appendable:
            return Store.append(self, rel, data)
        with open(self.url(rel), "ab") as f:
            f.write(data)

    @guarded("deleting")
    def delete(self, rel: str = "") -> None:
        _remove(self.url(rel))

    @guarded("uploading to")
    def put_dir(self, rel: str, local_dir: str = "") -> None:
        # a copy beside the target, then two renames: readers see the old tree or the new one
        final = self.url(rel)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        new = temp_name(final)
        shutil.copytree(local_dir, new)
        if not os.path.exists(final):
            os.replace(new, final)
            return
        old = temp_name(final)
        os.replace(final, old)
        os.replace(new, final)
        shutil.rmtree(old, ignore_errors=True)
