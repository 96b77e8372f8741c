"""Benchmark tfnb.predict: CPU per row against ``model.predict`` and ``predict_batch_udf``.

Two models on three cached DataFrames (id, the input column, a --payload-byte string column that is
not an input):

* mlp: 64 -> 256 -> 256 -> 10 (--features, --hidden) on ``array<float>[64]``, ~2-3.5 us/row in
  model.predict: Spark's own per-row work dominates it.
* cnn: Keras' "Simple MNIST convnet" on 28x28x1 images given as ``array<float>[784]``, ~50-190 us/row
  in model.predict: a realistic model whose cost dominates the row's, the one the >= 0.9 goal is
  stated for.
* cnn-bytes: the same CNN, its images given as 784 uint8 pixels packed in a ``binary`` column (how
  images usually sit in Spark: the image source's ``data``, decoded files). tfnb.predict reads them
  from Arrow's buffer without a copy; predict_batch_udf gets one ``bytes`` object per row and its
  predict function joins and unpacks them, as a user would write it.

What is measured for each, in --repeats rounds (each round: one anchor pass, then the passes of
each wiring, so every round's figures see the same machine load; the ratios are computed per round
and their median is reported with the spread):

* anchor: ``model.predict(X, batch_size=B)`` in C separate Python processes (C = --cores), each
  pinned to its own CPU (``os.sched_setaffinity``) with TensorFlow's intra-/inter-op pools at 1
  thread, each predicting its share of the rows at the same time, as Spark's C Python workers do;
  X holds the frame's own values. They stay alive across the rounds; the model is loaded and one
  warm-up predict runs before the first round. B is the batch size tfnb.predict chooses (or
  --batch-size), the same for every wiring, so the ratios compare the data path, not batch sizes.
* tfnb.predict on ``local[C]`` (default 2): one warm-up pass loads the model in every Python worker;
  each timed pass computes the prediction of every row (``.write.format("noop")``). Spark figures are
  marginal: a pass over the rows minus a pass over a tenth of them (median of 3), per row between, so
  a job's fixed cost (~0.5 CPU-s, ~8 us/row over 60k CNN rows) is not counted as per-row cost.
  Everything the pass needs runs on those C cores: Spark's JVM tasks, the Arrow transfer both ways
  and the Python workers running TensorFlow (one intra-op thread each, = spark.task.cpus).
* the other ways to wire the same worker code into Spark, to justify the choice made in
  tfnb/data/inference.py: ``mapInArrow`` (whole rows go through Python and back; mlp only) and
  pyspark's ``predict_batch_udf`` (pandas conversion), beside the ``arrow_udf`` tfnb.predict uses.
  predict_batch_udf calls the same model function as tfnb.predict, so the two differ only in how
  rows reach the model and come back.
* the floor: an Arrow UDF that ignores its input column and returns ten constants per row, no
  model. Its CPU per row is Spark's own cost for that input (the scan, the JVM writing the column to
  Arrow, the prediction coming back), which every wiring pays; it is printed beside the UDF's
  overhead, not a goal.

Figures per row, all printed side by side:

* CPU-us/row: for Spark, the CPU time (user + system, from /proc) consumed during the pass by the
  Spark JVM and all its descendant processes (daemon, Python workers) plus this driver process; for
  the anchor, the anchor process's CPU time. This does not depend on how many cores the other
  tenants leave free, so it is the one the ratios use.
* wall-us/row per core: wall-clock seconds x C / rows (printed only: on a shared machine it
  measures the other tenants as much as tfnb).

Ratios (medians over the rounds): overhead beyond the model, (tfnb - model) / (udf - model) in
CPU-us/row, goal <= 0.35; and model / tfnb in CPU-us/row for the CNN (goal >= 0.9: a model that
dominates the per-row cost should run nearly as fast under tfnb.predict as in model.predict).

How far to trust the CNN ratios: the CNN's overheads (~10-30 us/row) are small beside its model
(~170 us/row), and the model's own cost moves by 3-7% between processes and passes (2026-11-27:
tfnb.predict on packed bytes measured 166-169 and 180 us/row in two runs of the same code, and an
Arrow UDF running the model on constants 184-188), so a round's CNN overhead ratio swings by
+-0.2; read the medians of several runs and the floor line beside them.

Where the time goes (measured 2026-11-25, CNN frame, CPU-us/row on a loaded machine): the cached
scan alone ~3; an Arrow UDF that ignores its input array and returns constants ~18-20, of which the
JVM ~15-18 (Java Flight Recorder: ``ArrowWriter``'s ``ArrayWriter.setValue`` writing the 784-float
input element by element is the top frame; the row queue of ``ArrowEvalPythonExec`` copying whole
rows next); tfnb.predict's own numpy/Arrow work per batch <0.01 us/row (cProfile), and its model
call (a ``tf.function`` with a fixed input signature) is ~10% cheaper than ``model.predict``'s.
So on ``array<float>`` input most of the overhead left is Spark's own and predict_batch_udf pays it
too (2026-11-27, marginal: the floor is 12-16 us/row on the 784-float arrays, 0.40x the UDF's
overhead); on packed bytes the floor is 2-4 us/row (0.16x), which is why cnn-bytes is there.

The last line is ``RESULT {json}`` with the ratios and goals (bench/all.py reads it).

Run:  .venv/bin/python bench/inference.py [--model mlp|cnn ...] [--rows 500000] [--cnn-rows 60000]
          [--features 64] [--hidden 256] [--batch-size B] [--payload 0] [--cores 2] [--repeats 3]
          [--only WIRING ...]
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import report

ROOT = Path(__file__).resolve().parent.parent


def build_model(path: str, kind: str, features: int, hidden: int) -> None:
    """The benchmark's model, saved as .keras by tf-keras.

    mlp: features -> hidden -> hidden -> 10. cnn: the conv net of Keras' "Simple MNIST convnet"
    example on 28x28x1 images (784 features per row, reshaped by tfnb.predict from the model's
    input shape): conv 32 -> pool -> conv 64 -> pool -> dropout -> dense 10, ~90 us/row on one core.
    """
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tf_keras

    layers = tf_keras.layers
    if kind == "cnn":
        side = int(round(features ** 0.5))
        model = tf_keras.Sequential([
            layers.Input((side, side, 1)), layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(),
            layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(), layers.Flatten(),
            layers.Dropout(0.5), layers.Dense(10)])
    else:
        model = tf_keras.Sequential([layers.Input((features,)), layers.Dense(hidden, activation="relu"),
                                     layers.Dense(hidden, activation="relu"), layers.Dense(10)])
    model.save(path)


def frame_values(ids, features: int, packed: bool):
    """The frame's input values for these row ids, as ``frame`` computes them in Spark (float32)."""
    import numpy as np

    mix = ids[:, None] * 7919 + np.arange(features)[None, :] * 104729
    return (mix % 256 if packed else mix % 1000 / 1000.0).astype(np.float32)


