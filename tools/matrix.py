"""The version matrix: ``./dev matrix`` trains tools/matrix_check.py in every cell and writes docs/compatibility.md.

A cell is one Python + TensorFlow + Spark base virtualenv (cached under ``~/.cache/tfnb-matrix``, built once
with tests/components.py ``cached_venv``) with one Keras version laid over it (``pip install --no-deps --target``,
put first on PYTHONPATH) or tf.keras as tf-keras (``legacy_keras``); an MLflow cell also starts a tracking server
from a virtualenv of its own (MLflow 2 and 3 need other packages than the cell's client). tfnb itself comes from this
checkout (PYTHONPATH, also for Spark's Python workers). The cells are a covering set, not the cross product: every
accepted Keras minor (its newest patch), TensorFlow minor, Spark minor, Python and MLflow major trains in at least
one cell, each Keras beside a TensorFlow whose pins allow it.

    ./dev matrix                 every cell, two at a time; rewrites docs/compatibility.md
    ./dev matrix --only 3.6,B-   the cells whose name contains 3.6 or B- (the others keep their committed row)
    ./dev matrix --build         only build the cached virtualenvs
    ./dev matrix --list          list the cells
    ./dev matrix --render        rewrite the page from its own data (after a change of tfnb/_deps.py or setup.cfg)

Exit status: 1 when a cell that is ✓ in the committed table is ✗ now (a regression), else 0.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

CACHE = Path(os.environ.get("TFNB_MATRIX_CACHE", Path.home() / ".cache" / "tfnb-matrix"))
PYENV = Path.home() / ".pyenv" / "versions"
DOC = ROOT / "docs" / "compatibility.md"
# tfnb's own requirements (setup.cfg install_requires), in every base
TFNB_REQS = ["cloudpickle>=2.2", "boto3>=1.28", "fsspec>=2023.5", "ipywidgets>=7.6", "tqdm>=4.60"]


@dataclass(frozen=True)
class Base:
    """One cached virtualenv: a Python, a TensorFlow, a Spark (and what they need)."""

    name: str
    python: str  # "3.11" (pyenv's newest patch of it) or "project" (this checkout's .venv)
    requirements: tuple[str, ...] = ()

    def interpreter(self) -> str:
        if self.python == "project":
            return str(ROOT / ".venv" / "bin" / "python")
        for cand in sorted(PYENV.glob(f"{self.python}.*/bin/python{self.python}"), reverse=True):
            return str(cand)
        found = shutil.which(f"python{self.python}")
        if not found:
            raise RuntimeError(f"no Python {self.python}: pyenv install {self.python}")
        return found

    def python_path(self) -> Path:
        """bin/python of the base (built if missing)."""
        if self.python == "project":
            return ROOT / ".venv" / "bin" / "python"
        from components import cached_venv

        return cached_venv(CACHE, list(self.requirements), python=self.interpreter()) / "bin" / "python"


# numpy: TF 2.16/2.17 pin NumPy < 2, and pyarrow from 18 on needs NumPy >= 2 at import: pyarrow 16.1 beside 1.26.
BASES = {
    "A": Base("A", "3.11", ("tensorflow==2.16.2", "keras==3.3.3", "tf-keras==2.16.0", "pyspark==3.5.9",
                            "numpy==1.26.4", "pandas==2.1.4", "pyarrow==16.1.0", "scikit-learn==1.5.2",
                            "mlflow-skinny==2.21.3", *TFNB_REQS)),
    "B": Base("B", "3.10", ("tensorflow==2.17.1", "keras==3.7.0", "pyspark==4.0.5", "numpy==1.26.4",
                            "pandas==2.2.3", "pyarrow==16.1.0", "scikit-learn==1.5.2", *TFNB_REQS)),
    "C": Base("C", "3.12", ("tensorflow==2.18.1", "keras==3.9.2", "pyspark==4.1.4", "numpy==2.0.2",
                            "pandas==2.2.3", "pyarrow==19.0.1", "scikit-learn==1.6.1", *TFNB_REQS)),
    "D": Base("D", "3.12", ("tensorflow==2.19.1", "keras==3.11.3", "pyspark==4.2.1", "numpy==2.1.3",
                            "pandas==2.2.3", "pyarrow==21.0.0", "scikit-learn==1.7.2", *TFNB_REQS)),
    "E": Base("E", "3.13", ("tensorflow==2.20.0", "keras==3.13.2", "pyspark==4.3.0", "numpy==2.3.5",
                            "pandas==2.3.3", "pyarrow==22.0.0", "scikit-learn==1.7.2", *TFNB_REQS)),
    # the project's own .venv (constraints.txt): Python 3.11, TensorFlow 2.21, Spark 4.3, Keras 3.15, tf-keras,
    # MLflow 3
    "F": Base("F", "project"),
}
# Databricks Runtime 16.4 LTS ML's MLflow, and the suite's; SQLAlchemy 2.1 dropped a pool class MLflow 2 imports
MLFLOW_SERVERS = {"2": ("3.11", ("mlflow==2.21.3", "sqlalchemy<2.1")), "3": ("3.11", ("mlflow==3.17.2",))}


@dataclass(frozen=True)
class Cell:
    """One row of the table: a base, the Keras laid over it (None: the base's own), and what else it checks."""

    base: str
    keras: str | None = None  # a Keras release laid over the base (pip --target, first on PYTHONPATH)
    legacy: bool = False  # tf.keras as tf-keras (tfnb.run legacy_keras=True) instead of Keras 3
    mlflow: str | None = None  # MLflow major whose server the 2-worker run logs to
    plain: bool = False  # Keras alone under MirroredStrategy, no tfnb: must fail where Keras is off by a factor
    workers: str = "2,4"

    @property
    def name(self) -> str:
        what = "tf-keras" if self.legacy else f"keras-{self.keras or BASE_KERAS[self.base]}"
        mlflow = f"-mlflow{self.mlflow}" if self.mlflow else ""
        return ("plain-" if self.plain else "") + f"{self.base}-{what}{mlflow}"


BASE_KERAS = {"A": "3.3.3", "B": "3.7.0", "C": "3.9.2", "D": "3.11.3", "E": "3.13.2", "F": "3.15.1"}
# A covering set: every accepted Keras minor (newest patch), TensorFlow minor, Spark minor, Python, tf-keras and
# MLflow major trains in at least one cell; each Keras sits on a TensorFlow whose pins allow it.
CELLS = [
    Cell("A", mlflow="2"), Cell("A", "3.4.1"), Cell("A", "3.5.0"), Cell("A", "3.6.0"), Cell("A", legacy=True),
    Cell("B"), Cell("B", "3.8.0"),
    Cell("C"), Cell("C", "3.10.0"),
    Cell("D"), Cell("D", "3.12.4"),
    Cell("E"), Cell("E", "3.14.1"),
    Cell("F", mlflow="3"), Cell("F", legacy=True),
]
# The check's own check: Keras 3.6.0 alone applies 2.0x the update under a strategy; the check must say so.
PLAIN = [Cell("A", "3.6.0", plain=True, workers="")]


def mlflow_server_python(major: str) -> Path:
    from components import cached_venv

    py, reqs = MLFLOW_SERVERS[major]
    from environments import MLFLOW_SERVER, mlflow_server_venv

    if list(reqs) == MLFLOW_SERVER:  # the suite's own server
        return mlflow_server_venv() / "bin" / "python"
    return cached_venv(CACHE / "mlflow-server", list(reqs), python=Base("s", py).interpreter()) / "bin" / "python"


def keras_overlay(version: str, python: Path) -> Path:
    """A folder holding only Keras ``version`` (pure Python, the same for every interpreter), built once."""
    import fcntl

    target = CACHE / "keras" / version
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{target}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "ready").is_file():
            shutil.rmtree(target, ignore_errors=True)
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            res = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                                  "--target", str(target), f"keras=={version}"],
                                 capture_output=True, text=True, env=env)
            if res.returncode != 0:
                raise RuntimeError(f"pip install keras=={version} failed: {res.stderr[-2000:]}")
            (target / "ready").write_text("")
    return target


