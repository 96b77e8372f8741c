"""Where a task writes its part of the fed data (``/dev/shm`` when the host has room, else Spark's local disk),
and :class:`ArrowSpill`, the Arrow IPC file a reader may follow while it grows (tfnb's feed and tfnb.compat's)."""
from __future__ import annotations

import contextlib
import errno
import glob
import os
import shutil
import tempfile

from ..errors import ConfigError

_MAGIC_BYTES = 8  # "ARROW1" and padding before the first message of an Arrow IPC file


class ArrowSpill:
    """An Arrow IPC file written batch by batch; ``end`` is the offset past the last whole batch, up to which a
    reader may parse messages. A full disk raises ConfigError saying how to make room."""

    def __init__(self, path: str, empty_schema):
        self.path = path
        self._empty_schema = empty_schema  # the file's schema when no batch comes
        self._sink = self._writer = None
        self.rows = self.end = 0

    def _open(self, schema) -> None:
        import pyarrow as pa

        self._sink = pa.OSFile(self.path, "wb")
        self._writer = pa.ipc.new_file(self._sink, schema)

    def write(self, batch) -> None:
        with self._room():
            if self._writer is None:
                self._open(batch.schema)
            self._writer.write_batch(batch)
        self.rows += batch.num_rows
        self.end = self._sink.tell()

    def close(self) -> int:
        """Write the footer; returns the file's size."""
        with self._room():
            if self._writer is None:
                self._open(self._empty_schema)
            try:
                self._writer.close()
            finally:
                self._sink.close()
        return os.path.getsize(self.path)

    @contextlib.contextmanager
    def _room(self):
        try:
            yield
        except OSError as e:
            if e.errno != errno.ENOSPC and "No space left" not in str(e):
                raise
            where = os.path.dirname(self.path)
            raise ConfigError(
                f"no space left on {where} while writing this worker's part of the data ({_gb(self.end)} "
                "written); " + ("set TFNB_SPILL_MEMORY=0 to write it to Spark's local disk instead"
                                if where.startswith(_SHM) else "point Spark's local dirs (spark.local.dir / "
                                "SPARK_LOCAL_DIRS) at a larger disk, or spread the workers over more hosts")) from e


_SHM = "/dev/shm"


def _mem_available() -> int:
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def spill_dir(nbytes: int | None, memory_share: float, workdir: str, num_workers: int, tasks_here: int) -> str:
    """``/dev/shm`` when this host's expected spill (its share of the cached DataFrame, plus a quarter) fits in
    ``memory_share`` of its free memory and tmpfs, else ``workdir`` (ConfigError when its disk has too little)."""
    expected = None if not nbytes else nbytes * tasks_here // max(1, num_workers)
    if expected and memory_share > 0 and os.path.isdir(_SHM):
        room = min(shutil.disk_usage(_SHM).free, _mem_available()) * memory_share
        if expected * 5 // 4 <= room:
            _sweep_shm()
            return tempfile.mkdtemp(prefix=f"tfnb-feed-{os.getuid()}-{os.getpid()}-", dir=_SHM)
    if expected and (free := shutil.disk_usage(workdir).free) < expected:
        raise ConfigError(
            f"data= needs about {_gb(expected)} of local disk on this host for its {tasks_here} worker(s) but "
            f"{workdir} has {_gb(free)} free; point spark.local.dir / SPARK_LOCAL_DIRS at a larger "
            "disk\nEach worker keeps its part of the fed DataFrame in Spark's local dirs (what does not fit in "
            "memory); point them at a larger disk, or spread the workers over more hosts.")
    return workdir


def _gb(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _sweep_shm() -> None:
    """Remove memory-backed spills of tasks that died before their clean-up (their pid is gone)."""
    for path in glob.glob(os.path.join(_SHM, f"tfnb-feed-{os.getuid()}-*-*")):
        try:
            os.kill(int(os.path.basename(path).split("-")[3]), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (ValueError, IndexError, PermissionError):
            pass