def anchor_main(model_path: str, rows: int, features: int, batch_size: int, part: str, packed: bool) -> None:
    """Child process: model.predict on its one pinned core, on its share of the frame's rows (the same
    values). After loading and one warm-up predict it prints "ready", then runs one timed pass per line
    read from stdin and prints its JSON line {"wall": seconds, "cpu": CPU-seconds}, so the parent can
    interleave anchor and Spark passes."""
    index, count = map(int, part.split("/"))
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[index % len(cpus)]})
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import tf_keras

    model = tf_keras.models.load_model(model_path, compile=False)
    x = frame_values(np.arange(index * rows // count, (index + 1) * rows // count), features, packed)
    x = x.reshape((len(x), *model.inputs[0].shape[1:]))
    model.predict(x[: batch_size * 4], batch_size=batch_size, verbose=0)
    print("ready", flush=True)
    for _ in sys.stdin:
        t, c = time.perf_counter(), time.process_time()
        model.predict(x, batch_size=batch_size, verbose=0)
        print(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - c}), flush=True)


class Anchor:
    """The anchor: one process per Spark core, each pinned to its own core and predicting its share
    of the rows at the same time, so the model runs under the same parallel load as in Spark's Python
    workers (on this 2-vCPU machine that changed nothing measurable: 168-170 CPU-us a CNN row, alone or
    two at once). Kept alive so its passes can alternate with the Spark passes."""

    def __init__(self, model_path: str, rows: int, features: int, batch_size: int, cores: int, packed: bool):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
        self.procs = []
        for i in range(cores):
            cmd = [sys.executable, __file__, "--anchor", model_path, "--part", f"{i}/{cores}", "--rows", str(rows),
                   "--features", str(features), "--batch-size", str(batch_size)] + (["--packed"] if packed else [])
            self.procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=subprocess.DEVNULL, text=True))
        for proc in self.procs:
            if proc.stdout.readline().strip() != "ready":
                self.close()
                raise RuntimeError(f"an anchor process failed to start (exit {proc.poll()}): {' '.join(cmd)}")

    def run(self) -> tuple[float, float]:
        """(wall seconds, CPU seconds) of one model.predict pass over every row, all processes at once."""
        for proc in self.procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outs = [json.loads(proc.stdout.readline()) for proc in self.procs]
        return max(o["wall"] for o in outs), sum(o["cpu"] for o in outs)

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            proc.wait()


