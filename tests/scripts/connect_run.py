"""Runs tfnb on a Spark Connect session (no SparkContext, no RDD API) and prints one JSON line.

Run by tests/test_masters.py in its own process: a Connect session and a classic one don't mix.
"""
import json
import os
import sys
import time

os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession  # noqa: E402

import tfnb  # noqa: E402
from tfnb.errors import RunTimeoutError, WorkerError  # noqa: E402


def describe(ctx):
    return {"job_name": ctx.job_name, "cluster": dict(ctx.cluster_spec), "pid": os.getpid()}


def fail(ctx):
    if ctx.task_index == 1:
        raise KeyError("missing-feature")
    time.sleep(600)


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
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
