"""Local paths, including the ``/dbfs`` and ``/Volumes`` FUSE mounts (which cannot append in place)."""
from __future__ import annotations

import contextlib
import os
import shutil

from .base import Store, guarded, temp_name
from .fs import FsspecStore

_NOT_APPENDABLE = ("/dbfs/", "/Volumes/")   # FUSE mounts that cannot append in place


class LocalStore(FsspecStore):
    """Local files through fsspec's LocalFileSystem; paths are what TensorFlow and ``open`` take."""

    local = True

    def __init__(self, root: str):
        from fsspec.implementations.local import LocalFileSystem

        self.fs, self.path, self.root = LocalFileSystem(), root, root
        self._atomic_put = False     # write to a temporary name, then rename
        self.appendable = not (root.rstrip("/") + "/").startswith(_NOT_APPENDABLE)

    def url(self, rel: str = "") -> str:
        return os.path.join(self.root, *rel.split("/")) if rel else self.root

    @guarded("appending to")
    def append(self, rel: str, data: bytes = b"") -> None:
        if not self.appendable:
            return Store.append(self, rel, data)
        with open(self.url(rel), "ab") as f:
            f.write(data)

    @guarded("uploading to")
    def put_dir(self, rel: str, local_dir: str = "") -> None:
        # a copy beside the target, then two renames: readers see the old tree or the new one
        final = self.url(rel)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        new = temp_name(final)
        shutil.copytree(local_dir, new)
        old = temp_name(final)
        with contextlib.suppress(FileNotFoundError):
            os.replace(final, old)
        os.replace(new, final)
        shutil.rmtree(old, ignore_errors=True)
