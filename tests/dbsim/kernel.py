"""The Python REPL of one simulated Databricks notebook, run by the runtime's own Python.

The controller (``dbsim.Cluster``) copies this file out of the checkout and runs it with the Python of
the notebook's environment (a virtualenv over the runtime's), inside the cluster's namespaces::

    <env>/bin/python dbsim_kernel.py SPEC.json              # Run All from SPEC["start"]
    <env>/bin/python dbsim_kernel.py --bootstrap SPEC.json  # create the cluster's SparkContext

It imports nothing of tfnb or the tests: stdlib, IPython and pyspark of the runtime only. One process is
one Python REPL of Databricks: ``dbutils.library.restartPython()`` ends it, and the controller starts the
next one at the command after. What happened is written as JSON lines to SPEC["events"]:

    {"event": "start", "process": 1, "pid": ...}
    {"event": "begin", "index": 3, "first_line": "..."}        # before each command
    {"event": "command", "index": 3, "status": "ok"|"failed"|"restart"|"exit", "stdout": ..., ...}
    {"event": "end", "reason": "done"|"failed"|"restart"|"exit", "next": 4}

Widget values live in SPEC["widgets"] (a JSON file), rewritten on every change, so they outlive the
process as they outlive a restart on Databricks (they belong to the notebook, not to Python).
"""
from __future__ import annotations

import ast
import atexit
import importlib
import io
import json
import linecache
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import traceback


# ---------------------------------------------------------------- %pip install, replayed


class _PipReplay:
    """A ``%pip install`` that repeats one already run with this runtime, with the same arguments (local files
    by name and content, wherever they lie), into a notebook environment that has nothing installed yet,
    gives the same files and output: the first one's result is kept (hard links, under ``DBSIM_PIP_REPLAY``,
    which outlives the cluster: see ``dbsim.PIP_REPLAY``) and copied in, instead of pip unpacking
    TensorFlow's gigabytes once per notebook. Scripts are copied with their first line pointing at this
    environment's Python. A notebook's later %pip (which may replace what is there) runs. The last ``_KEEP``
    results are kept."""

    _KEEP = 2  # a result with TensorFlow holds ~2 GB of memory-backed /dev/shm

    @classmethod
    def of(cls, args: list[str]) -> _PipReplay | None:
        import glob

        if args[:1] != ["install"]:
            return None
        (site,) = glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages"))
        before = set(os.listdir(site))
        return cls(args, site, before) if before <= {"_dbsim_runtime.pth", "__pycache__"} else None

    def __init__(self, args: list[str], site: str, before: set[str]):
        import hashlib

        self.site = site
        self.before = before
        self.bins = set(os.listdir(os.path.join(sys.prefix, "bin")))
        # a local file by its name and content: the simulated /Volumes and /dbfs lie under each cluster's folder
        said = []
        for a in args:
            if os.path.isfile(a):
                with open(a, "rb") as f:
                    a = f"{os.path.basename(a)}@{hashlib.sha256(f.read()).hexdigest()}"
            said.append(a)
        key = json.dumps([said, sorted(self.before), sorted(self.bins)])
        store = os.environ.get("DBSIM_PIP_REPLAY") or os.path.join(os.path.dirname(os.path.dirname(sys.prefix)),
                                                                    "pip-replay")  # else <cluster>/pip-replay
        self.dir = os.path.join(store, hashlib.sha256(key.encode()).hexdigest()[:16])
        self.output = ""

    def apply(self) -> bool:
        try:
            os.utime(self.dir)  # recently used: kept
            with open(os.path.join(self.dir, "output.txt"), encoding="utf-8") as f:
                self.output = f.read()
            with open(os.path.join(self.dir, "prefix.txt"), encoding="utf-8") as f:
                old_prefix = f.read()
        except OSError:
            return False
        site = os.path.join(self.dir, "site")
        for name in os.listdir(site):
            subprocess.run(["cp", "-al", os.path.join(site, name), self.site], check=True)
        for name in os.listdir(os.path.join(self.dir, "bin")):
            with open(os.path.join(self.dir, "bin", name), "rb") as f:
                data = f.read().replace(old_prefix.encode(), sys.prefix.encode())
            target = os.path.join(sys.prefix, "bin", name)
            with open(target, "wb") as f:
                f.write(data)
            os.chmod(target, 0o755)
        return True

    def record(self, output: str) -> None:
        tmp = self.dir + f".{os.getpid()}"
        os.makedirs(os.path.join(tmp, "site"))
        os.makedirs(os.path.join(tmp, "bin"))
        for name in set(os.listdir(self.site)) - self.before:
            subprocess.run(["cp", "-al", os.path.join(self.site, name), os.path.join(tmp, "site")], check=True)
        for name in set(os.listdir(os.path.join(sys.prefix, "bin"))) - self.bins:
            shutil.copy(os.path.join(sys.prefix, "bin", name), os.path.join(tmp, "bin", name))
        for name, text in (("prefix.txt", sys.prefix), ("output.txt", output)):
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                f.write(text)
        try:
            os.rename(tmp, self.dir)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another notebook recorded it first
        store = os.path.dirname(self.dir)
        kept = sorted((e for e in os.scandir(store) if e.is_dir() and "." not in e.name),
                      key=lambda e: e.stat().st_mtime, reverse=True)
        for old in kept[self._KEEP:]:
            shutil.rmtree(old.path, ignore_errors=True)


