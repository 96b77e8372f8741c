"""tfnb's per-run resources on a real Spark 3.5 (classic session, standalone master): the profile goes on
``RDD.barrier().withResources``. Run by tests/test_resources.py with a Spark 3.5 virtualenv's Python against
a standalone cluster started from that Spark; prints one JSON line ``RESULT {...}``."""
import json
import os
import sys

os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession  # noqa: E402

import tfnb  # noqa: E402
from tfnb.launcher import EventKind  # noqa: E402
from tfnb.launcher.resources import spark_version  # noqa: E402


def gpus(ctx):
    return {"gpus": list(ctx.gpus), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}


def main(master):
    spark = (SparkSession.builder.master(master).appName("tfnb-resources-3.5")
             .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
             .config("spark.executor.cores", "2").config("spark.cores.max", "4")
             .config("spark.executor.memory", "512m").config("spark.executor.resource.gpu.amount", "2")
             .config("spark.task.resource.gpu.amount", "1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    out = {"spark": spark.version}
    try:
        options = dict(num_workers=2, spark=spark, display=False, preimport=(), warm=False, timeout=300)
        out["conf"] = tfnb.run(gpus, **options)
        out["two"] = tfnb.run(gpus, gpus_per_worker=2, **options)
        states = {}

        def keep(event):
            if event.kind == EventKind.STATE and "gpus" in event.data:
                states[f"{event.job_name} {event.task_index}"] = event.data["gpus"]

        out["ps_run"] = tfnb.run(gpus, **{**options, "num_ps": 1, "display": keep, "max_attempts": 1})
        out["ps_states"] = states
        out["placement"] = repr(tfnb.launcher.check_cluster(spark, 3, num_ps=1))
        out["version"] = list(spark_version(spark.version))
    finally:
        spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
