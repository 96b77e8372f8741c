"""Runs tfnb on a Spark Connect session (no SparkContext, no RDD API) and prints one JSON line.

Also feeds a DataFrame. Run by tests/test_masters.py in its own process: a Connect session and a classic one don't mix.
"""
import json
import os
import sys
import time

os.environ["PYSPARK_PYTHON"] = sys.executable

import connect_lock  # noqa: E402,F401  (one remote("local...") server at a time on this machine)

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import tfnb  # noqa: E402
from tfnb.errors import RunTimeoutError, WorkerError  # noqa: E402


def describe(ctx):
    return {"job_name": ctx.job_name, "cluster": dict(ctx.cluster_spec), "pid": os.getpid()}


def fail(ctx):
    if ctx.task_index == 1:
        raise KeyError("missing-feature")
    time.sleep(600)


def report_feed(ctx):
    return {"rows": list(ctx.feed.rows_per_worker), "steps": ctx.steps_per_epoch(100),
            "lengths": dict(ctx.feed.array_lengths)}


def main():
    spark = SparkSession.builder.remote("local[2]").getOrCreate()
    out = {"connect": type(spark).__module__}
    out["first"] = tfnb.run(describe, num_workers=2, spark=spark, display=False)
    out["second"] = tfnb.run(describe, num_workers=2, spark=spark, display=False)
    try:
        tfnb.run(fail, num_workers=2, spark=spark, display=False, timeout=120)
    except WorkerError as e:
        out["error"] = {"task_index": e.task_index, "exc_type": e.exc_type, "text": str(e)}
    start = time.monotonic()
    try:
        tfnb.run(lambda ctx: time.sleep(600), num_workers=2, spark=spark, display=False, timeout=5)
    except RunTimeoutError:
        out["timeout_cancelled_after"] = time.monotonic() - start
    out["after_cancel"] = tfnb.run(describe, num_workers=2, spark=spark, display=False)["job_name"]
    # feeding a DataFrame of a Connect session (plans only, no RDD API)
    df = spark.range(0, 1000, 1, 1).select(
        (F.col("id") / 1000.0).alias("x"), F.array(F.col("id").cast("float"), F.lit(1.0)).alias("v"))
    out["feed"] = tfnb.run(report_feed, num_workers=2, data=df, spark=spark, display=False)
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
