"""What every bench shares: this checkout on the path, a quiet Spark session, medians, the RESULT line, and a
standalone cluster whose nodes come and go (:class:`Standalone`).

A bench ends with :func:`report`, one ``RESULT {json}`` line holding its ratios and goals (and any
table it wants in ``bench/results.md``); ``bench/all.py`` reads that line, writes the table and the chart.
Each ratio compares tfnb with an anchor measured in the same run, interleaved with it round by round,
and is the median over the rounds: on a shared machine one round proves little.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def use_checkout() -> None:
    """This checkout's tfnb, in the bench and in the Spark executors it starts."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, here] + [p for p in paths if p not in (ROOT, here)])


def session(master: str, name: str, **conf):
    """A Spark session without UI or progress bars; ``conf`` keys use ``_`` for ``.`` after ``spark``."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(name)
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def tfos_available(skip: bool) -> bool:
    """Whether TensorFlowOnSpark, the comparison some benches keep, can run; when not, say how to install it."""
    if skip:
        return False
    try:
        import tensorflowonspark  # noqa: F401
    except ImportError:
        print("TensorFlowOnSpark is not installed; for the comparison run\n"
              "    .venv/bin/pip install tensorflowonspark==2.2.5 --no-deps\n"
              "(continuing without it)", file=sys.stderr)
        return False
    return True


def median(values) -> float:
    return statistics.median(values)


def spread(values) -> str:
    """``median [min-max]`` of a ratio over the rounds."""
    return f"{median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def report(bench: str, ratios: dict, goals: dict, **extra) -> None:
    """Print the RESULT line ``bench/all.py`` reads: ratios (medians), their goals, and extra facts.

    ``extra["tables"]`` may hold ``{title: [header, row, ...]}``: all.py copies them into results.md.
    """
    print("RESULT " + json.dumps({"bench": bench, "ratios": {k: round(v, 3) for k, v in ratios.items()},
                                  "goals": goals, **extra}), flush=True)


class Standalone:
    """A standalone master and one-core Worker daemons from the pip pyspark that a bench adds, loses and
    decommissions one at a time, like a cloud cluster's nodes. Daemons run in their own sessions and are
    stopped by process group in :meth:`close`.

    ``marker`` is set in every daemon's environment, so each process of this cluster (executors, their
    Python workers and tfnb's processes) carries it in ``/proc/PID/environ``.
    """

    def __init__(self, folder: str):
        import pyspark

        self.folder, self.home = folder, os.path.dirname(pyspark.__file__)
        self.marker = f"TFNB_BENCH_CLUSTER={folder}"
        self.env = dict(os.environ, SPARK_HOME=self.home, SPARK_LOG_DIR=os.path.join(folder, "logs"),
                        SPARK_WORKER_DIR=os.path.join(folder, "work"), TFNB_BENCH_CLUSTER=folder,
                        # a Worker daemon told SIGPWR decommissions itself and its executors (a spot node's notice)
                        SPARK_WORKER_OPTS="-Dspark.decommission.enabled=true")
        self.procs: list = []
        self.port, self.ui = _free_port(), _free_port()
        self._start("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                  "--port", str(self.port), "--webui-port", str(self.ui))
        self.url = f"spark://127.0.0.1:{self.port}"
        self.workers: list = []  # the Worker daemons not lost yet
        self.wait_for(lambda: _listening(self.port), 60, "the standalone master did not listen")

    def _start(self, *args):
        log = open(os.path.join(self.folder, f"daemon-{len(self.procs)}.log"), "w")
        proc = subprocess.Popen([os.path.join(self.home, "bin", "spark-class"), *args], env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def add_worker(self):
        """Start one more single-core Worker daemon (it registers with the master within seconds)."""
        worker = self._start("org.apache.spark.deploy.worker.Worker", "--cores", "1", "--memory", "1g",
                             "--host", "127.0.0.1", "--webui-port", str(_free_port()), self.url)
        self.workers.append(worker)
        return worker

    def executors_of(self, worker) -> list[int]:
        """The pids of the executor JVMs this Worker daemon runs."""
        return [pid for pid, (ppid, argv) in processes().items()
                if ppid == worker.pid and b"CoarseGrainedExecutorBackend" in argv]

    def lose(self, worker) -> None:
        """SIGKILL every process of a Worker daemon's node at once: the daemon, its executor JVMs, their Python
        workers, and tfnb's processes of those executors (which live in sessions of their own: a warm standby names
        its executor's Python daemon as its owner, the last word of its command line). A spot node gone."""
        table = processes()
        node, grew = {worker.pid}, True
        while grew:
            owners = {str(pid).encode() for pid in node}
            more = {pid for pid, (ppid, argv) in table.items() if pid not in node and (
                ppid in node or (b"tfnb._task.warm" in argv and argv.rstrip(b"\0").rsplit(b"\0", 1)[-1] in owners))}
            node |= more
            grew = bool(more)
        _kill(node)
        worker.wait()
        if worker in self.workers:
            self.workers.remove(worker)

    def decommission(self, worker) -> None:
        """SIGPWR to a Worker daemon: Spark's decommission signal, the notice a spot node gets before it goes."""
        os.kill(worker.pid, signal.SIGPWR)

    def alive_workers(self) -> int:
        """Worker daemons the master counts as alive (a decommissioned one is not)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json", timeout=5) as r:
                return int(json.load(r).get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def wait_for(self, what, timeout: float, why: str) -> None:
        end = time.monotonic() + timeout
        while not what():
            if time.monotonic() > end:
                raise TimeoutError(f"{why} within {timeout:g} s (daemon logs in {self.folder})")
            time.sleep(0.5)

    def session(self, name: str, cores: int, **conf):
        """A session on this cluster holding ``cores`` one-core executors, with decommissioning on."""
        spark = session(self.url, name, **{"spark.driver.host": "127.0.0.1", "spark.executor.memory": "768m",
                                           "spark.cores.max": str(cores), "spark.executor.cores": "1",
                                           "spark.decommission.enabled": "true", **conf})
        self.wait_for(lambda: executors(spark) >= cores, 180, f"{cores} executors did not register")
        return spark

    def close(self) -> None:
        _kill([p.pid for p in self.procs], group=True)
        for p in self.procs:
            p.wait()


def executors(spark) -> int:
    """Executors registered with this classic session (the driver left out)."""
    return spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1


def _kill(pids, group: bool = False) -> None:
    """SIGKILL each of ``pids`` (each one's process group with ``group``), gone ones skipped."""
    for pid in pids:
        try:
            (os.killpg if group else os.kill)(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def processes() -> dict[int, tuple[int, bytes]]:
    """pid -> (parent pid, command line as read from /proc, NUL-separated) of every process."""
    table = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                table[int(name)] = (ppid, f.read())
        except (OSError, ValueError, IndexError):
            continue
    return table


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
