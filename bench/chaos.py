"""Chaos trials on a real standalone cluster: kill an executor JVM, or the train_fn process, mid-epoch.

Starts a standalone master and two one-core workers from the pip pyspark (spark.cores.max=2, one executor
per worker: the cluster of issue 15), then runs N trials of each kind. A trial is a two-worker lock-step
"fit" without TensorFlow (tests/test_recovery.py ``chaos_fit``) that checkpoints its epoch count to
model_dir; on the first attempt one task dies at a point that rotates over the trials (start of step 0/1/2,
mid-step from another thread, between writing and publishing the checkpoint; chief and worker alternate).
``--kinds keras`` adds the reported case: tf-keras MultiWorkerMirroredStrategy with BackupAndRestore
losing worker 1's executor mid-epoch.

Prints per kind: recovered/N, seconds from the kill to the relaunch's first progress report (median, max),
epochs re-run per recovery (the interrupted one counts: goal <= 1), tfnb processes left after the runs.

    ./dev bench chaos [--trials 20] [--kinds executor,process]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, median, session, use_checkout

use_checkout()
# the executors import the trial functions from tests/ (they pickle by reference)
TESTS = os.path.join(ROOT, "tests")
sys.path.insert(1, TESTS)
os.environ["PYTHONPATH"] = os.pathsep.join([TESTS, os.environ["PYTHONPATH"]])
os.environ["TFNB_WARM"] = "0"  # measure recovery itself, not whether a standby happened to be waiting

POINTS = [0, "mid", "ckpt", 1, 2]  # where in the step the task dies, rotated over the trials
EPOCHS, STEPS = 3, 3


def _processes_left(model_dir: Path) -> int:
    """train_fn processes of this trial's run still alive 10 s after it returned (other runs on the
    machine are not counted: a process is this run's when its work folder names the run id)."""
    from conftest import child_processes

    try:
        run_id = json.loads((model_dir / "tfnb_status.json").read_text())["run_id"]
    except (OSError, ValueError, KeyError):
        return 0

    def mine():
        return [p for p in child_processes() if f"tfnb-{run_id}-" in p]

    deadline = time.monotonic() + 10
    while mine() and time.monotonic() < deadline:
        time.sleep(0.2)
    return len(mine())


def trial(spark, kind: str, i: int) -> dict:
    from test_recovery import chaos_fit, keras_fit_losing_an_executor

    import tfnb

    model_dir = Path(tempfile.mkdtemp(prefix=f"tfnb-chaos-{kind}-"))
    marks = {}

    def display(event):
        if event.kind == "attempt":
            marks.setdefault("relaunched", event.time)
        elif event.kind == "progress" and "relaunched" in marks:
            marks.setdefault("resumed", event.time)  # the relaunch's first progress report

    start = time.monotonic()
    out = {"kind": kind, "trial": i}
    try:
        if kind == "keras":
            os.environ["TFNB_PREIMPORT"] = "tensorflow"
            result = tfnb.run(keras_fit_losing_an_executor, num_workers=2, args=(3,), spark=spark,
                              model_dir=str(model_dir), max_attempts=3, timeout=900, display=display)
            out.update(recovered=result["attempt"] >= 2, rerun=1 if result["began"] == [1, 2] else len(result["began"]))
        else:
            os.environ["TFNB_PREIMPORT"] = ""
            victim, point = i % 2, POINTS[i % len(POINTS)]
            kills = {1: (victim, 1, point, kind)}
            result = tfnb.run(chaos_fit, num_workers=2, args=(EPOCHS, STEPS, kills), spark=spark,
                              model_dir=str(model_dir), max_attempts=3, timeout=900, display=display)
            began = [json.loads(line) for line in (model_dir / "epochs.jsonl").read_text().splitlines()]
            first = {b["epoch"] for b in began if b["attempt"] == 1}
            later = {b["epoch"] for b in began if b["attempt"] > 1}
            out.update(recovered=result["attempt"] == 2, rerun=len(first & later), point=str(point), victim=victim)
            killed = json.loads((model_dir / "killed_at.json").read_text())
            if "resumed" in marks:
                out["recover_s"] = marks["resumed"] - killed
    except Exception as e:  # noqa: BLE001 - a failed trial is a data point
        out.update(recovered=False, error=f"{type(e).__name__}: {str(e)[:300]}")
    out["seconds"] = time.monotonic() - start
    out["left"] = _processes_left(model_dir)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--kinds", default="executor,process", help="comma-separated: executor, process, keras")
    args = parser.parse_args()
    from test_masters import STANDALONE_CONF, standalone

    results = []
    with tempfile.TemporaryDirectory(prefix="tfnb-chaos-cluster-") as folder, standalone(Path(folder)) as url:
        spark = session(url, "tfnb-bench-chaos", **STANDALONE_CONF)
        try:
            for kind in args.kinds.split(","):
                for i in range(args.trials):
                    r = trial(spark, kind, i)
                    results.append(r)
                    print(json.dumps(r), flush=True)
        finally:
            spark.stop()
    print()
    print(f"{'kind':10} {'recovered':>10} {'recover s (median/max)':>24} {'epochs re-run (max)':>20} {'left':>5}")
    for kind in args.kinds.split(","):
        rs = [r for r in results if r["kind"] == kind]
        ok = [r for r in rs if r["recovered"]]
        secs = [r["recover_s"] for r in ok if "recover_s" in r]
        timing = f"{median(secs):.1f}/{max(secs):.1f}" if secs else "-"
        rerun = max((r["rerun"] for r in ok), default=0)
        print(f"{kind:10} {len(ok):>4}/{len(rs):<5} {timing:>24} {rerun:>20} {sum(r['left'] for r in rs):>5}")


if __name__ == "__main__":
    main()