def build(parallel: int = 2) -> None:
    """Build every cached virtualenv that is missing, ``parallel`` at a time."""
    jobs = [(b.name, b.python_path) for b in BASES.values()] + [
        (f"mlflow-server-{m}", (lambda m=m: mlflow_server_python(m))) for m in MLFLOW_SERVERS]

    def one(job):
        name, fn = job
        start = time.monotonic()
        try:
            path = fn()
            print(f"[matrix] {name}: {path} ({time.monotonic() - start:.0f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - reported, the others go on
            print(f"[matrix] {name} FAILED: {e}", flush=True)

    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(one, jobs))


_running: set[int] = set()


def run_cell(cell: Cell, timeout: float) -> dict:
    """Run tools/matrix_check.py in ``cell``; its JSON result, with ``ok`` False and a reason when it broke."""
    start = time.monotonic()
    row = {"cell": cell.name, "base": cell.base, "legacy": cell.legacy, "plain": cell.plain,
           "date": _dt.date.today().isoformat()}
    try:
        python = BASES[cell.base].python_path()
        path = [str(keras_overlay(cell.keras, python))] if cell.keras else []
        args = [str(python), str(ROOT / "tools" / "matrix_check.py")]
        if cell.plain:
            args.append("--plain")
        else:
            args += ["--workers", cell.workers]
        if cell.legacy:
            args.append("--legacy")
        if cell.mlflow:
            args += ["--mlflow", str(mlflow_server_python(cell.mlflow))]
    except Exception as e:  # noqa: BLE001 - the cell's result
        return {**row, "ok": False, "reason": f"environment: {str(e)[-600:]}", "checks": [], "versions": {}}
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "MLFLOW_TRACKING_URI", "PYTHONHOME")}
    env.update(PYTHONPATH=os.pathsep.join([*path, str(ROOT)]), PYSPARK_PYTHON=str(python),
               PYSPARK_DRIVER_PYTHON=str(python), TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    log_path = CACHE / "logs" / f"{cell.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tfnb-matrix-") as cwd, open(log_path, "w") as log:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                                start_new_session=True)
        _running.add(proc.pid)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            out += "\n" + json.dumps({"ok": False, "reason": f"timed out after {timeout:.0f} s", "checks": []})
        finally:
            _running.discard(proc.pid)
            with contextlib.suppress(ProcessLookupError):  # nothing of the cell outlives it
                os.killpg(proc.pid, signal.SIGKILL)
        log.write(out)
    result = None
    for line in reversed(out.strip().splitlines()):
        with contextlib.suppress(ValueError):
            result = json.loads(line)
            break
    if not isinstance(result, dict):
        tail = log_path.read_text()[-600:]
        result = {"ok": False, "reason": f"exit {proc.returncode} without a result: {tail}", "checks": []}
    result.setdefault("versions", {})
    return {**row, **result, "seconds": round(time.monotonic() - start), "log": str(log_path)}


