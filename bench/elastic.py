"""Elastic runs under chaos: Worker daemons lost, decommissioned and started again while a run trains, against the same
run undisturbed on the same cluster.

Starts a standalone master and three one-core Worker daemons from the pip pyspark (``spark.cores.max=3``,
decommissioning on), then round after round (alternating which goes first) runs the same elastic training twice:
undisturbed, and with a chaos thread that, several times per run, waits until the run is back at full size and has
trained two epochs there, then at a random point of an epoch either kills a Worker daemon's node (SIGKILL to the
daemon, its executor JVM and every process under it, tfnb's among them: a node gone) or sends the Worker daemon
SIGPWR (Spark's decommission signal, a spot node's notice; the node is killed once the run has left it), and starts a
new Worker daemon a few seconds after the run has shrunk.

The training: Keras 3 under MultiWorkerMirroredStrategy, an MLP on scikit-learn's digits fed by ``data=``
(``ctx.dataset``, the same global batch at every size), ``BackupAndRestore``, ``ctx.progress_callback()``;
``tfnb.run(num_workers=3, min_workers=2, replace_wait=5)``, with ``max_attempts`` two more than the losses (a lost
executor is a failed launch, and counts against it; a resize does not).

Reported: every run's outcome; the resizes (the status file's attempts: workers, resize from/to/why, resumed
epoch); epochs trained again after each loss (at most the one in progress) and after each stop at a boundary (none);
final accuracy against the undisturbed run's; the training time a resize costs, (disturbed wall - undisturbed wall)
/ resizes, in seconds and in undisturbed epochs; for each decommission notice, whether the launch it hit stopped at
the next epoch boundary with no failed launch; train_fn processes left after each run.

    ./dev bench elastic [--rounds 2] [--epochs 50] [--events kill,decommission,kill] [--repeat 16]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from harness import Standalone, executors, median, processes, report, use_checkout

use_checkout()

GLOBAL_BATCH = 96  # split evenly by 3 and by 2 workers: the same gradient, whatever the size
TRAIN = 1440  # 15 global batches of the digits; the other 357 rows are held out for the accuracy
FULL, MIN = 3, 2


def digits():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype("float32"), y.astype("int64")


def elastic_fit(ctx, epochs):
    """The digits MLP under MultiWorkerMirroredStrategy (Keras 3) on the fed DataFrame, GLOBAL_BATCH rows a step at
    every size; the chief writes when each epoch begins and ends (``timeline.jsonl``, epochs from 1 as the status file
    counts them). Returns the held-out accuracy."""
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
        model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    per_worker = GLOBAL_BATCH // ctx.num_workers
    train = ctx.dataset(per_worker, label_col="label", strategy=strategy)

    def note(what, epoch):
        if ctx.task_index == 0:
            with open(os.path.join(ctx.model_dir, "timeline.jsonl"), "a") as f:
                f.write(json.dumps({"attempt": ctx.attempt, "workers": ctx.num_workers, "epoch": epoch + 1,
                                    "what": what, "time": time.time()}) + "\n")

    class Timeline(keras.callbacks.Callback):
        # listed after progress_callback: an epoch that a resize stops the run before is not noted as begun
        def on_epoch_begin(self, epoch, logs=None):
            note("begin", epoch)

        def on_epoch_end(self, epoch, logs=None):
            note("end", epoch)

    model.fit(train, epochs=epochs, steps_per_epoch=ctx.steps_per_epoch(per_worker), verbose=0, callbacks=[
        ctx.progress_callback(), keras.callbacks.BackupAndRestore(os.path.join(ctx.model_dir, "backup")), Timeline()])
    x, y = digits()
    return {"accuracy": float(model.evaluate(x[TRAIN:], y[TRAIN:], verbose=0)[1])}


class Chaos(threading.Thread):
    """Loses or decommissions a Worker daemon once per entry of ``events`` while the run trains, and starts a new one
    ``return_after`` seconds after the run shrank. It reads the run through its display events."""

    def __init__(self, spark, cluster: Standalone, events: list[str], epochs: int, margin: int, return_after: float,
                 seed: int):
        super().__init__(name="bench-chaos", daemon=True)
        self.spark, self.cluster, self.events, self.epochs, self.margin, self.return_after = \
            spark, cluster, events, epochs, margin, return_after
        self.rng = random.Random(seed)
        self.cond = threading.Condition()
        self.size, self.launch, self.done_here, self.epoch_done = FULL, 1, 0, 0  # epochs ended: in launch, in run
        self.launches: list[dict] = []  # the ATTEMPT events' data, with their time
        self.epoch_s: list[float] = []
        self.finished = False
        self.log: list[dict] = []  # what the chaos did, one entry per event

    def display(self, event) -> None:
        with self.cond:
            if event.kind == "attempt":
                self.launches.append({**event.data, "time": event.time})
                self.size, self.launch, self.done_here = event.data.get("workers", self.size), event.data["attempt"], 0
                print(f"  [{time.strftime('%H:%M:%S')}] launch {event.data['attempt']}: {event.data['reason']}",
                      flush=True)
            elif event.kind == "progress" and event.task_index == 0 and event.data.get("epoch_end"):
                self.done_here += 1
                self.epoch_done = event.data["epoch"]
            elif event.kind == "failed":
                print(f"  [{time.strftime('%H:%M:%S')}] {event.label} failed: {event.data.get('exc_type')}: "
                      f"{str(event.data.get('message'))[:160]}", flush=True)
            self.cond.notify_all()

    def _wait(self, check, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.finished or check(), timeout) and not self.finished

    def stop(self) -> None:
        with self.cond:
            self.finished = True
            self.cond.notify_all()
        self.join(timeout=60)

    def run(self) -> None:
        for kind in self.events:
            # one event at a time: the run back at full size and settled there (two epochs ended in this launch)
            if not self._wait(lambda: self.size == FULL and self.done_here >= 2, 1800):
                self.log.append({"kind": kind, "skipped": "the run ended first"})
                return
            if self.epochs - self.epoch_done < self.margin:
                self.log.append({"kind": kind, "skipped": f"fewer than {self.margin} epochs left"})
                return
            time.sleep(self.rng.uniform(0.1, 0.9) * self._epoch_guess())  # a random point of an epoch
            if self.finished:
                return
            live = [w for w in self.cluster.workers if self.cluster.executors_of(w)]
            if not live:
                self.log.append({"kind": kind, "skipped": "no Worker daemon runs an executor"})
                return
            victim = self.rng.choice(live)
            with self.cond:
                entry = {"kind": kind, "time": time.time(), "launch": self.launch, "epochs_done": self.epoch_done}
                launches_before = len(self.launches)
            if kind == "kill":
                self.cluster.lose(victim)
            else:
                self._decommission(victim, entry)
            print(f"  [{time.strftime('%H:%M:%S')}] chaos: {kind} a Worker daemon (pid {victim.pid}) after epoch "
                  f"{entry['epochs_done']}", flush=True)
            self.log.append(entry)
            if not self._wait(lambda: len(self.launches) > launches_before, 600):
                entry["relaunch"] = "none within 600 s"
                return
            entry["relaunch"] = self.launches[launches_before]
            if kind == "decommission":
                self.cluster.lose(victim)  # the node is reclaimed once the run has left it
            if entry["relaunch"].get("workers") == FULL:
                continue  # no shrink (nothing to bring back)
            time.sleep(self.return_after)
            self.cluster.add_worker()
            entry["returned"] = time.time()
            print(f"  [{time.strftime('%H:%M:%S')}] chaos: a Worker daemon started", flush=True)
            grown = len(self.launches)
            if not self._wait(lambda: len(self.launches) > grown and self.size == FULL, 900):
                entry["grew"] = "not before the run ended"
                return
            entry["grew"] = self.launches[grown]["time"]

    def _decommission(self, victim, entry: dict) -> None:
        """SIGPWR, then how long until the driver sees an executor leaving (what tfnb's watch reads every 2 s)."""
        from tfnb.launcher.elastic import leaving

        before = leaving(self.spark)
        self.cluster.decommission(victim)
        end = time.monotonic() + 60
        while not leaving(self.spark) - before and time.monotonic() < end:
            time.sleep(0.1)
        entry["seen_s"] = round(time.time() - entry["time"], 1) if leaving(self.spark) - before else None

    def _epoch_guess(self) -> float:
        return median(self.epoch_s) if self.epoch_s else 2.0


def timeline(model_dir: Path) -> list[dict]:
    path = model_dir / "timeline.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def epoch_seconds(lines: list[dict]) -> dict[int, list[float]]:
    """By launch size: begin-to-begin seconds of consecutive epochs within a launch (an epoch's training, its backup,
    its callbacks), the launch's first epoch (its tracing) left out."""
    begins = [l for l in lines if l["what"] == "begin"]
    out: dict[int, list[float]] = {}
    for a, b, c in zip(begins, begins[1:], begins[2:]):
        if a["attempt"] == b["attempt"] == c["attempt"] and c["epoch"] == b["epoch"] + 1 == a["epoch"] + 2:
            out.setdefault(b["workers"], []).append(c["time"] - b["time"])
    return out


def trained_again(lines: list[dict], attempts: list[dict]) -> list[dict]:
    """Per launch that ended for a relaunch: its outcome and the epochs the next launch began again (which this one
    had begun too: a lost launch's epoch in progress; none after a stop at a boundary)."""
    begun = {}
    for l in lines:
        if l["what"] == "begin":
            begun.setdefault(l["attempt"], set()).add(l["epoch"])
    out = []
    for a, b in zip(attempts, attempts[1:]):
        again = sorted(begun.get(a["attempt"], set()) & begun.get(b["attempt"], set()))
        out.append({"attempt": a["attempt"], "outcome": a.get("outcome"), "again": again,
                    "resumed_epoch": b.get("resumed_epoch")})
    return out


def train_fn_processes(marker: str) -> list[int]:
    """train_fn processes of this cluster still running (started fresh, or forked by a warm standby)."""
    table, found = processes(), []
    for pid, (ppid, argv) in table.items():
        forked = b"tfnb._task.warm" in argv and b"tfnb._task.warm" in table.get(ppid, (0, b""))[1]
        if b"tfnb._task.child" in argv or forked:
            try:
                if marker.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    found.append(pid)
            except OSError:
                continue
    return found


def one_run(spark, cluster: Standalone, df, args, chaos: Chaos | None) -> dict:
    import tfnb

    model_dir = Path(tempfile.mkdtemp(prefix="tfnb-bench-elastic-"))
    display = chaos.display if chaos else (lambda event: None)
    if chaos:
        chaos.start()
    start = time.monotonic()
    out = {"disturbed": chaos is not None, "model_dir": str(model_dir)}
    try:
        value = tfnb.run(elastic_fit, num_workers=FULL, min_workers=MIN, replace_wait=args.replace_wait,
                         args=(args.epochs,), spark=spark, data=df, model_dir=str(model_dir),
                         max_attempts=len(args.events) + 2, display=display, timeout=args.timeout)
        out.update(succeeded=True, accuracy=value["accuracy"])
    except Exception as e:  # noqa: BLE001 - a failed run is a result
        out.update(succeeded=False, error=f"{type(e).__name__}: {str(e)[:400]}")
    out["wall"] = time.monotonic() - start
    if chaos:
        chaos.stop()
        out["chaos"] = chaos.log
    status = json.loads((model_dir / "tfnb_status.json").read_text())
    out["attempts"] = status["attempts"]
    lines = out["timeline"] = timeline(model_dir)
    out["epoch_s"] = epoch_seconds(lines)
    out["again"] = trained_again(lines, out["attempts"])
    end = time.monotonic() + 10
    while (left := train_fn_processes(cluster.marker)) and time.monotonic() < end:
        time.sleep(0.5)
    out["left"] = len(left)
    return out


def restore(cluster: Standalone, spark) -> None:
    """Back to FULL executors before the next run: a Worker daemon for each one lost."""
    while len([w for w in cluster.workers if w.poll() is None]) < FULL:
        cluster.add_worker()
    cluster.wait_for(lambda: executors(spark) >= FULL and cluster.alive_workers() >= FULL, 180,
                     f"{FULL} executors did not register")


def decommission_cases(run: dict) -> list[dict]:
    """For each decommission notice: how the launch it hit ended, the epochs that ended between the notice and the stop
    (1: the next boundary), and the seconds from the notice to that last epoch's end and to the launch's end."""
    cases, lines = [], run["timeline"]
    for event in run.get("chaos", []):
        if event["kind"] != "decommission" or "time" not in event:
            continue
        hit = next((a for a in run["attempts"] if a["attempt"] == event["launch"]), {})
        ended = hit.get("started", 0) + hit.get("seconds", 0)
        ends = [l for l in lines if l["attempt"] == event["launch"] and l["what"] == "end"
                and event["time"] <= l["time"] <= ended]
        again = next((g for g in run["again"] if g["attempt"] == event["launch"]), {})
        cases.append({"outcome": hit.get("outcome"), "cause": hit.get("cause"), "resize": hit.get("resize"),
                      "noticed_after": event["epochs_done"], "resumed": again.get("resumed_epoch"),
                      "seen": event.get("seen_s"),
                      "epochs_after_notice": len(ends), "again": again.get("again"),
                      "to_boundary": round(ends[-1]["time"] - event["time"], 1) if ends else None,
                      "to_end": round(ended - event["time"], 1) if hit else None})
    return cases


def chaos_rows(run: dict) -> list[list]:
    """One row per chaos event: when, what the run did next, and how long the returning node took to be used."""
    rows = []
    for e in run.get("chaos", []):
        relaunch = e.get("relaunch")
        if "skipped" in e or not isinstance(relaunch, dict):
            rows.append([run["round"], e["kind"], "-", e.get("skipped") or relaunch, "-", "-"])
            continue
        grew = e.get("grew")
        back = f"{grew - e['returned']:.0f}" if isinstance(grew, float) else grew or "-"
        rows.append([run["round"], e["kind"], e["epochs_done"], relaunch.get("workers"),
                     f"{relaunch['time'] - e['time']:.1f}", back])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs (undisturbed, disturbed)")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--margin", type=int, default=15,
                        help="no chaos event with fewer epochs than this left (room for the run to grow back)")
    parser.add_argument("--repeat", type=int, default=16,
                        help="the training rows this many times over (noise added to the copies): steps per epoch")
    parser.add_argument("--events", default="kill,decommission,kill",
                        help="what the chaos does to the disturbed run, in order: kill, decommission")
    parser.add_argument("--replace-wait", type=float, default=5.0)
    parser.add_argument("--return-after", type=float, default=5.0,
                        help="seconds between the run's shrinking and a new Worker daemon's start")
    parser.add_argument("--timeout", type=float, default=2400)
    parser.add_argument("--json", help="write every run's record (status attempts, timeline, chaos) to this file")
    parser.add_argument("--summarize", metavar="JSON", help="only print the summary of a file --json wrote")
    parser.add_argument("--keep", action="store_true", help="keep the runs' model_dirs and the daemons' logs")
    args = parser.parse_args()
    args.events = args.events.split(",")
    if args.summarize:
        saved = json.loads(Path(args.summarize).read_text())
        for run in saved["runs"]:  # JSON keys are strings
            run["epoch_s"] = {int(k): v for k, v in run["epoch_s"].items()}
        return summarize(saved["runs"], argparse.Namespace(**saved["args"]))
    x, y = digits()
    noise = np.random.default_rng(0).normal(0, 0.05, (args.repeat - 1, TRAIN, x.shape[1]))
    train_x = np.concatenate([x[:TRAIN], *(np.clip(x[:TRAIN] + n, 0, 1) for n in noise)]).astype("float32")
    train_y = np.tile(y[:TRAIN], args.repeat)

    runs = []
    folder = tempfile.mkdtemp(prefix="tfnb-bench-elastic-cluster-")
    cluster = Standalone(folder)
    try:
        for _ in range(FULL):
            cluster.add_worker()
        spark = cluster.session("tfnb-bench-elastic", FULL)
        df = spark.createDataFrame([(r.tolist(), int(l)) for r, l in zip(train_x, train_y)],
                                   "features array<float>, label long")
        for r in range(args.rounds):
            for disturbed in ((False, True) if r % 2 == 0 else (True, False)):
                restore(cluster, spark)
                print(f"round {r + 1}: {'disturbed' if disturbed else 'undisturbed'} run", flush=True)
                chaos = None
                if disturbed:
                    chaos = Chaos(spark, cluster, args.events, args.epochs, args.margin, args.return_after, seed=r)
                    chaos.epoch_s = (runs[-1]["epoch_s"].get(FULL) if runs else None) or [2.0]
                out = one_run(spark, cluster, df, args, chaos)
                out["round"] = r + 1
                runs.append(out)
                print(json.dumps({k: v for k, v in out.items() if k not in ("model_dir", "timeline")}), flush=True)
        spark.stop()
    finally:
        cluster.close()
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}))
    summarize(runs, args)
    if all(run.get("succeeded") for run in runs) and not args.keep:
        for path in [folder, *(run["model_dir"] for run in runs)]:
            shutil.rmtree(path, ignore_errors=True)
    else:  # what happened, for the report: the daemons' logs, each run's status file and run log
        print(f"kept: the cluster's daemon logs in {folder}; the runs' model_dirs (tfnb_status.json, tfnb-logs/) "
              f"{' '.join(run['model_dir'] for run in runs)}")


