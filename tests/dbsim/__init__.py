"""dbsim: a Databricks workspace and cluster, simulated on this machine, for running the notebooks of a
DBC archive the way a Databricks user does (import the archive, attach a cluster, Run All).

What it models (each checked by tests/test_dbsim.py):

* **The archive is the source.** Notebooks are read from the ``.dbc`` with ``tools.dbc.read``; ``%run
  ./X`` (or ``"./X"``) runs notebook X of the archive's folder, in the caller's namespace, nested runs
  relative to the target; ``%md``/``%md-sandbox`` commands are text. ``%run`` must be alone in its command.
* **A notebook's Python is a real IPython REPL** (``InteractiveShell``) of the runtime's Python, with
  ``spark``, ``sc``, ``dbutils``, ``display``, ``displayHTML``, ``sql``, ``table`` defined before the
  first command. ``%pip`` (first-line magic, or ``get_ipython().run_line_magic("pip", ...)``) runs the
  runtime's ``python -m pip`` into the notebook's environment, which the executors' Python workers also
  use; a ``%pip`` while a ``%run`` is in progress fails the command (no ``%pip`` inside ``%run`` targets).
  ``run(..., pip="cell")`` is a runtime that offers ``%pip`` only as the first line of a command of its own
  (a cell magic): code that calls the line magic gets IPython's ``UsageError``.
  A notebook's first ``%pip install`` that repeats one already run with this runtime (same arguments, local
  files of the same content; in this or an earlier test run while ``CLUSTERS`` lasts) is replayed from the
  first one's result, same files and output (``kernel._PipReplay``, kept in ``CLUSTERS/pip-replay``).
  ``%sh``, ``%sql`` and ``%python`` first-line magics work; ``%scala``, ``%r``, ``%fs`` are refused.
* **restartPython** (``dbutils.library.restartPython()``, ``%restart_python``) ends the command that called
  it, a ``%run`` in progress included; Run All goes on at the next top-level command in a new Python
  process: new namespace, ``spark``/``dbutils`` defined again, widget values kept.
* **Run All stops at the first command that raises**, reporting its number (``Cmd N``), first line and
  traceback; ``dbutils.notebook.exit(v)`` ends the run successfully.
* **Widgets**: ``text``/``dropdown``/``combobox``/``multiselect`` create a widget if absent (an existing
  one keeps its value), ``get`` of one never created raises (``InputWidgetNotDefined``), ``getAll``,
  ``remove``, ``removeAll``; job parameters (``params=``) are values from the start and win over defaults.
* **Files**: ``/Volumes/<catalog>/<schema>/<volume>`` folders (writable; beside them read-only), ``/dbfs``
  with ``/dbfs/tmp`` only for a runtime whose workspace has a DBFS root (runtime A), the notebook's working
  directory an empty ``/Workspace/Users/<user>/<folder>`` that is on ``sys.path``. ``dbutils.fs`` (ls,
  mkdirs, rm, put, head, cp, mv) maps ``dbfs:/x`` and ``/x`` to ``/dbfs/x``. The driver has a ``/tmp`` of
  its own and each executor another (workers are other machines: a driver-local file is not on them).
  All of it lives in private mount namespaces of the cluster: nothing appears on the machine, and
  everything goes with the cluster (:meth:`Cluster.host_path` finds a file while the cluster is up). The
  cluster's own folder is on memory-backed ``/dev/shm`` when it has room (``CLUSTERS``).
* **The cluster**: one driver JVM started from the runtime's Spark with ``local-cluster[2,1,1024]``
  (separate executor JVMs) that every notebook's Python attaches to, as notebooks share a Databricks
  cluster's driver; each Python process gets its own SparkSession on the shared SparkContext. Executors'
  Python workers run the notebook's environment (``sc.pythonExec`` is per notebook), so a library a
  notebook ``%pip``-installs reaches them, and nothing of this checkout is importable there.
* **Notebook-scoped libraries**: each Run All gets a virtualenv of its own over the runtime's, as on
  Databricks: it sees the runtime's packages, its ``%pip`` installs into its own site-packages (first on
  ``sys.path``) and cannot change the runtime (read-only in the cluster), and it is gone when Run All ends.
  So each notebook starts from the runtime as built, and one that forgets to install tfnb fails as it
  would on Databricks.
* **Nothing outlives its owner**: every process of a cluster is in its own PID namespace, whose init
  (``agent.py``) exits when the controller closes the cluster or dies, taking all of them along. When a
  notebook's Run All ends, what it left running (its REPL's children, background processes, the Spark
  Python workers of its environment) is killed; what was not an idle Spark worker is reported in
  :attr:`NotebookResult.leftovers`.
* **Notebooks at once**: ``run`` from several threads runs notebooks side by side on the cluster (each in its own
  Python and environment, as Databricks' REPLs are); a notebook's leftovers are told apart from the others'.
* **Users**: one workspace, several users: ``run(..., user=...)`` runs a notebook as that user (``select
  current_user()`` and the notebook context of ``dbutils.entry_point`` answer it, without an API token; the
  notebook's folder is under ``/Workspace/Users/<user>``), with the same
  volumes, DBFS root and driver for all, as colleagues sharing a workspace (and, here, a cluster) have.
* ``DATABRICKS_RUNTIME_VERSION`` is set; the environment is built from scratch (no ``PYTHONPATH``,
  ``SPARK_HOME``, ``TF_*`` of the test process), ``PATH`` starts with the runtime's ``bin``.

What it cannot show: Databricks' own Spark (the runtime's Spark is pip's pyspark here: see
``dbsim.runtimes``), Spark Connect / shared access mode, UI rendering of ``display`` and widgets,
``dbutils.notebook.run``, ``%run`` with arguments, ``%pip`` byte-compiling what it installs
(``PIP_NO_COMPILE``) and the time a ``%pip`` takes once its result is kept (it is replayed), cluster
libraries, GPUs, a REPL that lives on
after Run All (background threads and processes a notebook leaves are killed when its Run All ends, and
reported in ``leftovers``), credentials passthrough / Unity Catalog permissions beyond "writable inside a volume".

Needs root with CAP_SYS_ADMIN (``unshare --mount --pid``); :func:`need_simulator` skips (or fails, in CI)
a test otherwise, naming the fix.

Costs (2 vCPU, measured 2026-11-25; the machine was shared, loads 3-14, so ranges): building runtime A
97 s and B 82 s, cold, side by side (once; cached after). A cluster: start() 2-9 s (the driver JVM), then
its SparkContext with both executors 16-27 s in the background (``timings["spark"]``), which the first
notebook waits for. On a started cluster: a trivial notebook 0.7-2.7 s (its own virtualenv, a Python
process, IPython, attaching to the JVM); a notebook's first Spark job that runs Python on the executors
4.6-13 s (new Python workers for the notebook's environment); restartPython about 1 s plus the imports
the next command needs again; close() 0.4-1 s.

Example:
    >>> from dbsim import RUNTIME_A, Cluster, simulate
    >>> result = simulate(RUNTIME_A, "dbc/tfnb.dbc", "03_train", params={"EPOCHS": "2"})  # doctest: +SKIP
    >>> result.check()                      # AssertionError with the failing command and traceback  # doctest: +SKIP
    >>> with Cluster(RUNTIME_A) as cluster:                                              # doctest: +SKIP
    ...     ingest = cluster.run("dbc/tfnb.dbc", "01_data_ingest")
    ...     train = cluster.run("dbc/tfnb.dbc", "03_train")      # sees what 01 wrote under /Volumes
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .runtimes import CACHE, RUNTIME_A, RUNTIME_B, RUNTIMES, Runtime

__all__ = ["Runtime", "RUNTIME_A", "RUNTIME_B", "RUNTIMES", "Command", "Failure", "NotebookResult",
           "NotebookFailed", "ClusterError", "Cluster", "cluster", "simulate", "need_simulator"]

HERE = Path(__file__).resolve().parent
_LOG_TAIL = 200_000
# What of the test process's environment a notebook's processes get: the rest (PYTHONPATH, SPARK_HOME,
# PYSPARK_*, TF_*, CI...) is the test process's, not the runtime's.
_PASS_ENV = ("HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "SSL_CERT_FILE",
             "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy",
             "https_proxy", "no_proxy")
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ClusterError(RuntimeError):
    """The simulated cluster could not start or stop (namespace, JVM, executors)."""


class NotebookFailed(AssertionError):
    """Raised by :meth:`NotebookResult.check`: a command failed; the message is what the user would see."""


@dataclass(frozen=True)
class Command:
    """One top-level command that ran.

    Attributes:
        index: its number in the notebook, 1-based and counting markdown commands, as the Databricks UI
            numbers them ("Cmd 3").
        first_line: the command's first line.
        process: which Python process ran it: 1, then 2 after the first restartPython, ...
        status: ``"ok"``, ``"failed"``, ``"restart"`` (it called restartPython), ``"exit"``
            (dbutils.notebook.exit), ``"died"`` (the Python process died under it), ``"timeout"``.
        stdout, stderr: what the command printed (Python-level; a %pip's output included).
        html: what it passed to displayHTML.
        seconds: how long it ran.
        error: the traceback text when it failed.
    """

    index: int
    first_line: str
    process: int
    status: str
    stdout: str = ""
    stderr: str = ""
    html: tuple[str, ...] = ()
    seconds: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class Failure:
    """The command Run All stopped at: its number (``index``, as :class:`Command`), first line, process,
    the exception's type name and message, and the traceback as the notebook shows it."""

    index: int
    first_line: str
    process: int
    error_type: str
    message: str
    traceback: str

    def __str__(self) -> str:
        return (f"Cmd {self.index} ({self.first_line!r}, Python process {self.process}) failed with "
                f"{self.error_type}: {self.message}\n{self.traceback}")


@dataclass(frozen=True)
class NotebookResult:
    """What a Run All of one notebook showed.

    Attributes:
        notebook: the archive path (``"tfnb/03_train"``).
        runtime: the runtime's name (``"15.4 LTS ML"``).
        commands: the top-level commands that ran, in order (markdown commands are not listed).
        restarts: numbers of the commands that restarted Python.
        processes: how many Python processes ran its commands (1 + restarts, unless the last command restarted).
        failure: the command Run All stopped at, or None.
        exit_value: the value given to dbutils.notebook.exit, or None.
        widgets: widget values at the end (job parameters included).
        seconds: wall time of the whole Run All.
        leftovers: processes the notebook left running when Run All ended (other than Spark's idle Python
            workers), as ``"pid: command line"``; the simulator killed them.
        log: the tail of the notebook processes' stdout and stderr (JVM and TensorFlow noise included).
    """

    notebook: str
    runtime: str
    commands: tuple[Command, ...]
    restarts: tuple[int, ...]
    processes: int
    failure: Failure | None
    exit_value: str | None
    widgets: Mapping[str, str]
    seconds: float
    leftovers: tuple[str, ...] = ()
    log: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def stdout(self) -> str:
        """Everything the commands printed, in order."""
        return "".join(c.stdout for c in self.commands)

    def command(self, starting: str) -> Command:
        """The last command run whose first line starts with ``starting``.

        Raises:
            KeyError: no such command ran.
        """
        for cmd in reversed(self.commands):
            if cmd.first_line.startswith(starting):
                return cmd
        raise KeyError(f"no command starting {starting!r} ran in {self.notebook}; ran: "
                       f"{[c.first_line for c in self.commands]}")

    def check(self) -> NotebookResult:
        """This result, if Run All went through.

        Raises:
            NotebookFailed: with the failing command, its traceback and the log's tail.
        """
        if self.failure is not None:
            raise NotebookFailed(f"{self.notebook} on {self.runtime}: {self.failure}\n--- log tail ---\n"
                                 f"{self.log[-6000:]}")
        return self


def need_simulator() -> None:
    """Skip (or fail, in CI) the calling test unless this machine can run simulated clusters."""
    if str(HERE.parent) not in sys.path:
        sys.path.insert(0, str(HERE.parent))
    from components import need

    ok = os.geteuid() == 0 and shutil.which("unshare") and shutil.which("nsenter")
    if ok:
        res = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "true"],
                             capture_output=True)
        ok = res.returncode == 0
    need("root with CAP_SYS_ADMIN for private mount and PID namespaces (unshare --mount --pid)", bool(ok),
         "run the Databricks simulator tests as root on Linux (in a container: --cap-add SYS_ADMIN), with "
         "util-linux's unshare and nsenter")


