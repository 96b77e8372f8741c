"""Every bench in one command: a table of ratios against their goals and a picture of it.

    ./dev bench all [--runs 3] [--only feeding launch [--keep]] [--out bench]

Runs each bench under bench/ in its own process at a size that keeps the whole run to a few
minutes, reads its ratios, and writes ``bench/results.md`` (ratios first, then the command lines
and the machine) ``bench/results.png`` (one bar per ratio, its goal drawn across it) and ``bench/results.log`` (every
bench's full output). With ``--runs N`` every bench runs N times, one whole round after another, and
each ratio is the median of its N values (the table lists them all); tables and curves are the last run's.

Convention: a bench ends with one line ``RESULT {json}`` holding ``{"ratios": {name: value},
"goals": {name: goal}}`` (``bench/harness.py``'s ``report``), the only output read. A ratio a bench
did not print shows as "n/a"; a bench that fails is listed with its exit code and the end of its output.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# name -> arguments at "a few minutes in total" sizes; every bench keeps its anchor in the same run.
# fanin measures CPU time and goes first: the benches that run tfnb leave warm standbys importing
# TensorFlow on the same cores for several seconds after they end.
BENCHES = {
    "fanin": ["--tasks", "2048", "--lines", "20", "--seconds", "10"],
    "launch": ["--repeats", "2"],
    "rerun": ["--rounds", "3"],
    "feeding": ["--rounds", "3"],
    "staging": ["--repeat", "3"],
    "inference": ["--repeats", "3"],
    "evaluator": ["--checkpoints", "8"],
    "sync": ["--minutes", "0.5", "--interval", "5"],
    "overhead": ["--steps", "150", "--repeats", "1"],
    "keras3": ["--rounds", "3"],
    "profiler": ["--runs", "10"],
    "sweep": ["--trials", "6", "--epochs", "3", "--rounds", "3"],
    "elastic": ["--rounds", "3"],
}


@dataclass
class Ratio:
    bench: str
    name: str
    value: float | None
    goal: float
    higher_is_better: bool = True
    runs: list[float] = field(default_factory=list)   # every run's value, when there were several

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.goal if self.higher_is_better else self.value <= self.goal


@dataclass
class Outcome:
    bench: str
    command: list[str]
    seconds: float
    code: int
    output: str
    ratios: list[Ratio] = field(default_factory=list)


def _result_line(text: str) -> dict | None:
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return None
    try:
        return json.loads(lines[-1][len("RESULT "):])
    except ValueError:
        return None


# What each bench is held to (the project's goals); the parsers fill in the values.
_LOWER_IS_BETTER = {"launch vs floor", "evaluator p95 lag vs goal", "rerun vs the peer's rerun",
                    "rerun seconds", "fan-in driver CPU s/s", "fan-in lag p99 vs 500 ms",
                    "predict overhead vs predict_batch_udf overhead (mlp)",
                    "predict overhead vs predict_batch_udf overhead (cnn)",
                    "predict overhead vs predict_batch_udf overhead (cnn-bytes)",
                    "elastic epochs begun again per loss (max)"}


def parse(bench: str, text: str) -> list[Ratio]:
    """The ratios in one bench's output; a value it did not print is None."""
    found = _result_line(text)
    if found is not None:
        goals = found.get("goals", {})
        return [Ratio(bench, name, value, goals.get(name, float("nan")), name not in _LOWER_IS_BETTER)
                for name, value in found.get("ratios", {}).items()]
    return []