# ---------------------------------------------------------------- events and output capture


class Events:
    def __init__(self, path: str):
        self._f = open(path, "a", encoding="utf-8")

    def write(self, **event) -> None:
        self._f.write(json.dumps(event) + "\n")
        self._f.flush()


class Tee(io.TextIOBase):
    """A command's stdout or stderr: kept for the result and passed on to the process log."""

    def __init__(self, passthrough):
        self._buf = io.StringIO()
        self._passthrough = passthrough
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, s) -> int:
        with self._lock:
            self._buf.write(s)
        try:
            self._passthrough.write(s)
        except Exception:
            pass
        return len(s)

    def flush(self) -> None:
        try:
            self._passthrough.flush()
        except Exception:
            pass

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self):
        return "utf-8"

    def fileno(self):  # code that hands sys.stdout to a subprocess writes to the process log
        return self._passthrough.fileno()

    def getvalue(self) -> str:
        with self._lock:
            return self._buf.getvalue()


# ---------------------------------------------------------------- control flow of the REPL


class RestartPython(BaseException):
    """dbutils.library.restartPython(): ends the command (and a %run in progress); Run All goes on in a
    new Python process. A BaseException so that `except Exception` in notebook code does not swallow it."""


class NotebookExit(BaseException):
    """dbutils.notebook.exit(value): ends the notebook run, successfully."""

    def __init__(self, value):
        super().__init__(value)
        self.value = value


class InputWidgetNotDefined(Exception):
    """What dbutils.widgets.get raises for a widget that was never created (on Databricks a Py4JJavaError
    whose message names com.databricks.dbutils_v1.InputWidgetNotDefined)."""


class WidgetError(Exception):
    """A widget call Databricks refuses (default not among the choices...)."""


# ---------------------------------------------------------------- dbutils


class _Widgets:
    """dbutils.widgets: values live in the notebook (a JSON file the controller keeps across processes).
    A job parameter is a value before any widget exists and wins over the widget's default."""

    def __init__(self, path: str):
        self._path = path
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        self._widgets = state["widgets"]    # name -> {"type", "default", "choices", "label", "value"}
        self._params = state["params"]      # job parameters: name -> value

    def _save(self) -> None:
        tmp = self._path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"widgets": self._widgets, "params": self._params}, f)
        os.replace(tmp, self._path)

    def _create(self, kind: str, name: str, default: str, choices, label) -> None:
        if not isinstance(name, str) or not name:
            raise WidgetError(f"widget name {name!r} must be a non-empty string")
        default = str(default)
        if choices is not None:
            choices = [str(c) for c in choices]
            if kind == "dropdown" and default not in choices:
                raise WidgetError(f"Default value {default!r} of dropdown widget {name!r} is not one of its "
                                  f"choices {choices}")
            if kind == "multiselect" and any(v not in choices for v in default.split(",") if v):
                raise WidgetError(f"Default value {default!r} of multiselect widget {name!r} is not among its "
                                  f"choices {choices}")
        if name in self._widgets:  # an existing widget keeps its value (the user may have changed it)
            return
        value = self._params[name] if name in self._params else default
        self._widgets[name] = {"type": kind, "default": default, "choices": choices, "label": label,
                               "value": value}
        self._save()

    def text(self, name, defaultValue, label=None):
        self._create("text", name, defaultValue, None, label)

    def dropdown(self, name, defaultValue, choices, label=None):
        self._create("dropdown", name, defaultValue, choices, label)

    def combobox(self, name, defaultValue, choices, label=None):
        self._create("combobox", name, defaultValue, choices, label)

    def multiselect(self, name, defaultValue, choices, label=None):
        self._create("multiselect", name, defaultValue, choices, label)

    def get(self, name):
        if name in self._widgets:
            return self._widgets[name]["value"]
        if name in self._params:
            return self._params[name]
        raise InputWidgetNotDefined(f"com.databricks.dbutils_v1.InputWidgetNotDefined: No input widget named "
                                    f"{name} is defined")

    def getArgument(self, name, optional=None):
        try:
            return self.get(name)
        except InputWidgetNotDefined:
            return optional

    def getAll(self):
        values = dict(self._params)
        values.update({n: w["value"] for n, w in self._widgets.items()})
        return values

    def remove(self, name):
        if name not in self._widgets:
            raise InputWidgetNotDefined(f"com.databricks.dbutils_v1.InputWidgetNotDefined: No input widget named "
                                        f"{name} is defined")
        del self._widgets[name]
        self._save()

    def removeAll(self):
        self._widgets.clear()
        self._save()

    def help(self, *_):
        print("dbutils.widgets (simulated): text, dropdown, combobox, multiselect, get, getArgument, getAll, "
              "remove, removeAll")