# ---------------------------------------------------------------- processes


def _ns_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _in_namespace(ns: str) -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and _ns_of(int(d)) == ns and _alive(int(d))]


def _is_jvm(cmd: list[str]) -> bool:
    joined = " ".join(cmd)
    return "org.apache.spark.deploy.SparkSubmit" in joined or "CoarseGrainedExecutorBackend" in joined


def _is_spark_worker(cmd: list[str]) -> bool:
    return "pyspark.daemon" in cmd or "pyspark.worker" in cmd


def _kill(pids: Iterable[int], timeout: float = 10.0) -> list[int]:
    """SIGKILL ``pids``; the ones still alive after ``timeout``."""
    pids = list(pids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if _alive(p)]
    return left


def _clusters_dir() -> Path:
    """Where clusters keep their folders (machines' disks, notebook environments): ``TFNB_DBSIM_DIR``, else
    memory-backed ``/dev/shm`` when it has 8 GiB free, else the runtimes' cache folder. A notebook that
    %pip-installs TensorFlow writes gigabytes that are gone when it ends; on a disk that throttles writes
    (cloud VMs do, once ~0.5 GB is dirty) that alone took minutes."""
    if os.environ.get("TFNB_DBSIM_DIR"):
        return Path(os.environ["TFNB_DBSIM_DIR"])
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize >= 8 << 30:
            return Path("/dev/shm") / f"tfnb-dbsim-{os.getuid()}"
    except OSError:
        pass
    return CACHE