def run(bench: str, args: list[str]) -> Outcome:
    command = [sys.executable, os.path.join("bench", f"{bench}.py"), *args]
    print(f"[all] {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    # This checkout's tfnb, in the bench and in the Spark executors it starts.
    path = os.pathsep.join([ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=dict(os.environ, PYTHONPATH=path, PYSPARK_PYTHON=sys.executable))
    seconds = time.perf_counter() - start
    out = Outcome(bench, command, seconds, proc.returncode, proc.stdout, parse(bench, proc.stdout))
    shown = ", ".join(f"{r.name} {_fmt(r.value)}" for r in out.ratios) or "no ratio found"
    print(f"[all] {bench}: exit {proc.returncode} in {seconds:.0f} s: {shown}", flush=True)
    return out


def median_of(outs: list[Outcome]) -> Outcome:
    """One bench's runs as one outcome: each ratio the median of the runs that printed it."""
    if len(outs) == 1:
        return outs[0]
    last = outs[-1]
    ratios = []
    for r in last.ratios:
        values = [x.value for o in outs for x in o.ratios if x.name == r.name and x.value is not None]
        ratios.append(Ratio(r.bench, r.name, statistics.median(values) if values else None, r.goal,
                            r.higher_is_better, values))
    code = next((o.code for o in outs if o.code), 0)
    return Outcome(last.bench, last.command, sum(o.seconds for o in outs), code, last.output, ratios)


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def machine() -> list[str]:
    import multiprocessing

    facts = [f"{platform.platform()}", f"Python {platform.python_version()}",
             f"{multiprocessing.cpu_count()} CPUs", f"load average {os.getloadavg()[0]:.1f} at the end"]
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        facts.append(f"{kb / 2**20:.0f} GiB memory")
    except OSError:
        pass
    for mod in ("pyspark", "tensorflow", "pyarrow"):
        try:
            from importlib.metadata import version

            facts.append(f"{mod} {version(mod)}")
        except Exception:  # noqa: BLE001 - a fact we cannot read is left out
            pass
    return facts


def write_markdown(path: str, outcomes: list[Outcome], argv: list[str]) -> None:
    ratios = [r for o in outcomes for r in o.ratios]
    lines = ["# Benchmark results", "",
             f"`{' '.join(argv)}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Each ratio compares "
             "tfnb with an anchor measured in the same run; compare ratios, not absolute figures.", "",
             "| bench | ratio | value | goal | met | runs |", "|---|---|---|---|---|---|"]
    for r in ratios:
        goal = ("≥ " if r.higher_is_better else "≤ ") + f"{r.goal:g}"
        met = {True: "yes", False: "**no**", None: "n/a"}[r.met]
        runs = ", ".join(map(_fmt, r.runs)) if len(r.runs) > 1 else "1"
        lines.append(f"| {r.bench} | {r.name} | {_fmt(r.value)} | {goal} | {met} | {runs} |")
    for o in outcomes:
        for title, table in ((_result_line(o.output) or {}).get("tables") or {}).items():
            lines += ["", f"## {title}", "", "| " + " | ".join(map(str, table[0])) + " |",
                      "|" + "---|" * len(table[0])] + ["| " + " | ".join(map(str, row)) + " |" for row in table[1:]]
    lines += ["", "## Runs", "", "| bench | command | exit | seconds (all runs) |", "|---|---|---|---|"]
    for o in outcomes:
        lines.append(f"| {o.bench} | `{' '.join(['python'] + o.command[1:])}` | {o.code} | {o.seconds:.0f} |")
    failed = [o for o in outcomes if o.code != 0]
    for o in failed:
        tail = "\n".join(o.output.strip().splitlines()[-15:])
        lines += ["", f"### {o.bench} failed (exit {o.code})", "", "```", tail, "```"]
    lines += ["", "## Machine", ""] + [f"- {fact}" for fact in machine()]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


_CLIP = 3.0


def write_picture(path: str, outcomes: list[Outcome]) -> None:
    """Bars of value / goal (1.0 = goal met exactly), so ratios of any scale share one axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = [r for o in outcomes for r in o.ratios]
    names = [r.name if r.name.startswith(r.bench) else f"{r.bench}: {r.name}" for r in ratios]
    # "Lower is better" ratios are drawn inverted, so every bar above 1 meets its goal.
    score = []
    for r in ratios:
        if r.value is None or not r.goal or r.value <= 0:
            score.append(0.0)
        else:
            score.append(r.value / r.goal if r.higher_is_better else r.goal / r.value)
    score = [min(s, _CLIP) for s in score]  # one large lead must not flatten every other bar
    colors = ["#9e9e9e" if r.value is None else ("#2e7d32" if r.met else "#c62828") for r in ratios]
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(ratios) + 1.4))
    ax.barh(range(len(ratios)), score, color=colors)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(ratios)), names, fontsize=8)
    ax.invert_yaxis()
    for i, r in enumerate(ratios):
        goal = ("≥" if r.higher_is_better else "≤") + f"{r.goal:g}"
        ax.text(max(score[i], 0) + 0.02, i, f"{_fmt(r.value)} (goal {goal})", va="center", fontsize=7)
    ax.set_xlabel(f"ratio / goal, cut at {_CLIP:g} (dashed line = goal; right of it = met; grey = not measured)")
    ax.set_xlim(0, max([1.3] + [s * 1.3 for s in score]))
    ax.set_title("tfnb benchmarks: ratios against anchors measured in the same run", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_curves(folder: str, outcomes: list[Outcome]) -> None:
    """One line chart per bench that printed a curve: seconds per 100k rows by size, tfnb and its ceiling,
    one pair of lines per worker count (log-log), so a regression in the curve shows, not only a point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for o in outcomes:
        curve = (_result_line(o.output) or {}).get("curve") or []
        if not curve:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for i, workers in enumerate(sorted({c["workers"] for c in curve})):
            pts = sorted((c for c in curve if c["workers"] == workers), key=lambda c: c["rows"])
            rows = [c["rows"] for c in pts]
            color = f"C{i}"
            ax.plot(rows, [c["tfnb_per_100k"] for c in pts], "o-", color=color, label=f"tfnb, {workers} workers")
            ax.plot(rows, [c["ceiling_per_100k"] for c in pts], "s--", color=color, alpha=0.6,
                    label=f"mapInArrow ceiling, {workers} workers")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("rows fed (256 B each)")
        ax.set_ylabel("seconds per 100k rows (lower is better)")
        ax.set_title(f"{o.bench}: cost per row as the data grows (medians)", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(folder, f"results-{o.bench}.png"), dpi=110)
        plt.close(fig)


def _previous_runs(log: str) -> dict[str, list[Outcome]]:
    """The outcomes a results.log holds, by bench (its ``=====`` header line, then the bench's output),
    every run of a bench in order."""
    found: dict[str, list[Outcome]] = {}
    if not os.path.exists(log):
        return {}
    parts = re.split(r"^===== (python bench/(\w+)\.py.*?) \(exit (-?\d+), (\d+) s\)\n", open(log).read(), flags=re.M)
    for command, bench, code, seconds, output in zip(*[iter(parts[1:])] * 5):
        argv = [sys.executable] + command.split()[1:]
        found.setdefault(bench, []).append(
            Outcome(bench, argv, float(seconds), int(code), output.rstrip("\n"), parse(bench, output)))
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=sorted(BENCHES), help="run these benches only")
    p.add_argument("--out", default=HERE, help="folder for results.md and results.png")
    p.add_argument("--keep", action="store_true",
                   help="with --only: keep the other benches' last outputs (from results.log) in the results")
    p.add_argument("--runs", type=int, default=1, help="run every bench this many times; report medians")
    a = p.parse_args()
    names = a.only or list(BENCHES)
    rounds = []
    for i in range(max(1, a.runs)):
        if a.runs > 1:
            print(f"[all] run {i + 1} of {a.runs}", flush=True)
        rounds.append({name: run(name, BENCHES[name]) for name in names})
    fresh = {name: median_of([r[name] for r in rounds]) for name in names}
    kept_log = _previous_runs(os.path.join(a.out, "results.log")) if a.keep else {}
    kept = {bench: median_of(outs) for bench, outs in kept_log.items()}
    outcomes = [fresh.get(name) or kept[name] for name in BENCHES if name in fresh or name in kept]
    md, png = os.path.join(a.out, "results.md"), os.path.join(a.out, "results.png")
    write_markdown(md, outcomes, ["./dev", "bench", "all"] + sys.argv[1:])
    logged = [r[name] for r in rounds for name in names]
    logged += [o for name, runs in kept_log.items() if name not in fresh for o in runs]
    with open(os.path.join(a.out, "results.log"), "w") as f:  # every bench's full output, for the details
        for o in logged:
            f.write(f"===== {' '.join(['python'] + o.command[1:])} (exit {o.code}, {o.seconds:.0f} s)\n{o.output}\n")
    try:
        write_picture(png, outcomes)
        write_curves(a.out, outcomes)
    except ImportError as e:
        print(f"[all] no picture: {e}; install matplotlib (pip install 'tfnb[bench]')", file=sys.stderr)
    print(open(md).read())
    return 0 if all(o.code == 0 for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