class FileInfo(tuple):
    """dbutils.fs.ls entries: path, name, size, modificationTime (a dir's name ends with '/')."""

    __slots__ = ()
    _fields = ("path", "name", "size", "modificationTime")

    def __new__(cls, path, name, size, modificationTime):
        return tuple.__new__(cls, (path, name, size, modificationTime))

    path = property(lambda self: self[0])
    name = property(lambda self: self[1])
    size = property(lambda self: self[2])
    modificationTime = property(lambda self: self[3])

    def isDir(self):
        return self.name.endswith("/")

    def isFile(self):
        return not self.isDir()

    def __repr__(self):
        return "FileInfo(path={!r}, name={!r}, size={}, modificationTime={})".format(*self)


class _Fs:
    """dbutils.fs on the driver's file system: ``dbfs:/x`` and scheme-less ``/x`` are DBFS (``/dbfs/x``),
    ``/Volumes/...`` are volumes, ``file:/x`` is the driver's local ``/x``."""

    def __init__(self, dbfs_root: bool):
        self._dbfs_root = dbfs_root

    def _local(self, path: str) -> tuple[str, str]:
        """(local path, the scheme-qualified prefix ls reports)."""
        path = str(path)
        if path.startswith("file:"):
            return "/" + path[len("file:"):].lstrip("/"), "file:/"
        if path.startswith("/Volumes/") or path == "/Volumes":
            return path, "/"
        if path.startswith("dbfs:"):
            rest = path[len("dbfs:"):]
        elif path.startswith("/"):
            rest = path
        else:
            raise ValueError(f"dbutils.fs: unsupported path {path!r} (the simulator knows dbfs:/, file:/ and "
                             f"/Volumes/ paths)")
        if rest.startswith("/Volumes/"):
            return rest, "dbfs:/"
        if not self._dbfs_root:
            raise PermissionError(f"dbutils.fs: {path!r} is on the DBFS root, and this workspace has no DBFS "
                                  f"root (Public DBFS root is disabled); use a /Volumes/<catalog>/<schema>/"
                                  f"<volume> path")
        return "/dbfs/" + rest.lstrip("/"), "dbfs:/"

    def _shown(self, local: str, prefix: str) -> str:
        if prefix == "dbfs:/" and local.startswith("/dbfs/"):
            return "dbfs:/" + local[len("/dbfs/"):]
        if prefix == "file:/":
            return "file:" + local
        return local if prefix == "/" else "dbfs:" + local

    def ls(self, path):
        local, prefix = self._local(path)
        if not os.path.exists(local):
            raise FileNotFoundError(f"java.io.FileNotFoundException: {path} does not exist")
        if os.path.isfile(local):
            st = os.stat(local)
            return [FileInfo(self._shown(local, prefix), os.path.basename(local), st.st_size,
                             int(st.st_mtime * 1000))]
        out = []
        for name in sorted(os.listdir(local)):
            full = os.path.join(local, name)
            st = os.stat(full)
            is_dir = os.path.isdir(full)
            shown = self._shown(full, prefix) + ("/" if is_dir else "")
            out.append(FileInfo(shown, name + ("/" if is_dir else ""), 0 if is_dir else st.st_size,
                                int(st.st_mtime * 1000)))
        return out

    def mkdirs(self, path):
        os.makedirs(self._local(path)[0], exist_ok=True)
        return True

    def rm(self, path, recurse=False):
        local = self._local(path)[0]
        if os.path.isdir(local) and not os.path.islink(local):
            if recurse:
                shutil.rmtree(local)
            else:
                os.rmdir(local)  # like Databricks: a non-empty folder needs recurse=True
        elif os.path.lexists(local):
            os.remove(local)
        else:
            return False
        return True

    def put(self, path, contents, overwrite=False):
        local = self._local(path)[0]
        if os.path.exists(local) and not overwrite:
            raise FileExistsError(f"java.nio.file.FileAlreadyExistsException: {path} (pass overwrite=True)")
        os.makedirs(os.path.dirname(local) or "/", exist_ok=True)
        with open(local, "w", encoding="utf-8") as f:
            f.write(contents)
        print(f"Wrote {len(contents.encode())} bytes.")
        return True

    def head(self, path, maxBytes=65536):
        with open(self._local(path)[0], "rb") as f:
            return f.read(maxBytes).decode("utf-8", "replace")

    def cp(self, src, dst, recurse=False):
        a, b = self._local(src)[0], self._local(dst)[0]
        if os.path.isdir(a):
            if not recurse:
                raise IsADirectoryError(f"{src} is a directory: pass recurse=True")
            shutil.copytree(a, b, dirs_exist_ok=True)
        else:
            os.makedirs(os.path.dirname(b) or "/", exist_ok=True)
            shutil.copy2(a, b)
        return True

    def mv(self, src, dst, recurse=False):
        a, b = self._local(src)[0], self._local(dst)[0]
        os.makedirs(os.path.dirname(b) or "/", exist_ok=True)
        shutil.move(a, b)
        return True

    def help(self, *_):
        print("dbutils.fs (simulated): ls, mkdirs, rm, put, head, cp, mv")