CLUSTERS = _clusters_dir()
PIP_REPLAY = CLUSTERS / "pip-replay"  # %pip results kept for replay (kernel._PipReplay): on the envs' file system


def _reap_stale() -> None:
    """Remove cluster folders of test processes that died without cleaning up (their namespaces died
    with them: the agent exits when its stdin closes)."""
    for stale in CLUSTERS.glob("cluster-*"):
        try:
            pid = int(stale.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if not Path(f"/proc/{pid}").exists():
            _remove(stale)


def _remove(path: Path) -> None:
    """rm -rf: several times faster than shutil.rmtree on a runtime's ~70,000 files."""
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def _tail(path: Path, limit: int = _LOG_TAIL) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


# ---------------------------------------------------------------- the cluster


class Cluster:
    """A simulated Databricks cluster of one runtime, with its workspace files and volumes.

    Args:
        runtime: a :class:`Runtime` or its key in ``RUNTIMES`` (``"A"``, ``"B"``).
        volumes: Unity Catalog volumes that exist, as ``"catalog.schema.volume"``.
        secrets: ``{scope: {key: value}}`` for ``dbutils.secrets.get``.
        user: the workspace user (the notebooks' folder is ``/Workspace/Users/<user>/<archive folder>``).
        executors, executor_cores, executor_memory_mb: the ``local-cluster[N,C,M]`` shape.
        spark_conf: extra Spark configuration for the driver JVM.
        start_timeout: seconds the JVM and its executors may take to come up.

    Use it as a context manager; everything (namespaces, JVMs, notebook environments, files) is gone after.
    ``run`` may be called from several threads at once: notebooks running side by side on one cluster, as its
    users' notebooks do. What a notebook leaves running is told apart by its environment (``DBSIM_RUN``, which
    its processes inherit) and its Python (the Spark workers of its environment).

    Example:
        >>> with Cluster(RUNTIME_A) as cluster:                          # doctest: +SKIP
        ...     first = cluster.run("dbc/tfnb.dbc", "01_data_ingest")
        ...     first.check()
        ...     cluster.host_path("/Volumes/main/default/tfnb")
    """

    def __init__(self, runtime: Runtime | str = RUNTIME_A, *,
                 volumes: Sequence[str] = ("main.default.tfnb", "main.default.libs"),
                 secrets: Mapping[str, Mapping[str, str]] | None = None, user: str = "sim-user@example.com",
                 executors: int = 2, executor_cores: int = 1, executor_memory_mb: int = 1024,
                 spark_conf: Mapping[str, str] | None = None, start_timeout: float = 300.0):
        self.runtime = RUNTIMES[runtime] if isinstance(runtime, str) else runtime
        for v in volumes:
            parts = v.split(".")
            if len(parts) != 3 or not all(p and "/" not in p for p in parts):
                raise ValueError(f"volume {v!r} is not catalog.schema.volume")
        self.volumes = tuple(volumes)
        self.secrets = {s: dict(kv) for s, kv in (secrets or {}).items()}
        self.user = user
        self.executors, self.executor_cores, self.executor_memory_mb = executors, executor_cores, executor_memory_mb
        self.spark_conf = dict(spark_conf or {})
        self.start_timeout = start_timeout
        self.home = Path(os.environ.get("HOME") or Path.home())
        self.dir: Path | None = None
        self._agent: subprocess.Popen | None = None
        self._jvm: subprocess.Popen | None = None
        self._boot: subprocess.Popen | None = None
        self._ns: str | None = None
        self._init_pid: int | None = None
        self._gateway: tuple[int, str] | None = None
        self._runs = 0
        self._active: set[str] = set()     # runs in progress (several at once: one thread each)
        self._runs_lock = threading.Lock()
        self._discards: list[threading.Thread] = []
        self.timings: dict[str, float] = {}

    # -- lifecycle

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Build the namespace, start the driver JVM and, in the background, the SparkContext."""
        t0 = time.monotonic()
        base = self.runtime.venv()
        self.timings["runtime"] = time.monotonic() - t0
        PIP_REPLAY.mkdir(parents=True, exist_ok=True)
        _reap_stale()
        # a test process that dies leaves its folder to the next start's _reap_stale
        self.dir = Path(tempfile.mkdtemp(prefix=f"cluster-{os.getpid()}-", dir=CLUSTERS))
        try:
            self._start(base)
        except BaseException:
            self.close()
            raise
        self.timings["start"] = time.monotonic() - t0

    def _start(self, base: Path) -> None:
        d = self.dir
        for sub in ("root", "volumes", "dbfs/tmp", "dbfs/FileStore", "workspace", "sim", "logs", "envs", "local",
                    "tmp/driver", "home/driver", "jdk/bin", "empty"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "tmp" / "driver").chmod(0o1777)
        shutil.copy(HERE / "kernel.py", d / "sim" / "dbsim_kernel.py")
        self._base = base
        (self._base_site,) = base.glob("lib/python3*/site-packages")
        self._jvm_opts = self._jvm_options(self._base_site / "pyspark")
        self._shared = self._shared_under_home(base)
        self._write_java_wrapper()
        # The driver's home: what every machine shares bound into it first ("pre"), then it covers HOME.
        pre = [[str(src), str(d / "home" / "driver" / src.relative_to(self.home)), ro] for src, ro in self._shared]
        binds = [[str(d / "volumes"), "/Volumes", True, False]]
        for v in self.volumes:
            (d / "volumes" / v.replace(".", "/")).mkdir(parents=True, exist_ok=True)
        for v in self.volumes:
            path = v.replace(".", "/")
            binds.append([str(d / "volumes" / path), f"/Volumes/{path}", False, False])
        if self.runtime.dbfs_root:
            binds.append([str(d / "dbfs"), "/dbfs", False, False])
        binds.append([str(d / "workspace"), "/Workspace", False, False])
        binds.append([str(d / "tmp" / "driver"), "/tmp", False, False])
        binds.append([str(d / "home" / "driver"), str(self.home), False, True])
        checkout = HERE.parent.parent
        if checkout != Path("/") and checkout not in d.parents:  # a Databricks driver has no checkout of ours
            binds.append([str(d / "empty"), str(checkout), True, False])
        (d / "sim" / "agent.json").write_text(json.dumps({"root": str(d / "root"), "pre": pre, "binds": binds}))
        self._spark = self._spark_home_of_cluster(base)
        self._start_agent()
        self._start_jvm()
        self._start_bootstrap()

    def _shared_under_home(self, base: Path) -> list[tuple[Path, bool]]:
        """What lies under HOME that every machine of the cluster needs, as (path, read-only): the
        cluster's folder, the runtime (read-only) and its interpreter, pip's cache (so a %pip of TensorFlow
        downloads once) and configuration (this machine's package index). The rest of HOME is the
        machine's own."""
        res = subprocess.run([str(base / "bin" / "python"), "-c", "import sys; print(sys.base_prefix)"],
                             capture_output=True, text=True, env=self._base_env(None))
        if res.returncode != 0:
            raise ClusterError(f"the runtime's Python does not run: {res.stderr[-2000:]}")
        wanted = [(self.dir, False), (base, True), (Path(res.stdout.strip()).resolve(), True),
                  (self.home / ".cache" / "pip", False), (self.home / ".config" / "pip", True),
                  (self.home / ".pip", True), (PIP_REPLAY, False)]
        wanted += [(Path(a).parent, True) for a in re.findall(r"-XX:SharedArchiveFile=(\S+)", " ".join(self._jvm_opts))]
        return [(p, ro) for p, ro in wanted if p.exists() and self.home in p.parents]

    def _notebook_env(self, name: str) -> Path:
        """A notebook's Python environment, as Databricks makes one for notebook-scoped libraries: a new
        virtualenv over the runtime's (whose packages it sees, and which its %pip cannot change: the
        runtime is read-only in the cluster, pip installs into the notebook's own site-packages, and what
        it installs there comes first on sys.path)."""
        target = self.dir / "envs" / name
        res = subprocess.run([str(self._base / "bin" / "python"), "-m", "venv", "--without-pip", str(target)],
                             capture_output=True, text=True, env=self._base_env(None))
        if res.returncode != 0:
            raise ClusterError(f"making the notebook's environment {target} failed: {res.stderr[-2000:]}")
        (site,) = target.glob("lib/python3*/site-packages")
        (site / "_dbsim_runtime.pth").write_text(f"import site; site.addsitedir({str(self._base_site)!r})\n")
        return target

    def _discard_env(self, env: Path) -> None:
        """Remove a notebook's environment in the background (renamed first, so it is gone at once): one
        that %pip-installed TensorFlow holds gigabytes."""
        trash = env.with_name(env.name + ".trash")
        try:
            env.rename(trash)
        except OSError:
            trash = env
        thread = threading.Thread(target=_remove, args=(trash,), name="dbsim-discard", daemon=True)
        thread.start()
        self._discards.append(thread)

    @staticmethod
    def _jvm_options(spark_home: Path) -> tuple[str, str]:
        """The driver's and the executors' JVM options when the test run sets some (``SPARK_SUBMIT_OPTS``, see
        tests/conftest.py): tests/environments.py's, with the class archives of the runtime's own Spark."""
        if not os.environ.get("SPARK_SUBMIT_OPTS"):
            return "", ""
        try:
            from environments import jvm_options
        except ImportError:  # the simulator on its own
            return os.environ["SPARK_SUBMIT_OPTS"], os.environ["SPARK_SUBMIT_OPTS"]
        return jvm_options("driver", spark_home), jvm_options("executor", spark_home)

    def _spark_home_of_cluster(self, base: Path) -> Path:
        """SPARK_HOME of the cluster's JVMs: the runtime's Spark through symbolic links, with a ``work``
        folder of its own (a local-cluster's workers write there, and the runtime is read-only)."""
        (pyspark,) = base.glob("lib/python3*/site-packages/pyspark")
        home = self.dir / "spark"
        home.mkdir()
        for entry in pyspark.iterdir():
            if entry.name != "work":
                (home / entry.name).symlink_to(entry)
        (home / "work").mkdir()
        return home

    def _write_java_wrapper(self) -> None:
        """JAVA_HOME for the cluster: its bin/java starts an executor JVM in a mount namespace of its own
        with the executor's own /tmp and home (a Databricks worker is another machine: a file the driver
        wrote to its /tmp or home is not there), and anything else as it is."""
        real = os.environ.get("JAVA_HOME")
        real = str(Path(real) / "bin" / "java") if real else shutil.which("java")
        if not real:
            raise ClusterError("no java on PATH and no JAVA_HOME: Spark needs Java 17 "
                               "(apt-get install openjdk-17-jre-headless)")
        real = os.path.realpath(real)
        jdk = self.dir / "jdk"
        lines = ["#!/bin/sh", "# dbsim: run in an executor's own mount namespace: its home and /tmp, then the JVM",
                 "set -e", 'tmp="$1"; home="$2"; shift 2', 'mkdir -p "$tmp" "$home"', 'chmod 1777 "$tmp"']
        for src, ro in self._shared:  # what every machine shares, into the executor's home first
            target = f'"$home/{src.relative_to(self.home)}"'
            lines += [f"mkdir -p {target}", f'mount --bind "{src}" {target}']
            if ro:
                lines.append(f"mount -o remount,bind,ro {target}")
        lines += [f'mount --rbind "$home" "{self.home}"', 'mount --bind "$tmp" /tmp', 'exec "$@"', ""]
        (jdk / "executor.sh").write_text("\n".join(lines))
        wrapper = "\n".join([
            "#!/bin/sh",
            "# dbsim: an executor JVM gets a /tmp and a home of its own, as a worker machine of a Databricks",
            "# cluster has; anything else runs as it is",
            'case " $* " in',
            '  *" org.apache.spark.executor.CoarseGrainedExecutorBackend "*)',
            '    args=" $* "; id=${args#* --executor-id }; id=${id%% *}',
            f'    exec unshare --mount --propagation private -- /bin/sh "{jdk}/executor.sh" '
            f'"{self.dir}/tmp/executor-$id" "{self.dir}/home/executor-$id" "{real}" "$@" ;;',
            "esac",
            f'exec "{real}" "$@"', ""])
        java = jdk / "bin" / "java"
        java.write_text(wrapper)
        java.chmod(0o755)

    def _start_agent(self) -> None:
        log = open(self.dir / "logs" / "agent.log", "wb")
        self._agent = subprocess.Popen(
            ["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "--",
             sys.executable, str(HERE / "agent.py"), str(self.dir / "sim" / "agent.json")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=self._base_env(None),
            start_new_session=True)
        log.close()
        line = self._agent.stdout.readline()
        if line.strip() != b"READY":
            self._agent.wait(10)
            raise ClusterError(f"the cluster namespace did not come up: {_tail(self.dir / 'logs' / 'agent.log')}")
        children = _children(self._agent.pid)
        if len(children) != 1:
            raise ClusterError(f"unshare has {children} as children, expected the agent alone")
        self._init_pid = children[0]
        self._ns = _ns_of(self._init_pid)

    def _base_env(self, python_env: Path | None) -> dict[str, str]:
        env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
        env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})  # this machine's index
        # %pip writes no .pyc files (Python writes those it imports): TensorFlow's would cost ~10 s per install
        # and change nothing a notebook sees
        env["PIP_NO_COMPILE"] = "1"
        env.setdefault("HOME", str(Path.home()))
        env.setdefault("LANG", "C.UTF-8")
        env["JAVA_HOME"] = str(self.dir / "jdk")
        path = f"{env['JAVA_HOME']}/bin:{_SYSTEM_PATH}"
        if python_env is not None and python_env != self._base:  # a notebook's, then the runtime's scripts
            path = f"{python_env}/bin:{self._base}/bin:{path}"
        elif python_env is not None:
            path = f"{python_env}/bin:{path}"
        env["PATH"] = path
        env["DATABRICKS_RUNTIME_VERSION"] = self.runtime.version
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        env["MPLBACKEND"] = "agg"
        return env

    def _nsenter(self, cwd: str) -> list[str]:
        # nsenter's --wd=DIR opens DIR outside the new root; `env -C` changes directory inside it
        return ["nsenter", "-t", str(self._init_pid), "--mount", "--pid", "--root", "--wd", "--",
                "env", "-C", cwd, "--"]

    def _start_jvm(self) -> None:
        spark_home = self._spark
        conn = self.dir / "sim" / "conn_info"
        env = self._base_env(self._base)
        env.update(SPARK_HOME=str(spark_home), _PYSPARK_DRIVER_CONN_INFO_PATH=str(conn))
        master = f"local-cluster[{self.executors},{self.executor_cores},{self.executor_memory_mb}]"
        conf = {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.local.dir": str(self.dir / "local"),
            "spark.executor.memory": f"{self.executor_memory_mb}m",
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": f"{int(self.start_timeout)}s",
            "spark.databricks.clusterUsageTags.sparkVersion": self.runtime.spark_version,
            "spark.databricks.clusterUsageTags.clusterName": "dbsim",
            "spark.databricks.clusterUsageTags.clusterId": f"dbsim-{self.dir.name}",
            **self.spark_conf,
        }
        if self._jvm_opts[0]:  # the test run's JVM options, executors too
            env["SPARK_SUBMIT_OPTS"] = self._jvm_opts[0]
            conf.setdefault("spark.executor.extraJavaOptions", self._jvm_opts[1])
        cmd = [str(spark_home / "bin" / "spark-submit"), "--master", master, "--name", "Databricks Shell"]
        for k, v in conf.items():
            cmd += ["--conf", f"{k}={v}"]
        cmd.append("pyspark-shell")
        log = open(self.dir / "logs" / "driver-jvm.log", "wb")
        t0 = time.monotonic()
        # stdin stays open: the gateway exits when it closes (the JVM's way of following its parent)
        self._jvm = subprocess.Popen(self._nsenter(str(self.dir / "sim")) + cmd, stdin=subprocess.PIPE,
                                     stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + self.start_timeout
        while not conn.is_file():
            if self._jvm.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(f"the driver JVM did not start (exit {self._jvm.poll()}):\n"
                                   f"{_tail(self.dir / 'logs' / 'driver-jvm.log', 6000)}")
            time.sleep(0.05)
        time.sleep(0.05)  # written then renamed by the JVM; read it whole
        data = conn.read_bytes()
        port, length = struct.unpack(">ii", data[:8])
        self._gateway = (port, data[8:8 + length].decode())
        self.timings["jvm"] = time.monotonic() - t0

    def _start_bootstrap(self) -> None:
        spec = self.dir / "sim" / "bootstrap.json"
        spec.write_text(json.dumps({"executors": self.executors, "timeout": self.start_timeout,
                                    "done": str(self.dir / "sim" / "bootstrap.done")}))
        env = self._kernel_env(self._base)
        log = open(self.dir / "logs" / "bootstrap.log", "wb")
        self._boot_started = time.time()
        self._boot = subprocess.Popen(
            self._nsenter(str(self.dir / "sim")) + [str(self._base / "bin" / "python"),
                                                    str(self.dir / "sim" / "dbsim_kernel.py"), "--bootstrap",
                                                    str(spec)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()

    def wait_ready(self) -> None:
        """Block until the SparkContext is up with all executors (the first run does this by itself)."""
        if self._boot is None or "spark" in self.timings:
            return
        try:
            rc = self._boot.wait(self.start_timeout)
        except subprocess.TimeoutExpired:
            rc = None
        if rc != 0:
            raise ClusterError(f"the SparkContext did not come up (bootstrap exit {rc}):\n"
                               f"{_tail(self.dir / 'logs' / 'bootstrap.log', 6000)}\n--- driver JVM ---\n"
                               f"{_tail(self.dir / 'logs' / 'driver-jvm.log', 6000)}")
        self._note_spark_up()

    def _note_spark_up(self) -> None:
        """timings["spark"]: seconds from starting the SparkContext to all executors registered."""
        if "spark" not in self.timings and self._boot is not None and self._boot.poll() == 0:
            try:
                done = json.loads((self.dir / "sim" / "bootstrap.done").read_text())["time"]
            except (OSError, ValueError, KeyError):
                return
            self.timings["spark"] = done - self._boot_started

    def _kernel_env(self, python_env: Path) -> dict[str, str]:
        env = self._base_env(python_env)
        python = str(python_env / "bin" / "python")
        port, secret = self._gateway
        env.update(PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python, PYSPARK_GATEWAY_PORT=str(port),
                   PYSPARK_GATEWAY_SECRET=secret, DBSIM_PIP_REPLAY=str(PIP_REPLAY / self.runtime.version))
        return env

    def close(self) -> None:
        """Stop everything the cluster started and remove its files.

        Raises:
            ClusterError: a process of the cluster's namespace outlived it (a bug of the simulator).
        """
        survivors = []
        if self._agent is not None:
            ns = self._ns
            for proc in (self._jvm, self._agent):
                if proc is not None and proc.stdin:
                    try:
                        proc.stdin.close()
                    except OSError:
                        pass
            try:
                self._agent.wait(10)
            except subprocess.TimeoutExpired:
                _kill([self._agent.pid] + ([self._init_pid] if self._init_pid else []))
                self._agent.wait(10)
            for proc in (self._jvm, self._boot):
                if proc is not None:
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        _kill([proc.pid])
                        proc.wait(5)
            if ns:
                deadline = time.monotonic() + 10
                survivors = _in_namespace(ns)
                while survivors and time.monotonic() < deadline:
                    time.sleep(0.1)
                    survivors = _in_namespace(ns)
            self._agent = None
        for thread in self._discards:
            thread.join()
        self._discards = []
        if self.dir is not None and not survivors:
            _remove(self.dir)
            self.dir = None
        if survivors:
            raise ClusterError(f"processes of the cluster outlived it: {[' '.join(_cmdline(p)) for p in survivors]}")

    # -- paths

    def host_path(self, path: str) -> Path:
        """Where a path the notebooks see (``/Volumes/...``, ``/dbfs/...``, ``/Workspace/...``, the driver's
        ``/tmp/...`` and home) is on this machine, while the cluster is up."""
        p = PurePosixPath(path)
        if self.dir in p.parents or p == self.dir:
            return Path(path)
        for inside, host in (("/Volumes", "volumes"), ("/dbfs", "dbfs"), ("/Workspace", "workspace"),
                             ("/tmp", "tmp/driver"), (str(self.home), "home/driver")):
            if p == PurePosixPath(inside) or PurePosixPath(inside) in p.parents:
                if inside == "/dbfs" and not self.runtime.dbfs_root:
                    break
                return self.dir / host / p.relative_to(inside)
        return Path(path)

    def workspace_folder(self, folder: str, user: str | None = None) -> str:
        """The notebooks' working directory for an archive folder of ``user`` (default: the cluster's), as the
        notebooks see it."""
        user = user or self.user
        return f"/Workspace/Users/{user}/{folder}" if folder else f"/Workspace/Users/{user}"

    def executor_tmp(self, executor: int) -> Path:
        """Where executor ``executor``'s ``/tmp`` is on this machine (its Python workers' too)."""
        return self.dir / "tmp" / f"executor-{executor}"

    def executor_home(self, executor: int) -> Path:
        """Where executor ``executor``'s home folder is on this machine."""
        return self.dir / "home" / f"executor-{executor}"

    def executor_logs(self) -> str:
        """The executors' stdout and stderr (their Python workers' included), while the cluster is up."""
        out = []
        for f in sorted((self.dir / "spark").glob("work/*/*/std*")):
            out.append(f"===== {f.parent.name} {f.name} =====\n{_tail(f, 50_000)}")
        return "\n".join(out)

    def jvm_log(self) -> str:
        """The driver JVM's log (stdout and stderr), while the cluster is up."""
        return _tail(self.dir / "logs" / "driver-jvm.log")

    # -- running notebooks

    def run(self, archive: str | os.PathLike, notebook: str, *, params: Mapping[str, object] | None = None,
            timeout: float = 1800.0, env: Mapping[str, str] | None = None, pip: str = "line",
            user: str | None = None) -> NotebookResult:
        """Run All of one notebook of ``archive``, as a job with ``params`` (widget values) when given.

        Args:
            archive: the ``.dbc`` file.
            notebook: its name (``"03_train"``) or archive path (``"tfnb/03_train"``).
            params: job parameters: widget values that exist from the start.
            timeout: seconds for the whole Run All; past it the running command is reported ``"timeout"``.
            env: extra environment variables for the notebook's Python (say, ``TF_CPP_MIN_LOG_LEVEL``); none
                by default, as on Databricks.
            pip: how the runtime offers ``%pip``: ``"line"``, a line magic (a command's first line, or code
                calling ``get_ipython().run_line_magic("pip", ...)``); ``"cell"``, only as the first line of a
                command of its own (a cell magic: code calling the line magic gets IPython's ``UsageError``).
            user: the workspace user who runs it (default: the cluster's ``user``): ``select current_user()``
                answers it, and the notebook's folder is that user's (``/Workspace/Users/<user>/...``), with its
                own copy of the archive's notebooks, as when each user imports the archive.

        Returns:
            The :class:`NotebookResult`; a failing command is in ``failure`` (``.check()`` raises it).
        """
        if self._agent is None:
            raise ClusterError("the cluster is not started: use it as a context manager")
        if self._jvm.poll() is not None:
            raise ClusterError(f"the cluster's driver JVM is gone (exit {self._jvm.poll()}); a notebook may have "
                               f"stopped or crashed it:\n{_tail(self.dir / 'logs' / 'driver-jvm.log', 6000)}")
        from tools import dbc

        notebooks = {nb.path: [{"kind": c.cell_type, "source": c.source} for c in nb.cells]
                     for nb in dbc.read(archive)}
        path = self._resolve(notebooks, notebook)
        with self._runs_lock:
            self._runs += 1
            run_id = f"run{self._runs}"
            self._active.add(run_id)
        folder = str(PurePosixPath(path).parent) if "/" in path else ""
        user = user or self.user
        cwd = self.workspace_folder(folder, user)
        self.host_path(cwd).mkdir(parents=True, exist_ok=True)
        sim = self.dir / "sim"
        widgets = sim / f"{run_id}-widgets.json"
        widgets.write_text(json.dumps({"widgets": {}, "params": {str(k): str(v) for k, v in (params or {}).items()}}))
        events = sim / f"{run_id}-events.jsonl"
        events.touch()
        log = self.dir / "logs" / f"{run_id}.log"
        t0 = time.monotonic()
        nb_env = self._notebook_env(run_id)
        kernel_env = self._kernel_env(nb_env)
        kernel_env.update(env or {})
        kernel_env["DBSIM_RUN"] = run_id  # inherited by what the notebook starts: told apart when it ends
        deadline = t0 + timeout
        start, process, timed_out, died = 0, 0, None, None
        try:
            while True:
                process += 1
                spec = sim / f"{run_id}-p{process}.json"
                spec.write_text(json.dumps({
                    "notebooks": notebooks, "notebook": path, "start": start, "process": process,
                    "widgets": str(widgets), "events": str(events), "cwd": cwd,
                    "dbfs_root": self.runtime.dbfs_root, "secrets": self.secrets,
                    "executors": self.executors, "timeout": self.start_timeout, "pip": pip, "user": user}))
                with open(log, "ab") as out:
                    out.write(f"===== Python process {process} =====\n".encode())
                    out.flush()
                    kernel = subprocess.Popen(
                        self._nsenter(cwd) + [str(nb_env / "bin" / "python"), str(sim / "dbsim_kernel.py"),
                                              str(spec)],
                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=kernel_env)
                rc = self._wait_kernel(kernel, deadline)
                ended = [e for e in self._events(events) if e.get("event") == "end" and e.get("process") == process]
                if rc is None:
                    timed_out = process
                    break
                if not ended:
                    died = (process, rc)
                    break
                if ended[-1]["reason"] != "restart" or ended[-1]["next"] >= len(notebooks[path]):
                    break
                start = ended[-1]["next"]
        finally:
            leftovers = self._end_notebook(run_id, nb_env)
            with self._runs_lock:
                self._active.discard(run_id)
            self._discard_env(nb_env)
            self._note_spark_up()
        return self._result(path, events, widgets, log, time.monotonic() - t0, process, timed_out, died,
                            leftovers, timeout)

    def run_all(self, archive: str | os.PathLike, notebooks: Sequence[str], *,
                params: Mapping[str, object] | None = None, stop_on_failure: bool = True,
                **kw) -> list[NotebookResult]:
        """:meth:`run` for each notebook in turn (the same ``params`` for each), stopping after a failure
        unless ``stop_on_failure`` is False."""
        out = []
        for name in notebooks:
            out.append(self.run(archive, name, params=params, **kw))
            if stop_on_failure and not out[-1].ok:
                break
        return out

    @staticmethod
    def _resolve(notebooks: Mapping[str, list], notebook: str) -> str:
        if notebook in notebooks:
            return notebook
        named = [p for p in notebooks if PurePosixPath(p).name == notebook]
        if len(named) == 1:
            return named[0]
        raise KeyError(f"notebook {notebook!r} is not in the archive (it has {', '.join(sorted(notebooks))})")

    def _wait_kernel(self, kernel: subprocess.Popen, deadline: float) -> int | None:
        """The kernel's exit code, or None when the run's deadline passed (the kernel is then killed)."""
        while True:
            if self._boot is not None and self._boot.poll() not in (None, 0):
                self._kill_kernel(kernel)
                self.wait_ready()  # raises with the bootstrap's log
            self._note_spark_up()
            try:
                return kernel.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    self._kill_kernel(kernel)
                    return None

    def _kill_kernel(self, kernel: subprocess.Popen) -> None:
        _kill([kernel.pid] + self._descendants(kernel.pid))
        kernel.wait(10)

    def _descendants(self, pid: int) -> list[int]:
        out, todo = [], [pid]
        while todo:
            for child in _children(todo.pop()):
                out.append(child)
                todo.append(child)
        return out

    def _end_notebook(self, run_id: str, env: Path) -> tuple[str, ...]:
        """Kill what the notebook left in the namespace: alone on the cluster, every process but the agent, the
        JVMs and the bootstrap is its; beside other notebooks, those of its environment (``DBSIM_RUN``) or its
        Python. The ones that were not Spark's idle Python workers are reported."""
        keep = {self._init_pid}
        if self._boot is not None and self._boot.poll() is None:
            keep.update([self._boot.pid] + self._descendants(self._boot.pid))
        pids = [p for p in _in_namespace(self._ns) if p not in keep and not _is_jvm(_cmdline(p))]
        with self._runs_lock:
            alone = self._active == {run_id}
        if not alone:
            pids = [p for p in pids if _environ(p).get("DBSIM_RUN") == run_id
                    or (_cmdline(p)[:1] and _cmdline(p)[0].startswith(str(env)))]
        leftovers = tuple(f"{p}: {' '.join(_cmdline(p))}" for p in pids if not _is_spark_worker(_cmdline(p)))
        still = _kill(pids)
        if still:
            raise ClusterError(f"processes of a notebook would not die: {[' '.join(_cmdline(p)) for p in still]}")
        return leftovers

    @staticmethod
    def _events(path: Path) -> list[dict]:
        out, process = [], 0
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a process killed while writing
            if event.get("event") == "start":
                process = event["process"]
            event.setdefault("process", process)
            out.append(event)
        return out

    def _result(self, path, events_path, widgets_path, log_path, seconds, processes, timed_out, died,
                leftovers, timeout) -> NotebookResult:
        events = self._events(events_path)
        commands, failure, exit_value, restarts = [], None, None, []
        begun = {}
        for e in events:
            if e["event"] == "begin":
                begun[e["process"]] = e
            elif e["event"] == "command":
                begun.pop(e["process"], None)
                err = e.get("error") or {}
                cmd = Command(index=e["index"] + 1, first_line=e["first_line"], process=e["process"],
                              status=e["status"], stdout=e["stdout"], stderr=e["stderr"], html=tuple(e["html"]),
                              seconds=e["seconds"], error=err.get("traceback"))
                commands.append(cmd)
                if e["status"] == "restart":
                    restarts.append(cmd.index)
                elif e["status"] == "exit":
                    exit_value = err.get("exit_value")
                elif e["status"] == "failed":
                    failure = Failure(cmd.index, cmd.first_line, cmd.process, err.get("type", "?"),
                                      err.get("message", ""), err.get("traceback", ""))
        log = _tail(log_path)
        if timed_out is not None or died is not None:
            process = timed_out if timed_out is not None else died[0]
            open_cmd = begun.get(process)
            index = open_cmd["index"] + 1 if open_cmd else 0
            first = open_cmd["first_line"] if open_cmd else "(before the first command)"
            if timed_out is not None:
                status, etype, message = "timeout", "TimeoutError", f"Run All did not finish within {timeout:.0f} s"
            else:
                status, etype = "died", "PythonProcessDied"
                message = (f"the Python process exited with code {died[1]} "
                           f"{'during this command' if open_cmd else 'before running a command'}")
            commands.append(Command(index=index, first_line=first, process=process, status=status,
                                    error=message))
            failure = Failure(index, first, process, etype, message, log[-4000:])
        state = json.loads(widgets_path.read_text())
        widgets = {**state["params"], **{n: w["value"] for n, w in state["widgets"].items()}}
        return NotebookResult(notebook=path, runtime=self.runtime.name, commands=tuple(commands),
                              restarts=tuple(restarts), processes=processes, failure=failure,
                              exit_value=exit_value, widgets=widgets, seconds=round(seconds, 3),
                              leftovers=leftovers, log=log)


@contextlib.contextmanager
def cluster(runtime: Runtime | str = RUNTIME_A, **options) -> Iterator[Cluster]:
    """A started :class:`Cluster` for the duration of a ``with`` block (or a pytest fixture), after
    :func:`need_simulator`.

    Example:
        >>> @pytest.fixture(scope="module")                                     # doctest: +SKIP
        ... def cluster_a():
        ...     with dbsim.cluster(dbsim.RUNTIME_A) as c:
        ...         yield c
    """
    need_simulator()
    with Cluster(runtime, **options) as started:
        yield started


def simulate(runtime: Runtime | str, archive: str | os.PathLike, notebook: str, *,
             params: Mapping[str, object] | None = None, cluster: Cluster | None = None, timeout: float = 1800.0,
             env: Mapping[str, str] | None = None, **cluster_options) -> NotebookResult:
    """Run All of one notebook of a DBC archive on a simulated cluster of ``runtime``: ``cluster``'s if
    given (files under /Volumes stay for the next notebook), else a new one that goes away after.

    Example:
        >>> simulate(RUNTIME_A, "dbc/tfnb.dbc", "02_model").check()      # doctest: +SKIP
    """
    if cluster is not None:
        return cluster.run(archive, notebook, params=params, timeout=timeout, env=env)
    with Cluster(runtime, **cluster_options) as own:
        return own.run(archive, notebook, params=params, timeout=timeout, env=env)