def compare(calm: dict, hit: dict) -> dict:
    """One round: the disturbed run against the undisturbed one."""
    resizes = [a["resize"] for a in hit["attempts"] if a.get("resize")]
    epoch = median(calm["epoch_s"][FULL]) if calm["epoch_s"].get(FULL) else float("nan")
    out = {"resizes": len(resizes), "epoch": epoch, "cost": float("nan"), "adjusted": float("nan")}
    if resizes and hit.get("succeeded") and calm.get("succeeded"):
        out["cost"] = (hit["wall"] - calm["wall"]) / len(resizes)
        # epochs trained at another size ran at that size's pace, not the full run's: take the difference out
        ended = [l for l in hit["timeline"] if l["what"] == "end" and l["workers"] != FULL]
        pace = {n: median(v) for n, v in hit["epoch_s"].items()}
        other = sum(pace.get(l["workers"], epoch) - epoch for l in ended)
        out["adjusted"] = (hit["wall"] - calm["wall"] - other) / len(resizes)
    return out


def summarize(runs: list[dict], args) -> None:
    header = ["round", "undisturbed", "disturbed", "resizes", "disturbed launches: workers (outcome, from epoch)",
              "wall undisturbed / disturbed (s)", "undisturbed epoch (s)", "cost per resize (s)",
              "cost per resize (epochs)", "cost per resize, 2-worker pace taken out (s)",
              "accuracy undisturbed / disturbed", "train_fn processes left"]
    rows, cmp, again_loss, again_boundary, decom = [header], [], [], [], []
    for r in sorted({run["round"] for run in runs}):
        calm = next(run for run in runs if run["round"] == r and not run["disturbed"])
        hit = next(run for run in runs if run["round"] == r and run["disturbed"])
        c = compare(calm, hit)
        if c["cost"] == c["cost"]:
            cmp.append({**c, "accuracy": (hit["accuracy"], calm["accuracy"])})
        for g in hit["again"]:
            (again_boundary if g["outcome"] == "resized" else again_loss).append(len(g["again"]))
        decom += decommission_cases(hit)
        launches = " → ".join(f"{a['workers']} ({a.get('outcome')}, {a.get('resumed_epoch')})"
                              for a in hit["attempts"])
        rows.append([r, _ok(calm), _ok(hit), c["resizes"], launches, f"{calm['wall']:.0f} / {hit['wall']:.0f}",
                     f"{c['epoch']:.2f}", f"{c['cost']:.1f}", f"{c['cost'] / c['epoch']:.1f}", f"{c['adjusted']:.1f}",
                     f"{calm.get('accuracy', float('nan')):.3f} / {hit.get('accuracy', float('nan')):.3f}",
                     f"{calm['left']} / {hit['left']}"])
    launches = [["round", "launch", "workers", "outcome", "resumed at epoch", "epochs begun again by the next launch",
                 "resize", "cause"]]
    for run in (run for run in runs if run["disturbed"]):
        again = {g["attempt"]: g["again"] for g in run["again"]}
        for a in run["attempts"]:
            rz = a.get("resize")
            launches.append([run["round"], a["attempt"], a["workers"], a.get("outcome"), a.get("resumed_epoch"),
                             again.get(a["attempt"], "-"), f"{rz['from']} → {rz['to']} ({rz['why']})" if rz else "-",
                             str(a.get("cause", "-"))[:100]])
    notices = [["round", "noticed after epoch", "driver saw it after (s)", "launch noticed: outcome", "resize",
                "next launch resumed at epoch", "epochs ended between notice and stop (1: the next boundary)",
                "epochs begun again", "notice → that epoch's end (s)", "notice → launch ended (s)"]]
    events = [["round", "event", "after epoch", "relaunched with workers", "event → relaunch (s)",
               "Worker daemon started → run at full size again (s)"]]
    for run in (run for run in runs if run["disturbed"]):
        notices += [[run["round"], c["noticed_after"], c["seen"], c["outcome"],
                     f"{c['resize']['from']} → {c['resize']['to']}" if c["resize"] else "-", c["resumed"],
                     c["epochs_after_notice"], c["again"], c["to_boundary"], c["to_end"]]
                    for c in decommission_cases(run)]
        events += chaos_rows(run)
    for table in (rows, events, launches, notices):
        print()
        for row in table:
            print(" | ".join(map(str, row)))
    succeeded = [run.get("succeeded", False) for run in runs if run["disturbed"]]
    clean = [c["outcome"] == "resized" and c["again"] == [] for c in decom]  # stopped at a boundary, nothing failed
    first = [ok and c["epochs_after_notice"] <= 1 for ok, c in zip(clean, decom)]
    print(f"\nbench/elastic: {sum(succeeded)}/{len(succeeded)} disturbed runs succeeded ({','.join(args.events)} per "
          f"run, replace_wait={args.replace_wait:g} s, {args.epochs} epochs); epochs begun again after a loss: max "
          f"{max(again_loss, default=0)}, after a stop at a boundary: max {max(again_boundary, default=0)}; accuracy "
          f"disturbed - undisturbed: {', '.join(f'{d - u:+.3f}' for d, u in (c['accuracy'] for c in cmp)) or '-'}; "
          f"cost per resize: {', '.join(_cost(c) for c in cmp) or '-'}; decommission notices that stopped the run at "
          f"an epoch boundary with no failed launch: {sum(clean)}/{len(decom)}, at the first boundary after the "
          f"signal: {sum(first)}/{len(decom)}")
    ratios = {"elastic runs succeeded": sum(succeeded) / max(len(succeeded), 1),
              "decommission notices stopped at a boundary": sum(clean) / max(len(decom), 1),
              "elastic accuracy vs undisturbed": median([d / u for d, u in (c["accuracy"] for c in cmp)]) if cmp else 0,
              "elastic epochs begun again per loss (max)": float(max(again_loss, default=0))}
    goals = {"elastic runs succeeded": 1.0, "decommission notices stopped at a boundary": 1.0,
             "elastic accuracy vs undisturbed": 0.98, "elastic epochs begun again per loss (max)": 1.0}
    report("elastic", ratios, goals, resize_cost_s=[round(c["cost"], 1) for c in cmp],
           resize_cost_epochs=[round(c["cost"] / c["epoch"], 2) for c in cmp],
           tables={"Elastic: runs under chaos against the same runs undisturbed": rows,
                   "Elastic: what the chaos did": events, "Elastic: the disturbed runs' launches": launches,
                   "Elastic: decommission notices": notices})


def _cost(c: dict) -> str:
    return f"{c['cost']:.1f} s ({c['cost'] / c['epoch']:.1f} epochs)"


def _ok(run: dict) -> str:
    return "succeeded" if run.get("succeeded") else f"failed: {run.get('error', '')[:100]}"


if __name__ == "__main__":
    main()