class _Library:
    def restartPython(self):
        raise RestartPython()

    def help(self, *_):
        print("dbutils.library (simulated): restartPython")


class _Option:
    """A Scala ``Option`` as Py4J hands it to Python: ``isDefined``, ``get``, ``getOrElse``."""

    def __init__(self, value=None):
        self._value = value

    def isDefined(self):
        return self._value is not None

    def isEmpty(self):
        return self._value is None

    def get(self):
        if self._value is None:
            raise ValueError("java.util.NoSuchElementException: None.get")
        return self._value

    def getOrElse(self, default):
        return default if self._value is None else self._value


class _Context:
    """``dbutils.notebook.entry_point.getDbutils().notebook().getContext()``: who runs which notebook. The
    simulated workspace has no REST API, so ``apiUrl`` and ``apiToken`` are empty (libraries then fall back to
    their own configuration, as on a cluster whose context has no token)."""

    def __init__(self, user: str, path: str):
        self._tags = {"user": user, "notebook_path": path, "clusterId": "dbsim"}
        self._user, self._path = user, path

    def userName(self):
        return _Option(self._user)

    def notebookPath(self):
        return _Option(self._path)

    def apiUrl(self):
        return _Option()

    def apiToken(self):
        return _Option()

    def tags(self):
        return _Tags(self._tags)

    def extraContext(self):
        return _Tags({})

    def toJson(self):
        return json.dumps({"tags": self._tags, "extraContext": {}})


class _Tags:
    def __init__(self, values: dict):
        self._values = values

    def get(self, key):
        return _Option(self._values.get(key))

    def apply(self, key):
        return self._values[key]


class _EntryPoint:
    """``dbutils.entry_point`` / ``dbutils.notebook.entry_point``: the Databricks-internal gateway some libraries
    read the notebook context through (MLflow reads it when imported on a Databricks runtime). Modelled: the
    notebook context (user, notebook path; no API token), a logger that drops usage records, and the driver
    conf's SSL flag; anything else is an AttributeError naming it."""

    def __init__(self, user: str, path: str):
        self._context = _Context(user, path)

    def getDbutils(self):
        return self

    def notebook(self):
        return self

    def getContext(self):
        return self._context

    def getDriverConf(self):
        return type("DriverConf", (), {"workflowSslTrustAll": staticmethod(lambda: False)})()

    def getLogger(self):
        return type("Logger", (), {"logUsage": staticmethod(lambda *a, **k: None)})()

    def getNonUcApiToken(self):
        raise RuntimeError("no API token: the simulated workspace has no REST API")

    def __getattr__(self, name):
        raise AttributeError(f"dbutils.entry_point.{name} is Databricks-internal and not simulated")


