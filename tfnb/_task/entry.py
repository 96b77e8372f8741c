"""One barrier task, in Spark's Python worker: learn the peers, set TF_CONFIG, run train_fn in a child process.
It takes a :class:`TaskSpec` of plain values and the task's Arrow batches, and yields the chief's pickled result."""
from __future__ import annotations

import importlib
import json
import os
import pickle
import shutil
import socket
import sys
import tempfile
import traceback
from typing import Iterator

from .._protocol import RESULT, Msg
from .context import WorkerContext
from .setup import TaskSpec, assign_role, assigned_gpus, reserve_port, tf_config_for
from .supervisor import _failure_from_child, _Supervisor

RESULT_SCHEMA = "rank int, result binary"
BOOT_MARK = "tfnb-boot"  # <tfnb-boot>{json}</tfnb-boot>: why a task could not start, in Spark's job error
# what train_fn's WorkerContext takes from the TaskSpec as it is
_FROM_SPEC = ("num_workers", "num_ps", "model_dir", "log_dir", "attempt", "max_attempts", "run_id", "profile_steps",
              "profile_run", "settings", "requested_workers", "resized_from", "min_workers")


class TaskFailed(RuntimeError):
    """Raised in the Spark task so the barrier stage fails; the driver already has the details."""


def task_entry(spec_blob: bytes, version: str, package: str = __name__.split(".")[0]):
    """The run's ``mapInArrow`` function: ``run_task`` behind a closure of plain values, shipped by value, so an
    executor lacking tfnb or cloudpickle (or with another tfnb) fails with one line the driver finds in the job's
    error (tfnb.launcher.verdict), not a ModuleNotFoundError inside Spark's unpickling."""
    def tfnb_task(batches):  # stdlib modules travel by name, the rest by value: no global of tfnb here
        info = None
        try:
            installed = importlib.import_module(package).__version__  # the executor's own, whatever its version
            if installed != version:
                info = {"version": installed}
            else:
                run_task = importlib.import_module("tfnb._task.entry").run_task
                # train_fn and its result travel by cloudpickle: missing, the executor cannot start tfnb
                importlib.import_module("cloudpickle")
                spec = pickle.loads(spec_blob)
        except BaseException as e:  # noqa: BLE001 - whatever stops tfnb loading goes to the driver
            info = {"exc_type": type(e).__name__, "message": str(e)[:1000], "module": getattr(e, "name", None),
                    "traceback": "".join(traceback.format_exc().splitlines(True)[-12:])}
        if info is not None:
            try:
                from pyspark import BarrierTaskContext

                bctx = BarrierTaskContext.get()
                host = bctx.getTaskInfos()[bctx.partitionId()].address.rsplit(":", 1)[0]
            except Exception:  # noqa: BLE001 - the hostname says as much
                host = socket.gethostname()
            info.update(host=host, python=sys.executable, python_version=sys.version.split()[0])
            raise RuntimeError(f"<{BOOT_MARK}>{json.dumps(info)}</{BOOT_MARK}>")  # a str: pickled by value
        yield from run_task(spec, batches)

    return tfnb_task