# ------------------------------------------------------------------------------------------------ the page

MARK = "<!-- tfnb-matrix "


def _data() -> dict:
    if not DOC.is_file():
        return {}
    text = DOC.read_text()
    i = text.find(MARK)
    data = json.loads(text[i + len(MARK):text.index("-->", i)]) if i >= 0 else {}
    return {"rows": data} if isinstance(data, list) else data


def committed() -> dict[str, dict]:
    """The rows of the committed page, by cell name (from the data block at its end)."""
    return {r["cell"]: r for r in _data().get("rows", [])}


def accepted() -> dict[str, str]:
    """What tfnb accepts on each axis, from tfnb/_deps.py and setup.cfg (tests/test_matrix.py holds the page to it)."""
    import configparser

    from tfnb import _deps

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    mlflow = re.search(r"mlflow-skinny>=([\d.]+)", cfg["options.extras_require"]["mlflow"]).group(1)
    v = lambda t: ".".join(map(str, t))  # noqa: E731
    return {"Python": cfg["options"]["python_requires"].strip(),
            "TensorFlow": f">={v(_deps.TENSORFLOW_FLOOR)}, tested to {v(_deps.TESTED_NEWEST['tensorflow'])}",
            "Keras": f"{v(_deps.KERAS_FLOOR)} to {v(_deps.TESTED_NEWEST['keras'])}",
            "Spark": f">={v(_deps.SPARK_FLOOR)}, tested to {v(_deps.TESTED_NEWEST['spark'])}",
            "tf-keras": "the release matching TensorFlow (legacy_keras)",
            "MLflow": f">={mlflow} (2.x and 3.x)"}