class _Notebook:
    def __init__(self, kernel):
        self._kernel = kernel

    def exit(self, value):
        raise NotebookExit(str(value))

    def run(self, path, timeout_seconds=0, arguments=None):
        raise NotImplementedError("dbutils.notebook.run is not simulated (it starts another notebook job); "
                                  "run the notebooks one after another on one dbsim cluster instead")

    @property
    def entry_point(self):
        return self._kernel.entry_point


class _Secrets:
    def __init__(self, secrets: dict):
        self._secrets = secrets

    def get(self, scope, key):
        try:
            return self._secrets[scope][key]
        except KeyError:
            raise KeyError(f"Secret does not exist with scope: {scope} and key: {key}") from None

    def getBytes(self, scope, key):
        return self.get(scope, key).encode()

    def list(self, scope):
        return [{"key": k} for k in self._secrets.get(scope, {})]

    def listScopes(self):
        return [{"name": s} for s in self._secrets]


class DBUtils:
    def __init__(self, kernel, widgets: _Widgets, dbfs_root: bool, secrets: dict):
        self.entry_point = kernel.entry_point
        self.widgets = widgets
        self.fs = _Fs(dbfs_root)
        self.library = _Library()
        self.notebook = _Notebook(kernel)
        self.secrets = _Secrets(secrets)

    def help(self, *_):
        print("dbutils (simulated): fs, library, notebook, secrets, widgets")

    def __repr__(self):
        return "<dbsim dbutils: fs, library, notebook, secrets, widgets>"


# ---------------------------------------------------------------- Spark


def attach_spark(create: bool, user: str | None = None):
    """The cluster's SparkContext (created by the first caller, attached to by every later Python
    process, as a Databricks notebook's Python attaches to the driver's JVM) and a SparkSession of our own
    sharing it (each notebook has its own session: SQL conf and temp views are per notebook)."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    gateway = launch_gateway()  # PYSPARK_GATEWAY_PORT/SECRET: the cluster's JVM, not a new one
    jvm = gateway.jvm
    # Scala's getOrCreate blocks while another process is constructing the context.
    scala_sc = jvm.org.apache.spark.SparkContext.getOrCreate()
    jsc = jvm.org.apache.spark.api.java.JavaSparkContext(scala_sc)
    sc = SparkContext(gateway=gateway, jsc=jsc)
    if create:
        return sc, None
    base = SparkSession(sc)
    spark = SparkSession(sc, jsparkSession=base._jsparkSession.newSession())
    SparkSession._instantiatedSession = spark
    SparkSession._activeSession = spark
    jvm.org.apache.spark.sql.SparkSession.setDefaultSession(spark._jsparkSession)
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    if user:  # `select current_user()` answers the notebook's user, as Databricks' does (this thread's JVM twin)
        jvm.org.apache.spark.sql.catalyst.CurrentUserContext.CURRENT_USER().set(user)
    return sc, spark


def wait_for_executors(sc, executors: int, timeout: float) -> None:
    """Until the cluster's executors have registered: a Databricks cluster is Running, and notebooks
    attach, once its workers are up."""
    want = executors + 1  # the driver counts as one
    deadline = time.monotonic() + timeout
    while sc._jsc.sc().getExecutorMemoryStatus().size() < want:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {sc._jsc.sc().getExecutorMemoryStatus().size() - 1} of {executors} executors "
                             f"registered in {timeout:.0f} s")
        time.sleep(0.1)


def bootstrap(spec: dict) -> None:
    """Create the cluster's SparkContext and wait until its executors have registered."""
    sc, _ = attach_spark(create=True)
    wait_for_executors(sc, int(spec["executors"]), float(spec["timeout"]))
    print(f"dbsim: SparkContext {sc.applicationId} up, {spec['executors']} executors, Spark {sc.version}", flush=True)
    with open(spec["done"], "w") as f:
        json.dump({"time": time.time()}, f)


# ---------------------------------------------------------------- display