def run_task(spec: TaskSpec, batches: Iterator, place: tuple | None = None) -> Iterator:
    """The barrier task body: one TensorFlow task of the cluster. ``place`` is ``(rank, host, resources)`` for a
    task outside Spark (a ps on the driver, tfnb._task.local); by default the barrier task's own."""
    import pyarrow as pa

    from .._protocol import batch_window
    from .channel import TaskChannel

    if place is None:
        from pyspark import BarrierTaskContext

        bctx = BarrierTaskContext.get()
        part = bctx.partitionId()
        place = (spec.first_rank + part,  # the ps tasks' own job starts at rank num_workers
                 bctx.getTaskInfos()[part].address.rsplit(":", 1)[0], bctx.resources())
    rank, host, resources = place
    job_name, task_index = assign_role(rank, spec.num_workers, spec.num_ps)
    # Spark deletes its local dirs when the application ends, even after a task killed before its clean-up
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]
    workdir = tempfile.mkdtemp(prefix=f"tfnb-{spec.run_id}-a{spec.attempt}-{rank}-",
                               dir=local if os.path.isdir(local) else None)
    sup, chan = _Supervisor(spec, workdir), None
    try:
        peer = {"job_name": job_name, "task_index": task_index, "rank": rank, "host": host}
        # the driver gone, nobody reads the run: stop
        chan = sup.chan = TaskChannel(spec.channel, spec.token, peer, on_message=sup.on_driver, on_lost=sup.stop,
                                      window=batch_window(spec.num_workers + spec.num_ps))
        gpus = assigned_gpus(resources, spec.use_gpu, job_name)
        chan.send(Msg.STATE, state="starting", pid=os.getpid(), gpus=list(gpus))
        mode = "serve" if spec.num_ps > 0 and job_name != "chief" else "train"
        with reserve_port() as held:
            port = held.getsockname()[1]
            sup.start(mode, gpus, held)
        fed = feed_info = None
        if spec.hooks.feeder is not None:
            fed = spec.hooks.feeder.spill(batches, workdir)  # tfnb.compat: the whole partition before train_fn
        elif spec.feed is None:
            for _ in batches:
                pass
        # addresses through the driver, not Spark's allGather (a one-second poll), in a frame of its own
        chan.send_apart(Msg.ADDR, addr=f"{host}:{port}", rows=fed.rows if fed is not None else 0)
        sup.gathered.wait()
        if not sup.cluster:  # stopped first
            chan.send(Msg.STATE, state="stopped")
            return
        gathered = sup.cluster["tasks"]
        here = sum(g["addr"].rsplit(":", 1)[0] == host for g in gathered)  # this run's tasks on this host
        tf_config = tf_config_for([g["addr"] for g in gathered], job_name, task_index, spec.num_workers, spec.num_ps)
        if spec.hooks.feeder is not None:
            feed_info = spec.hooks.feeder.finish(fed, [g["rows"] for g in gathered])
        elif spec.feed is not None:
            from .feed import FeedStream

            sup.feed = FeedStream(spec.feed, workdir, spec.num_workers, tasks_here=here,
                                  counts=sup.cluster.get("counts"))
            if sup.stop_requested.is_set():
                sup.feed.abort()
            feed_info = sup.feed.info
        ctx = WorkerContext(task_index=task_index, job_name=job_name, cluster_spec=tf_config["cluster"],
                            tf_config=tf_config, gpus=gpus, host=host, local_dir=workdir, feed=feed_info,
                            **{name: getattr(spec, name) for name in _FROM_SPEC})
        sup.release(ctx, mode)
        if sup.feed is not None:
            sup.feed.pump(batches, lambda rows, done: chan.send_apart(Msg.FEED, rows=rows, done=done))
        code = sup.wait()
        done_sent = code is None
        if code is None:  # train_fn returned; its TensorFlow server stays up for the peers' last collectives
            chan.send(Msg.STATE, state="done")
            sup.released.wait()  # the driver says "end" once every task is done, "stop" if one failed
            code = sup.end()
        if sup.stop_requested.is_set() and code != 0:
            chan.send(Msg.STATE, state="stopped")
            return
        if code == 0 and mode == "train" and not os.path.exists(os.path.join(workdir, RESULT)):
            code = None  # os._exit(0) before train_fn returned: a death, not a success
        if code != 0:
            failure = _failure_from_child(workdir, code, mode)
            if chan.send(Msg.FAILED, failure=failure):
                return  # the driver has the details: no second copy of the traceback in the executor log
            raise TaskFailed(f"{job_name} {task_index}: {failure['exc_type']}: {failure['message']}")
        if not done_sent:
            chan.send(Msg.STATE, state="done")
        if rank == 0 or spec.hooks.all_results:
            with open(os.path.join(workdir, RESULT), "rb") as f:
                data = f.read()
            yield pa.RecordBatch.from_pydict({"rank": [rank], "result": [data]},
                                             schema=pa.schema([("rank", pa.int32()), ("result", pa.binary())]))
    except BaseException as e:
        if chan is not None and not isinstance(e, TaskFailed):  # a TaskFailed's details are the driver's already
            chan.send(Msg.FAILED, failure={"exc_type": type(e).__name__, "message": str(e),
                                         "traceback": traceback.format_exc()})
        raise
    finally:
        sup.kill()
        if sup.feed is not None:
            sup.feed.remove()
        if chan is not None:
            chan.close()
        shutil.rmtree(workdir, ignore_errors=True)