# ------------------------------------------------------------------ the three wirings


def via_tfnb(df, model_path, batch_size, features):
    import tfnb.data.inference as inference

    return inference.predict(df, model_path, input_cols=["features"], batch_size=batch_size,
                             output_type="array")


def _spec(df, model_path, batch_size):
    """The same worker spec tfnb.predict builds, for the alternative wirings."""
    import tfnb.data.inference as inference

    source, version, files = inference._locate(model_path, {})
    return inference._Spec(source=source, version=version, files=files, input_cols=("features",),
                           scalar_output=False, batch_size=batch_size, threads=1,
                           cache_dir="", trace_dir=None)


def via_map_in_arrow(df, model_path, batch_size, features):
    """tfnb's fallback for pyspark < 4.1: whole rows through mapInArrow."""
    from pyspark.sql.types import ArrayType, FloatType

    import tfnb.data.inference as inference

    return inference._with_predictions_by_map(df, _spec(df, model_path, batch_size), "prediction",
                                              ArrayType(FloatType(), False))


def _make_predict_fn(spec, packed: bool):
    import numpy as np

    from tfnb.data.scoring import _model_for

    model = _model_for(spec)
    if packed:  # an object array of bytes, one per row: what a user would write to unpack them
        return lambda x: model.call(np.frombuffer(b"".join(x), np.uint8).reshape((len(x), *model.input_shape))
                                    .astype(np.float32))
    return lambda x: model.call(x.reshape((len(x), *model.input_shape)))  # (rows, 784) -> (rows, 28, 28, 1)


def via_predict_batch_udf(df, model_path, batch_size, features):
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType

    spec = _spec(df, model_path, batch_size)
    packed = df.schema["features"].dataType.typeName() == "binary"
    udf = predict_batch_udf(functools.partial(_make_predict_fn, spec, packed), return_type=ArrayType(FloatType()),
                            batch_size=batch_size, input_tensor_shapes=None if packed else [[features]])
    return df.withColumn("prediction", udf("features"))


def _constants(batches):
    """The floor's body: ten constants per row, whatever the input."""
    import numpy as np
    import pyarrow as pa

    for arr in batches:
        n = len(arr)
        yield pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * 10),
                                       pa.array(np.zeros(n * 10, np.float32)))


def via_floor(df, model_path, batch_size, features):
    """Spark's own cost of this input column: an Arrow UDF that ignores it and returns ten constants per
    row, the least any Python wiring pays to hand the column to Python and a prediction back (no model)."""
    from pyspark.sql.functions import ArrowUDFType, arrow_udf
    from pyspark.sql.types import ArrayType, FloatType

    fn = arrow_udf(_constants, ArrayType(FloatType(), False), ArrowUDFType.SCALAR_ITER)
    return df.withColumn("prediction", fn("features"))


WIRINGS = {"arrow_udf (tfnb.predict)": via_tfnb, "mapInArrow": via_map_in_arrow,
           "predict_batch_udf": via_predict_batch_udf, "floor (no model)": via_floor}


_TICK = os.sysconf("SC_CLK_TCK")


def _tree_cpu(root: int) -> float:
    """CPU seconds (user + system) used so far by process ``root`` and all its live descendants."""
    parent, cpu = {}, {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d.name)] = int(fields[1])
        cpu[int(d.name)] = (int(fields[11]) + int(fields[12])) / _TICK
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(p for p, pp in parent.items() if pp == pid)
    return total