def _display(*args, **kwargs):
    """Databricks' display(): here a text rendering. A Spark DataFrame shows its first rows as
    DataFrame.show does, a pandas DataFrame its head; anything else its repr."""
    for obj in args:
        module = type(obj).__module__ or ""
        if module.startswith("pyspark.sql") and hasattr(obj, "_jdf"):
            print(obj._jdf.showString(20, 20, False))
        elif module.startswith("pyspark.sql") and hasattr(obj, "show"):  # a Connect DataFrame
            obj.show(20)
        elif module.startswith("pandas") and hasattr(obj, "head") and hasattr(obj, "to_string"):
            print(obj.head(20).to_string())
        elif module.startswith("matplotlib") and hasattr(obj, "savefig"):
            print(f"<figure: {obj!r}>")
        else:
            print(repr(obj))


# ---------------------------------------------------------------- the REPL


_RUN_LINE = re.compile(r"""^\s*%run\s+(?P<target>"[^"]*"|'[^']*'|\S+)(?P<rest>.*)$""")
_MD_LINE = re.compile(r"^%md(?:-sandbox)?(?:\s|$)")
_CELL_MAGIC = re.compile(r"^%(?P<name>sh|python|sql|scala|r|fs)(?:\s|$)")
_PIP_FIRST = re.compile(r"^%pip(?:\s|$)")


class PipInsideRun(RuntimeError):
    """A %pip while a %run is in progress (the simulator refuses it: see Kernel._pip_magic)."""