def render(rows: list[dict], full_run: dict | None) -> str:
    acc = accepted()
    when = (f"The last run of the whole matrix started {full_run['started']} and took {full_run['minutes']} min"
            if full_run else "The whole matrix has not run in one go yet: each row was measured by a run of its own")
    lines = [
        "# Compatibility", "",
        "Which versions tfnb trains on, as `./dev matrix` (tools/matrix.py) measured them on a 2-core Linux machine.",
        f"{when}; each row carries the date it was measured.", "",
        "Every accepted version of every axis trains in at least one cell; the cells are a covering set, not the",
        "cross product.", "",
        "## Accepted ranges", "",
        "| Axis | Accepted | Where it is set |", "|---|---|---|",
        f"| Python | `{acc['Python']}` | setup.cfg `python_requires` |",
        f"| TensorFlow | {acc['TensorFlow']} | tfnb/_deps.py `TENSORFLOW_FLOOR`, `TESTED_NEWEST` |",
        f"| Keras | {acc['Keras']} | tfnb/_deps.py `KERAS_FLOOR`, `TESTED_NEWEST` |",
        f"| Spark | {acc['Spark']} | tfnb/_deps.py `SPARK_FLOOR`, `TESTED_NEWEST` |",
        f"| tf-keras | {acc['tf-keras']} | `tfnb[tf-keras]` |",
        f"| MLflow | {acc['MLflow']} | `tfnb[mlflow]` |", "",
        "A Keras newer than the newest tested one is not refused: a self-check trains one step three ways at the first",
        "`fit` under a strategy and stops the run if it differs from one process ([Keras 3](keras3.md)).", "",
        "## What each cell checks", "",
        "tools/matrix_check.py, through the real `tfnb.run` on local Spark (`local[N]`), N = 2 and 4 workers under",
        "MultiWorkerMirroredStrategy: scikit-learn's digits, a 64-32-10 MLP, plain SGD (learning rate 0.1, so an update",
        "N times too large shows), fixed seeds, global batches of 64 rows, 2 epochs (16 steps), each way from the same",
        "initial weights:", "",
        "- **fit**, then **evaluate** and **predict** on 200 held-out rows;",
        "- a **custom loop**: `strategy.run` of a step with `tf.nn.compute_average_loss` over the global batch and",
        "  `optimizer.apply_gradients`, over `strategy.experimental_distribute_dataset`;",
        "- **train_on_batch**, every worker passing its share of each global batch (with tf-keras, which splits the",
        "  arrays between the workers itself, the whole global batch).", "",
        "A cell passes when, for every way, every worker's weights equal each other's (to 1e-6) and equal one process's",
        "over the same global batches without a strategy (to 1e-5); the per-epoch loss and accuracy of `fit`, the",
        "per-epoch loss of the custom loop and every `train_on_batch` loss equal the one-process values (to 1e-5);",
        "`evaluate` gives the one-process values on every worker; `predict` returns all 200 rows in order. An MLflow",
        "cell also runs its 2-worker run with `mlflow=` against a real `mlflow server` on loopback and checks the run",
        "finished with one `loss` point per epoch equal to the one-process loss.", "",
        "## Cells", "",
        "| Python | TensorFlow | Keras | Spark | tf-keras | MLflow | workers | checks | result |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def cells(rs):
        out = []
        for r in rs:
            v = r.get("versions", {})
            keras = "—" if r.get("legacy") else v.get("keras", "?")
            tfk = v.get("tf-keras", "—") if r.get("legacy") else "—"
            mlflow = v.get("mlflow-skinny", v.get("mlflow", "—")) if any("MLflow" in c for c in r.get("checks", [])) \
                or "-mlflow" in r["cell"] else "—"
            workers = ", ".join(sorted({c.split(" ")[0] for c in r.get("checks", []) if "workers" in c})) or \
                ("1 (2 replicas)" if r.get("plain") else "—")
            checks = "; ".join(c.split(": ", 1)[-1] if "workers" in c else c for c in r.get("checks", [])[:1]) + \
                ("; MLflow server run" if any("MLflow" in c for c in r.get("checks", [])) else "")
            if r.get("ok"):
                result = f"✓ {r['date']}"
            else:
                result = "✗ " + r.get("reason", "?").replace("|", "/").replace("\n", " ")[:300] + f" ({r['date']})"
            spark = "—" if r.get("plain") else v.get("pyspark", "?")
            out.append(f"| {v.get('python', '?')} | {v.get('tensorflow', '?')} | {keras} | {spark} | "
                       f"{tfk} | {mlflow} | {workers} | {checks or '—'} | {result} |")
        return out

    lines += cells([r for r in rows if not r.get("plain")])
    if any(not r.get("ok") for r in rows if not r.get("plain")):
        lines += ["", "A ✗ row is what the check measured there: a defect not corrected yet, or a cell that broke; its",
                  "log is under `~/.cache/tfnb-matrix/logs/` after `./dev matrix --only` that cell."]
    plain = [r for r in rows if r.get("plain")]
    if plain:
        lines += ["", "## The check catches a scale error", "",
                  "The same check with Keras alone (`--plain`: no tfnb, `MirroredStrategy` over 2 logical CPU devices in",
                  "one process). Keras 3.4 to 3.7 sum the replicas' gradients without dividing the loss by their count,",
                  "so this row must be ✗ with about 2x the one-process update; under `tfnb.run` the same Keras is ✓",
                  "above.", "",
                  "| Python | TensorFlow | Keras | Spark | tf-keras | MLflow | workers | checks | result |",
                  "|---|---|---|---|---|---|---|---|---|"]
        lines += cells(plain)
    lines += ["", "Rerun: `./dev matrix` (all cells, two at a time; cached virtualenvs under `~/.cache/tfnb-matrix`),",
              "`./dev matrix --only 3.6` (the cells whose name holds `3.6`; `--list` shows the names). It exits non-zero",
              "when a cell that is ✓ here fails.", "",
              MARK + json.dumps({"full_run": full_run, "rows": [
                  {k: r[k] for k in ("cell", "ok", "reason", "date", "checks", "versions", "legacy", "plain", "seconds")
                   if k in r} for r in rows]}, indent=0) + " -->", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="tfnb's version matrix (docs/compatibility.md)")
    p.add_argument("--only", metavar="PATTERN",
                   help="run only the cells whose name contains PATTERN (several: comma separated)")
    p.add_argument("--build", action="store_true", help="only build the cached virtualenvs")
    p.add_argument("--list", action="store_true", help="list the cells")
    p.add_argument("--parallel", type=int, default=2, help="cells at a time (default 2)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per cell (default 1800)")
    p.add_argument("--no-write", action="store_true", help="do not rewrite docs/compatibility.md")
    p.add_argument("--render", action="store_true", help="rewrite docs/compatibility.md from its own data, run nothing")
    a = p.parse_args(argv)
    every = CELLS + PLAIN
    if a.list:
        for c in every:
            print(c.name)
        return 0
    if a.build:
        build(a.parallel)
        return 0
    if a.render:
        now = committed()
        DOC.write_text(render([now[c.name] for c in every if c.name in now], _data().get("full_run")))
        return 0
    patterns = a.only.split(",") if a.only else [""]
    chosen = [c for c in every if any(pat in c.name for pat in patterns)]
    if not chosen:
        print(f"[matrix] no cell matches {a.only!r}; ./dev matrix --list", file=sys.stderr)
        return 2
    before = committed()
    started = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.monotonic()
    lock = threading.Lock()

    def one(cell):
        with lock:
            print(f"[matrix] {cell.name}: running", flush=True)
        r = run_cell(cell, a.timeout)
        with lock:
            said = "✓" if r["ok"] else "✗ " + r["reason"][:300]
            print(f"[matrix] {cell.name}: {said} ({r['seconds']} s)", flush=True)
        return r

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    pool = ThreadPoolExecutor(max(1, a.parallel))
    try:
        results = {r["cell"]: r for r in pool.map(one, chosen)}
    except KeyboardInterrupt:  # the cells' process groups (their Spark JVMs and workers among them) go too
        pool.shutdown(wait=False, cancel_futures=True)
        for pid in list(_running):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        raise
    pool.shutdown()
    seconds = time.monotonic() - t0
    print(f"[matrix] {len(results)} cells in {seconds / 60:.1f} min", flush=True)
    if not a.no_write:
        # a cell run now replaces its row on the page; the others keep theirs (read now: another run may have written)
        now = committed()
        rows = [r for r in (results.get(c.name) or now.get(c.name) for c in every) if r]
        full_run = {"started": started, "minutes": round(seconds / 60)} if not a.only else _data().get("full_run")
        DOC.write_text(render(rows, full_run))
        print(f"[matrix] wrote {DOC.relative_to(ROOT)}", flush=True)
    # the plain cell's ✗ is its pass: it shows the check catches a scale error
    regressed = [n for n, r in results.items() if not r["ok"] and before.get(n, {}).get("ok") and not r.get("plain")]
    plain_missed = [n for n, r in results.items() if r.get("plain") and r["ok"]]
    for n in regressed:
        print(f"[matrix] REGRESSION {n}: {results[n]['reason']}", file=sys.stderr)
    for n in plain_missed:
        print(f"[matrix] {n}: the check did not catch Keras' scale error", file=sys.stderr)
    return 1 if regressed or plain_missed else 0


if __name__ == "__main__":
    sys.exit(main())
