"""Profiled runs that must not crash: N short 2-worker runs with ``profile_steps``, crashes and traces counted.

Each run is ``tfnb.run(keras_fit, num_workers=2, profile_steps=..., log_dir=..., max_attempts=1)`` on
local[2] (tf-keras MultiWorkerMirroredStrategy, 8 steps; tests/test_profile.py ``keras_fit``), one Spark
session for all. A run whose train_fn process dies (SIGSEGV, SIGABRT) counts as a crash. Prints, per
run and in total: crashes, the traces written per host, the warnings the workers logged about the profiler.
``--all-workers`` makes every worker trace every step asked for, as tfnb did before it left out the workers
whose collectives another task leads and the chief's first step: the baseline, and the probe that says
whether a newer TensorFlow still crashes there (tfnb/_task/profiling.py ``collective_role``).
Ratio: profiled runs that finished, over runs (goal 1.0).

    ./dev bench profiler [--runs 20] [--steps 3 5] [--all-workers]

(Not ``profile.py``: that name would shadow the standard library's ``profile``, which ``cProfile`` and so
``pyspark`` import.)
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, report, session, use_checkout

use_checkout()
# fit (shipped by value) imports keras_fit from tests/ in the train_fn processes
TESTS = os.path.join(ROOT, "tests")
sys.path.insert(1, TESTS)
os.environ["PYTHONPATH"] = os.pathsep.join([TESTS, os.environ["PYTHONPATH"]])


def fit(ctx, all_workers: bool):
    """tests/test_profile.py's ``keras_fit``; with ``all_workers``, no worker or step is left out of tracing."""
    from test_profile import keras_fit

    if all_workers:
        from tfnb._task import profiling

        profiling.collective_role = lambda tf_config: ""
    return keras_fit(ctx)


def one_run(spark, steps: tuple[int, int], all_workers: bool) -> dict:
    import tfnb
    from tfnb.errors import WorkerError

    lines = []

    def display(event):
        line = event.data.get("line", "") if event.kind == "log" else ""
        if "Fatal Python error" in line or "profiler_v2.py" in line or (line.startswith("tfnb:") and "profil" in line):
            lines.append(f"{event.label}: {line.strip()}")

    log_dir = Path(tempfile.mkdtemp(prefix="tfnb-bench-profiler-"))
    out = {"crash": "", "seconds": 0.0}
    start = time.monotonic()
    try:
        tfnb.run(fit, num_workers=2, args=(all_workers,), spark=spark, log_dir=str(log_dir), profile_steps=steps,
                 max_attempts=1, timeout=600, display=display)
    except WorkerError as e:
        out["crash"] = f"{e.failure.label}: {e.failure.message}" if e.failure.died else ""
        if not out["crash"]:
            raise
    out["seconds"] = time.monotonic() - start
    out["traces"] = sorted(p.name.removesuffix(".xplane.pb") for p in log_dir.rglob("*.xplane.pb"))
    shutil.rmtree(log_dir, ignore_errors=True)
    out["lines"] = lines
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, nargs=2, default=(3, 5), metavar=("FIRST", "LAST"))
    parser.add_argument("--all-workers", action="store_true", help="every worker traces (the unguarded baseline)")
    args = parser.parse_args()
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    spark = session("local[2]", "tfnb-bench-profiler")
    results = []
    try:
        for i in range(args.runs):
            r = one_run(spark, tuple(args.steps), args.all_workers)
            results.append(r)
            print(f"run {i + 1:3}: {r['seconds']:5.1f} s, traces {','.join(r['traces']) or '-':24} "
                  f"{'CRASH ' + r['crash'] if r['crash'] else 'finished'}", flush=True)
            for line in r["lines"]:
                print(f"          {line[:220]}")
    finally:
        spark.stop()
    crashes = sum(bool(r["crash"]) for r in results)
    hosts = collections.Counter(t for r in results for t in r["traces"])
    mode = "every worker traces" if args.all_workers else "tfnb's choice of tracers"
    print(f"\nbench/profiler: {args.runs} runs, 2 workers on local[2], profile_steps={tuple(args.steps)}, {mode}")
    print(f"  crashes {crashes} of {args.runs}; traces written: "
          + (", ".join(f"{h} {n}" for h, n in sorted(hosts.items())) or "none"))
    report("profiler", {"profiled runs finished": (args.runs - crashes) / args.runs},
           {"profiled runs finished": 1.0}, crashes=crashes, runs=args.runs, traces=dict(hosts),
           all_workers=args.all_workers)


if __name__ == "__main__":
    main()