class Kernel:
    def __init__(self, spec: dict):
        self.spec = spec
        self.events = Events(spec["events"])
        self.notebooks = spec["notebooks"]          # path -> [{"kind", "source"}]
        self.run_stack: list[str] = [spec["notebook"]]  # the notebook, then the %run targets in progress
        self.html: list[str] = []
        self.error_text = None
        # "line": %pip is a line magic (code may call it); "cell": only a command's first line runs it
        self.pip = spec.get("pip", "line")

    # -- namespace

    def start_shell(self):
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance(colors="NoColor")
        shell.run_line_magic("colors", "NoColor")
        shell._showtraceback = self._showtraceback
        shell.set_custom_exc((RestartPython, NotebookExit), self._control_flow)
        if self.pip == "cell":
            shell.magics_manager.magics["line"].pop("pip", None)  # IPython's own %pip goes too
            shell.register_magic_function(self._pip_cell_magic, magic_kind="cell", magic_name="pip")
        else:
            shell.register_magic_function(self._pip_magic, magic_kind="line", magic_name="pip")
        shell.register_magic_function(self._run_magic, magic_kind="line", magic_name="run")
        shell.register_magic_function(self._restart_magic, magic_kind="line", magic_name="restart_python")
        shell.register_magic_function(self._sh_magic, magic_kind="cell", magic_name="sh")
        shell.register_magic_function(self._sql_magic, magic_kind="cell", magic_name="sql")
        publish = shell.display_pub.publish

        def publish_html_too(data, *args, **kwargs):
            # IPython.display.display(HTML(...)) and friends: the HTML is what the notebook shows
            if isinstance(data, dict) and "text/html" in data:
                self.html.append(str(data["text/html"]))
            return publish(data, *args, **kwargs)

        shell.display_pub.publish = publish_html_too
        self.shell = shell
        return shell

    def define_globals(self, spark, sc):
        user = self.spec.get("user") or "sim-user@example.com"
        self.entry_point = _EntryPoint(user, posixpath.join(self.spec["cwd"], posixpath.basename(self.spec["notebook"])))
        widgets = _Widgets(self.spec["widgets"])
        self.dbutils = DBUtils(self, widgets, self.spec["dbfs_root"], self.spec.get("secrets") or {})
        self.shell.user_ns.update(
            spark=spark, sc=sc, dbutils=self.dbutils, display=_display, displayHTML=self._display_html,
            getArgument=widgets.getArgument, table=spark.table, sql=spark.sql)

    def _display_html(self, html):
        self.html.append(str(html))

    def _showtraceback(self, etype, evalue, stb):
        self.error_text = self.shell.InteractiveTB.stb2text(stb)

    def _control_flow(self, shell, etype, value, tb, tb_offset=None):
        return None  # restart / exit: no traceback, the kernel acts on error_in_exec

    # -- magics

    def _pip_magic(self, line):
        if len(self.run_stack) > 1:
            raise PipInsideRun(
                f"%pip {line.strip()} ran inside a %run target ({self.run_stack[-1]}, run from "
                f"{self.run_stack[0]}): the simulator refuses it, by the rule that no %pip and no restartPython "
                f"may run inside a %run target; put the install at the top of the calling notebook instead")
        args = shlex.split(line)
        cmd = [sys.executable, "-m", "pip", *args]
        if args and args[0] in ("install", "uninstall", "download", "wheel", "list", "freeze", "show"):
            cmd.insert(4, "--disable-pip-version-check")
        replay = _PipReplay.of(args)
        if replay is not None and replay.apply():
            res = subprocess.CompletedProcess(cmd, 0, replay.output)
        else:
            res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 stdin=subprocess.DEVNULL)
            if replay is not None and res.returncode == 0:
                replay.record(res.stdout)
        print(res.stdout, end="")
        importlib.invalidate_caches()
        if res.returncode != 0:
            raise subprocess.CalledProcessError(res.returncode, ["pip", *args], output=res.stdout)
        if args and args[0] in ("install", "uninstall"):
            print("Note: you may need to restart the kernel using %restart_python or "
                  "dbutils.library.restartPython() to use updated packages.")

    def _pip_cell_magic(self, line, cell):
        if cell.strip():
            raise SyntaxError("%pip must be alone in its command on this runtime; move the other lines to a "
                              "command of their own")
        self._pip_magic(line)

    def _restart_magic(self, line):
        raise RestartPython()

    def _sh_magic(self, line, cell):
        res = subprocess.run(["/bin/bash", "-c", cell], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, stdin=subprocess.DEVNULL)
        print(res.stdout, end="")
        if res.returncode != 0:
            raise subprocess.CalledProcessError(res.returncode, ["/bin/bash", "-c", "<%sh command>"],
                                                output=res.stdout)

    def _sql_magic(self, line, cell):
        spark = self.shell.user_ns["spark"]
        df = None
        for statement in (s.strip() for s in cell.split(";")):
            if statement:
                df = spark.sql(statement)
        if df is not None:
            _display(df)

    def _run_magic(self, line):
        m = _RUN_LINE.match("%run " + line)
        target = m.group("target").strip("\"'") if m else line.strip()
        if m and m.group("rest").strip():
            raise NotImplementedError(f"%run {line}: passing widget values to a %run target is not simulated")
        here = posixpath.dirname(self.run_stack[-1])
        if target.startswith("/"):
            raise FileNotFoundError(f"Notebook not found: {target} (the simulator resolves only paths relative "
                                    f"to the notebook, inside the archive)")
        path = posixpath.normpath(posixpath.join(here, target))
        if path not in self.notebooks:
            raise FileNotFoundError(f"Notebook not found: {target} (resolved to {path}; the archive has "
                                    f"{', '.join(sorted(self.notebooks))})")
        self.run_stack.append(path)
        try:
            for i, cmd in enumerate(self.notebooks[path], start=1):
                if cmd["kind"] != "code":
                    continue
                self._exec_nested(cmd["source"], f"<{path} command {i}>")
        finally:
            self.run_stack.pop()

    # -- running commands

    def _databricks_source(self, source: str) -> str:
        """A command's text as IPython runs it: Databricks' first-line cell magics (%sh, %sql, %python, and
        %pip where it is one) become IPython ones; %scala, %r and %fs are refused."""
        text = source.lstrip("\n")
        first, _, rest = text.partition("\n")
        if self.pip == "cell" and _PIP_FIRST.match(first):  # IPython's %%pip would refuse an empty body
            return f"get_ipython().find_cell_magic('pip')({first[len('%pip'):].strip()!r}, {rest!r})"
        m = _CELL_MAGIC.match(first)
        if not m:
            return source
        name = m.group("name")
        if name == "python":
            return rest
        if name in ("sh", "sql"):
            return f"%%{name}\n{rest}"
        raise NotImplementedError(f"%{name} commands are not simulated (Python notebooks only)")

    @staticmethod
    def _check_run_alone(source: str) -> None:
        lines = [ln for ln in source.splitlines() if ln.strip()]
        if any(_RUN_LINE.match(ln) for ln in lines) and len(lines) > 1:
            raise SyntaxError("%run must be alone in its command: Databricks runs a %run only when it is the "
                              "only line of the cell; move the other lines to their own cell")

    def _exec_nested(self, source: str, filename: str) -> None:
        """One command of a %run target, in the caller's namespace: magics work, the last expression
        is displayed, an exception propagates to the %run command."""
        self._check_run_alone(source)
        shell = self.shell
        cell = shell.transform_cell(self._databricks_source(source))
        linecache.cache[filename] = (len(cell), None, cell.splitlines(True), filename)  # tracebacks show lines
        tree = ast.parse(cell, filename)
        body, last = tree.body, None
        if body and isinstance(body[-1], ast.Expr):
            body, last = body[:-1], body[-1]
        ns = shell.user_ns
        exec(compile(ast.Module(body=body, type_ignores=[]), filename, "exec"), ns, ns)
        if last is not None:
            exec(compile(ast.Interactive(body=[last]), filename, "single"), ns, ns)

    def run_command(self, index: int, source: str) -> dict:
        """Run one top-level command: the record of what the user sees under it."""
        first_line = source.lstrip("\n").partition("\n")[0]
        self.events.write(event="begin", index=index, first_line=first_line, time=time.time())
        out, err = Tee(sys.__stdout__), Tee(sys.__stderr__)
        self.html, self.error_text = [], None
        start = time.monotonic()
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        status, error = "ok", None
        try:
            try:
                self._check_run_alone(source)
                code = self._databricks_source(source)
            except (SyntaxError, NotImplementedError) as e:
                result_error = e
                self.error_text = "".join(traceback.format_exception_only(type(e), e))
            else:
                result = self.shell.run_cell(code, store_history=True)
                result_error = result.error_before_exec or result.error_in_exec
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = saved
        if isinstance(result_error, RestartPython):
            status = "restart"
        elif isinstance(result_error, NotebookExit):
            status, error = "exit", {"exit_value": result_error.value}
        elif result_error is not None:
            status = "failed"
            error = {"type": type(result_error).__name__, "message": str(result_error),
                     "traceback": self.error_text
                     or "".join(traceback.format_exception(type(result_error), result_error,
                                                           result_error.__traceback__))}
        record = dict(event="command", index=index, first_line=first_line, status=status,
                      stdout=out.getvalue(), stderr=err.getvalue(), html=self.html,
                      seconds=round(time.monotonic() - start, 3), error=error)
        self.events.write(**record)
        return record


