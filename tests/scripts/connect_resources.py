"""Per-run resources on a Spark Connect session (no SparkContext, no RDDs): the profile goes through
``mapInArrow(..., profile=)``, registered with the server. The server runs local-cluster[2,2,1024] whose
workers advertise two (stub) GPUs each. Run by tests/test_resources.py in its own process (a Connect
session and a classic one don't mix); prints one JSON line ``RESULT {...}``."""
import json
import os
import sys

os.environ["PYSPARK_PYTHON"] = sys.executable

import connect_lock  # noqa: E402,F401  (one remote("local...") server at a time on this machine)

from pyspark.sql import SparkSession  # noqa: E402

import tfnb  # noqa: E402
from tfnb.errors import ClusterError  # noqa: E402


def gpus(ctx):
    return {"gpus": list(ctx.gpus), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}


def main(script):
    spark = (SparkSession.builder.remote("local-cluster[2,2,1024]")
             .config("spark.worker.resource.gpu.amount", "2").config("spark.worker.resource.gpu.discoveryScript", script)
             .config("spark.executor.resource.gpu.amount", "2").getOrCreate())
    out = {"connect": type(spark).__module__}
    try:
        options = dict(num_workers=2, spark=spark, display=False, preimport=(), warm=False, timeout=300)
        out["two"] = tfnb.run(gpus, gpus_per_worker=2, **options)
        out["one"] = tfnb.run(gpus, gpus_per_worker=1, **options)
        try:
            tfnb.run(gpus, **{**options, "num_workers": 3, "gpus_per_worker": 2})
        except ClusterError as e:
            out["refused"] = str(e)
    finally:
        spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