def time_pass(out, jvm_pid: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the JVM tree + this driver) of one pass computing every row."""
    t, c, j = time.perf_counter(), time.process_time(), _tree_cpu(jvm_pid)
    out.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t, time.process_time() - c + _tree_cpu(jvm_pid) - j


# The wirings each model runs by default: mapInArrow is there to justify tfnb's choice, on the MLP; the
# floor shows what Spark alone costs for the CNN's input, as an array of floats and as packed bytes.
# "cnn-bytes" is the same CNN fed 28x28 uint8 pixels packed in a binary column (as images usually are).
_EACH = ["arrow_udf (tfnb.predict)", "predict_batch_udf", "floor (no model)"]
MODELS = {"mlp": _EACH + ["mapInArrow"], "cnn": _EACH, "cnn-bytes": _EACH}


def frame(spark, rows: int, features: int, payload: int, cores: int, packed: bool = False):
    """id, features (array<float>[features], or packed: binary of one uint8 per value), payload: cached
    and counted."""
    from pyspark.sql import functions as F

    # One expression per row, not one rand() column per feature: 784 columns would make a huge plan.
    values = F.expr(f"transform(sequence(0, {features - 1}), "
                    "i -> cast(((id * 7919 + i * 104729) % 1000) / 1000.0 as float))")
    if packed:  # the same pattern as bytes 0..255, packed through hex
        values = F.expr(f"unhex(concat_ws('', transform(sequence(0, {features - 1}), "
                        "i -> lpad(hex((id * 7919 + i * 104729) % 256), 2, '0'))))")
    df = (spark.range(0, rows, 1, cores)
          .select("id", values.alias("features"), F.repeat(F.lit("x"), payload).alias("payload")).cache())
    df.count()
    return df


TFNB, UDF, MODEL, FLOOR = "arrow_udf (tfnb.predict)", "predict_batch_udf", "model.predict", "floor (no model)"


def _spread(values) -> str:
    return f"{statistics.median(values):7.2f} ({min(values):.2f}-{max(values):.2f})"


def bench_model(spark, jvm_pid: int, kind: str, tmp: str, args) -> dict[str, float]:
    """Run one model through the wirings and the anchor in interleaved rounds; print the figures,
    return the ratios (medians over the rounds)."""
    features, rows = (args.features, args.rows) if kind == "mlp" else (784, args.cnn_rows)
    net = kind.split("-")[0]
    model_path = os.path.join(tmp, f"{net}.keras")
    if not os.path.exists(model_path):
        subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); "
                        f"import inference as b; b.build_model({model_path!r}, {net!r}, {features}, {args.hidden})"],
                       check=True, env=dict(os.environ), capture_output=True)
    packed = kind.endswith("-bytes")
    df = frame(spark, rows, features, args.payload, args.cores, packed=packed)
    # Spark figures are marginal: a pass over `rows` minus a pass over a tenth of them (the median of 3),
    # per row between,
    # so the fixed cost of a job (~0.5 CPU-s: planning, code generation, task set-up) is not spread over
    # the rows; at 60k CNN rows it would add ~8 us to every row of every wiring.
    small_rows = max(args.cores, rows // 10)
    small = frame(spark, small_rows, features, args.payload, args.cores, packed=packed)
    per_row = 1e6 / (rows - small_rows)
    # The size tfnb.predict chooses (reported in the output column's metadata) is used by every wiring
    # and the anchor, unless --batch-size fixes one for all.
    chosen = via_tfnb(df, model_path, args.batch_size, features).schema["prediction"].metadata["tfnb.batch_size"]
    size = args.batch_size or chosen
    print(f"[{kind}] rows={rows} features={features} batch_size={size} ({'given' if args.batch_size else 'chosen by tfnb.predict'}) "
          f"load(1m)={os.getloadavg()[0]:.1f}")
    outs = {name: tuple(WIRINGS[name](d, model_path, size, features) for d in (df, small))
            for name in args.only or MODELS[kind]}
    anchor = Anchor(model_path, rows, features, size, args.cores, packed)
    try:
        for name, (out, out_small) in outs.items():
            warm, _ = time_pass(out, jvm_pid)  # loads the model in each Python worker
            time_pass(out_small, jvm_pid)
            print(f"[{kind}] {name}: warm-up pass {warm:.1f} s")
        # One round = one anchor pass, then the passes of each wiring: every round sees the same load.
        # Figures per row: CPU-us (all processes of the pass) and wall-us per core.
        rounds = []
        for r in range(args.repeats):
            wall, cpu = anchor.run()
            one = {MODEL: (cpu / rows * 1e6, wall * args.cores / rows * 1e6)}
            for name, (out, out_small) in outs.items():
                big = time_pass(out, jvm_pid)
                # the small pass is mostly the job's fixed cost, which varies by ~0.1 CPU-s: its median of 3
                little = [statistics.median(v) for v in zip(*(time_pass(out_small, jvm_pid) for _ in range(3)))]
                wall, cpu = (b - s for b, s in zip(big, little))
                one[name] = (cpu * per_row, wall * args.cores * per_row)
            rounds.append(one)
            print(f"[{kind}] round {r + 1}: CPU-us/row " + ", ".join(f"{n} {c:.2f}" for n, (c, _) in one.items())
                  + f"  (load(1m)={os.getloadavg()[0]:.1f})")
    finally:
        anchor.close()
        df.unpersist()
        small.unpersist()
    names = list(rounds[0])
    print(f"[{kind}] per row, median of {len(rounds)} rounds (min-max); Spark on {args.cores} cores, per row "
          f"between passes over {rows} and {small_rows} rows; model.predict in {args.cores} processes, each "
          "pinned to its own core, on the same values:")
    print(f"[{kind}] {'':26s}{'CPU-us/row':>22s}{'wall-us/row per core':>26s}")
    for n in names:
        print(f"[{kind}] {n:26s}{_spread([x[n][0] for x in rounds]):>22s}{_spread([x[n][1] for x in rounds]):>26s}")
    ratios = {}
    if TFNB in names:
        cpu = [x[MODEL][0] / x[TFNB][0] for x in rounds]
        wall = [x[MODEL][1] / x[TFNB][1] for x in rounds]
        print(f"[{kind}] tfnb.predict vs model.predict per core: cpu {_spread(cpu)}   wall {_spread(wall)}")
        if kind != "mlp":  # the goal is for a model that dominates the per-row cost; the MLP's is printed
            ratios[f"predict vs model.predict per CPU-second ({kind})"] = round(statistics.median(cpu), 3)
    if TFNB in names and UDF in names:
        over = [(x[TFNB][0] - x[MODEL][0]) / (x[UDF][0] - x[MODEL][0]) for x in rounds]
        print(f"[{kind}] overhead beyond model.predict, tfnb.predict / predict_batch_udf (CPU): {_spread(over)}   "
              f"[(tfnb - model) / (udf - model) per round]")
        ratios[f"predict overhead vs predict_batch_udf overhead ({kind})"] = round(statistics.median(over), 3)
        if FLOOR in names:  # printed: what Spark alone costs for this input, which every wiring pays
            print(f"[{kind}] Spark's floor for this input (no model) / predict_batch_udf's overhead (CPU): "
                  f"{_spread([x[FLOOR][0] / (x[UDF][0] - x[MODEL][0]) for x in rounds])}")
    return ratios


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), action="append", help="run only these models")
    p.add_argument("--rows", type=int, default=500_000, help="rows for the MLP")
    p.add_argument("--cnn-rows", type=int, default=60_000, help="rows for the CNN (28x28 inputs)")
    p.add_argument("--features", type=int, default=64, help="inputs of the MLP")
    p.add_argument("--batch-size", type=int, default=None,
                   help="rows per model call for every wiring and the anchor (default: tfnb.predict's choice)")
    p.add_argument("--hidden", type=int, default=256, help="units of the MLP's two hidden layers")
    p.add_argument("--payload", type=int, default=0,
                   help="bytes of an extra string column carried along (not a model input)")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="rounds (anchor pass + one pass per wiring)")
    p.add_argument("--only", choices=sorted(WIRINGS), action="append", help="run only these wirings")
    p.add_argument("--anchor", help=argparse.SUPPRESS)
    p.add_argument("--part", default="0/1", help=argparse.SUPPRESS)
    p.add_argument("--packed", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.anchor:
        anchor_main(args.anchor, args.rows, args.features, args.batch_size, args.part, args.packed)
        return

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x])
    sys.path.insert(0, str(ROOT))
    print(f"hidden={args.hidden} payload={args.payload} cores={args.cores} repeats={args.repeats} "
          f"load(1m)={os.getloadavg()[0]:.1f} cpus={os.cpu_count()}")
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(f"local[{args.cores}]").appName("tfnb-bench-inference")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    jvm_pid = spark.sparkContext._gateway.proc.pid
    ratios = {}
    try:
        with tempfile.TemporaryDirectory(prefix="tfnb-bench-") as tmp:
            for kind in args.model or list(MODELS):
                ratios.update(bench_model(spark, jvm_pid, kind, tmp, args))
    finally:
        spark.stop()
    goals = {name: (0.35 if "overhead" in name else 0.9) for name in ratios}
    report("inference", ratios, goals)


if __name__ == "__main__":
    main()