def run_all(spec: dict) -> int:
    kernel = Kernel(spec)
    kernel.events.write(event="start", process=spec["process"], pid=os.getpid(), time=time.time())
    shell = kernel.start_shell()
    _, spark = attach_spark(create=False, user=spec.get("user"))
    wait_for_executors(spark.sparkContext, int(spec["executors"]), float(spec["timeout"]))
    kernel.define_globals(spark, spark.sparkContext)
    commands = spec["notebooks"][spec["notebook"]]
    reason, next_index = "done", len(commands)
    for i in range(spec["start"], len(commands)):
        cmd = commands[i]
        if cmd["kind"] != "code" or _MD_LINE.match(cmd["source"].lstrip("\n")):
            continue
        record = kernel.run_command(i, cmd["source"])
        if record["status"] != "ok":
            reason = {"failed": "failed", "restart": "restart", "exit": "exit"}[record["status"]]
            next_index = i + 1
            break
    kernel.events.write(event="end", reason=reason, next=next_index, time=time.time())
    del shell
    return 0


def _finish(code: int) -> None:
    """Leave as a restarted or detached Databricks REPL does: atexit handlers run (bounded), threads the
    notebook left running do not hold the process, the cluster's SparkContext is not stopped."""
    timer = threading.Timer(20.0, lambda: os._exit(code))
    timer.daemon = True
    timer.start()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
    finally:
        os._exit(code)


def main(argv: list[str]) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path.pop(0)  # the kernel's own folder is not the notebook's
    boot = argv[:1] == ["--bootstrap"]
    with open(argv[-1], encoding="utf-8") as f:
        spec = json.load(f)
    if boot:
        bootstrap(spec)
        os._exit(0)  # leave the SparkContext running: it is the cluster's
    os.chdir(spec["cwd"])
    sys.path.insert(0, spec["cwd"])  # Databricks puts the notebook's folder on sys.path
    try:
        code = run_all(spec)
    except BaseException:
        traceback.print_exc()
        code = 70
    try:  # the REPL ends: jobs it left running on the shared cluster end with it
        from pyspark import SparkContext

        if SparkContext._active_spark_context is not None:
            SparkContext._active_spark_context.cancelAllJobs()
    except Exception:
        pass
    _finish(code)


if __name__ == "__main__":
    main(sys.argv[1:])
