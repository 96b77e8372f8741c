"""Recovery on a real standalone cluster (master + two one-core workers from the pip pyspark): executor JVMs
SIGKILLed and train_fn processes os._exit'ed at different points of a step, each relaunch resuming from the
checkpoint; a peer's collective error taken as bad luck (the reported bug, with real MultiWorkerMirroredStrategy);
and a deterministic bug in train_fn still failing at once, without a relaunch. Failures at start are judged by what
they are: a pyarrow whose import fails (the real pyarrow beside a NumPy 1.26.4) is named once, on the executors and
on the driver; running out of file handles as a task starts is relaunched; a crash of Spark's Python worker that
repeats stops the run at the second."""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

import tfnb
from test_masters import STANDALONE_CONF, executor_jvm_pid, standalone
from tfnb.errors import ClusterError, WorkerError


def _die(how: str, mark: Path) -> None:
    mark.write_text(json.dumps(time.time()))  # when it died, for bench/chaos.py's time to recover
    if how == "executor":
        os.kill(executor_jvm_pid(), signal.SIGKILL)  # a lost node or a spot preemption
        time.sleep(60)  # taken down with the executor's Python worker, like any process of that node
    os._exit(7)  # the train_fn process dies on its own (a native crash, the OOM killer)


def chaos_fit(ctx, epochs, steps, kills, step_time=0.15):
    """A lock-step 'fit' without TensorFlow, checkpointing its finished epoch count to model_dir.

    ``kills`` maps an attempt to ``(task_index, epoch, point, how)``: the task dies at the start of step
    ``point`` (an int), during that step's work (``"mid"``: from another thread, at an arbitrary
    instruction), or between writing and publishing its checkpoint (``"ckpt"``). Returns the epoch this
    attempt resumed at and its attempt number; ``model_dir/epochs.jsonl`` lists every epoch each attempt began.
    """
    from tfnb._task.events import emit

    model_dir = Path(ctx.model_dir)
    ckpts = [model_dir / f"ckpt-{i}.json" for i in range(ctx.num_workers)]
    start = min(json.loads(p.read_text()) if p.exists() else 0 for p in ckpts)
    victim, kill_epoch, point, how = kills.get(ctx.attempt, (None, None, None, None))
    mine = victim == ctx.task_index
    for epoch in range(start, epochs):
        with open(model_dir / "epochs.jsonl", "a") as f:  # one short O_APPEND write: lines never interleave
            f.write(json.dumps({"attempt": ctx.attempt, "task": ctx.task_index, "epoch": epoch}) + "\n")
        for step in range(steps):
            emit("progress", epoch=epoch + 1, epochs=epochs, step=step + 1, steps=steps)
            if mine and epoch == kill_epoch and point == step:
                _die(how, model_dir / "killed_at.json")
            if mine and epoch == kill_epoch and point == "mid" and step == steps // 2:
                threading.Timer(step_time / 2, _die, args=(how, model_dir / "killed_at.json")).start()
            time.sleep(step_time)
        if mine and epoch == kill_epoch and point == "mid":
            threading.Event().wait()  # killed from the other thread: this epoch never counts as done
        tmp = ckpts[ctx.task_index].with_suffix(".part")
        tmp.write_text(json.dumps(epoch + 1))
        if mine and epoch == kill_epoch and point == "ckpt":
            _die(how, model_dir / "killed_at.json")
        os.replace(tmp, ckpts[ctx.task_index])
        while any(not p.exists() or json.loads(p.read_text()) < epoch + 1 for p in ckpts):
            time.sleep(0.05)  # the end-of-epoch all-reduce: wait for every peer
    return {"attempt": ctx.attempt, "start": start}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from conftest import spark_session

    with standalone(tmp_path_factory.mktemp("standalone")) as url:
        session = spark_session(url, **STANDALONE_CONF)
        yield session
        session.stop()


@pytest.fixture(autouse=True)
def no_tensorflow_preimport(monkeypatch):
    monkeypatch.setenv("TFNB_PREIMPORT", "")  # only the MWMS test imports TensorFlow
    # every attempt in a fresh child: a warm standby left by an earlier run would make how a process
    # died depend on which test ran before (a claimed standby's exit code is not its supervisor's to read)
    monkeypatch.setenv("TFNB_WARM", "0")


def _recover(cluster, model_dir: Path, kills: dict, epochs: int = 4):
    relaunches = []
    result = tfnb.run(chaos_fit, num_workers=2, args=(epochs, 3, kills), spark=cluster, model_dir=str(model_dir),
                      max_attempts=len(kills) + 1, timeout=600,
                      display=lambda e: relaunches.append(dict(e.data)) if e.kind == "attempt" else None)
    began = [json.loads(line) for line in (model_dir / "epochs.jsonl").read_text().splitlines()]
    status = json.loads((model_dir / "tfnb_status.json").read_text())
    return result, relaunches, began, status


@pytest.mark.parametrize("how, kills, starts", [
    # deaths at different points of a step, alternating between the worker and the chief; executor kills
    # cost a replacement executor each (seconds): repeated, they are chaos, for ./dev matrix and bench/chaos.py (one
    # lost executor stays in the suite: test_keras_mwms_recovers_from_a_lost_executor)
    pytest.param("executor", {1: (1, 1, "ckpt", "executor"), 2: (0, 2, "mid", "executor")}, {1: 0, 2: 1, 3: 2},
                 marks=pytest.mark.long),
    ("process", {1: (1, 1, 1, "process"), 2: (0, 2, "mid", "process"), 3: (1, 2, "ckpt", "process")},
     {1: 0, 2: 1, 3: 2, 4: 2}),
])
def test_repeated_kills_all_recover_and_resume(cluster, tmp_path, how, kills, starts, no_orphans):
    result, relaunches, began, status = _recover(cluster, tmp_path, kills)
    last = len(kills) + 1
    assert result["attempt"] == last and status["state"] == "succeeded"
    assert [r["attempt"] for r in relaunches] == list(range(2, last + 1))
    lost = "executor lost" if how == "executor" else "train_fn process exited with code 7"
    assert all(lost in r["reason"] for r in relaunches), relaunches
    victims = [f"{'chief' if v == 0 else 'worker'} {v}" for v, *_ in kills.values()]
    assert all(v in r["reason"] for v, r in zip(victims, relaunches)), relaunches
    # each relaunch resumed at the interrupted epoch: finished epochs were never trained twice
    assert {a: min(b["epoch"] for b in began if b["attempt"] == a) for a in starts} == starts
    assert [a["outcome"] for a in status["attempts"]] == ["failed"] * len(kills) + ["succeeded"]
    assert all(a["relaunched"] and a["retryable"] for a in status["attempts"][:-1])


def peer_error_then_fine(ctx):
    if ctx.attempt == 1 and ctx.is_chief:
        # what a survivor's all-reduce raises when its peer vanished, while that peer's own report is lost
        raise RuntimeError("{{function_node __wrapped__CollectiveReduceV2}} Collective ops is aborted by: "
                           "failed to connect to all addresses")
    return ctx.attempt


def test_peer_loss_error_alone_is_bad_luck(cluster, no_orphans):
    assert tfnb.run(peer_error_then_fine, num_workers=2, spark=cluster, max_attempts=2, display=False,
                    timeout=300) == 2


def shape_bug(ctx):
    raise ValueError(f"Input 0 is incompatible with the layer: expected shape=(None, 8), found (None, 7) "
                     f"on {ctx.job_name}")


def test_deterministic_bug_is_not_relaunched(cluster, tmp_path, no_orphans):
    seen = []
    with pytest.raises(WorkerError) as info:
        tfnb.run(shape_bug, num_workers=2, spark=cluster, max_attempts=3, model_dir=str(tmp_path),
                 display=seen.append, timeout=300)
    err = info.value
    assert err.exc_type == "ValueError" and "expected shape=(None, 8)" in str(err)
    assert not [e for e in seen if e.kind == "attempt"] and len(err.attempts) == 1
    assert err.attempts[0]["retryable"] is False and "raised ValueError" in err.attempts[0]["cause"]
    status = json.loads((tmp_path / "tfnb_status.json").read_text())
    assert status["state"] == "failed" and status["attempts"][0]["relaunched"] is False


def keras_fit_losing_an_executor(ctx, epochs):
    """tf-keras under MultiWorkerMirroredStrategy with BackupAndRestore; worker 1's executor JVM is
    SIGKILLed in the middle of epoch 2 of the first attempt, so the chief's all-reduce fails."""
    import tensorflow as tf

    from test_training import random_binary_dataset

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ds = random_binary_dataset(ctx)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(1, activation="sigmoid")])
        model.compile("sgd", "binary_crossentropy")
    began = []

    class Chaos(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            began.append(epoch)

        def on_train_batch_end(self, batch, logs=None):
            if ctx.attempt == 1 and ctx.task_index == 1 and len(began) == 2 and batch == 1:
                os.kill(executor_jvm_pid(), signal.SIGKILL)
                time.sleep(60)  # no further step: this process goes down with its executor

    backup = tf.keras.callbacks.BackupAndRestore(os.path.join(ctx.model_dir, "backup"))
    model.fit(ds, epochs=epochs, steps_per_epoch=4, callbacks=[backup, Chaos()], verbose=0)
    return {"attempt": ctx.attempt, "began": began}


def test_keras_mwms_recovers_from_a_lost_executor(cluster, tmp_path, no_orphans, monkeypatch):
    monkeypatch.setenv("TFNB_PREIMPORT", "tensorflow")
    seen = []
    result = tfnb.run(keras_fit_losing_an_executor, num_workers=2, args=(3,), spark=cluster,
                      model_dir=str(tmp_path), max_attempts=2, timeout=600, display=seen.append)
    relaunch = [e.data for e in seen if e.kind == "attempt"]
    assert result["attempt"] == 2 and len(relaunch) == 1, relaunch
    assert result["began"] == [1, 2]  # epoch 0 was done; epoch 1, interrupted, is the only one trained twice


@pytest.mark.parametrize("exc_type, message, retryable", [
    # the survivor's error from issue 15, as the train_fn process reports it
    ("tensorflow.python.framework.errors_impl.UnavailableError",
     "{{function_node __wrapped__CollectiveReduceV2_device_/job:worker/replica:0/task:0/device:CPU:0}} "
     "Collective ops is aborted by: failed to connect to all addresses", True),
    ("tensorflow.python.framework.errors_impl.CancelledError", "Cancelled", True),
    ("tensorflow.python.framework.errors_impl.AbortedError", "Socket closed", True),
    ("tensorflow.python.framework.errors_impl.DeadlineExceededError", "Deadline Exceeded", True),
    ("tensorflow.python.framework.errors_impl.InternalError", "Connection reset by peer", True),
    ("ProcessDied", "the train_fn process was killed by SIGKILL", True),
    ("ValueError", "Input 0 is incompatible with the layer", False),
    ("tensorflow.python.framework.errors_impl.InvalidArgumentError", "Incompatible shapes: [32,8] vs. [32,7]", False),
    ("mymodule.UnavailableError", "my own service is down", False),  # not TensorFlow's
])
def test_which_failures_are_bad_luck(exc_type, message, retryable):
    from tfnb.errors import TaskFailure

    assert TaskFailure("chief", 0, exc_type, message).retryable is retryable


# ---------------------------------------------------------------- failures at start, judged by what they are


def one(ctx):
    return 1


def _attempts(seen) -> list:
    return [e.data for e in seen if e.kind == "attempt"]


class BrokenPyarrow:
    """On the driver: ``import pyarrow`` fails as pyarrow 26 fails beside NumPy 1.26 (this process's pyarrow,
    already loaded, is put back after the test)."""

    def find_spec(self, name, path=None, target=None):
        if name == "pyarrow":
            raise ImportError("pyarrow requires NumPy 2.0 or newer, found 1.26.4")
        return None


def test_a_pyarrow_that_cannot_import_is_named_not_relaunched(cluster, tmp_path, monkeypatch, no_orphans):
    import pyarrow

    major = int(pyarrow.__version__.split(".")[0])
    if major < 26:
        pytest.skip(f"pyarrow {pyarrow.__version__} imports beside NumPy 1.26; the check came with pyarrow 26")
    # the executors' Python: this venv's packages, the real pyarrow among them, beside a NumPy that says 1.26.4
    # (what `pip install tensorflow==2.16` leaves: NumPy pinned below 2, pyarrow 26 kept)
    venv = tmp_path / "numpy1"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, env=env)
    site = Path(glob.glob(str(venv / "lib" / "python3.*" / "site-packages"))[0])
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith("numpy"):
            (site / entry.name).symlink_to(entry)
    (site / "numpy").mkdir()
    (site / "numpy" / "__init__.py").write_text('__version__ = "1.26.4"\n')
    python = str(venv / "bin" / "python")
    with monkeypatch.context() as m:
        m.setattr(cluster.sparkContext, "pythonExec", python)
        seen = []
        with pytest.raises(ClusterError) as info:
            tfnb.run(one, num_workers=2, spark=cluster, max_attempts=2, display=seen.append, timeout=300)
    text = str(info.value)
    print(text)
    first = text.splitlines()[0]
    assert re.match(r"executor \S+'s Python 3\.\d+\.\d+ cannot import pyarrow \(ImportError: pyarrow requires NumPy "
                    rf"2\.0 or newer, found 1\.26\.4\); install NumPy >= 2\.0 there, or pip install 'pyarrow<{major}'$",
                    first) and len(first) <= 200, first
    assert not _attempts(seen) and "did not relaunch it (max_attempts=2)" in text
    assert python in text and 'File "pyarrow/lib.pyx"' in text  # pyarrow's own check raised it
    assert not any(s in text for s in ("TaskLost", "collectToPython", "spark -1", "at org.apache")), text

    # the driver on such a Python too: pyspark says only "PyArrow >= ... must be installed; it was not found"
    monkeypatch.delitem(sys.modules, "pyarrow")
    monkeypatch.setattr(sys, "meta_path", [BrokenPyarrow(), *sys.meta_path])
    seen = []
    with pytest.raises(ClusterError) as info:
        tfnb.run(one, num_workers=2, spark=cluster, max_attempts=2, display=seen.append, timeout=300)
    text = str(info.value)
    print(text)
    assert text.startswith("the driver's Python 3.") and "cannot import pyarrow (ImportError: pyarrow requires NumPy " \
        "2.0 or newer, found 1.26.4); install NumPy >= 2.0 there" in text.splitlines()[0], text
    assert "pyspark checks pyarrow >= " in text and f"The driver's Python: {sys.executable}" in text
    assert not _attempts(seen) and "PACKAGE_NOT_INSTALLED" not in text


BOOT_HOOK = '''
import os, sys

MODE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mode")


def boot(event, args):
    """As tfnb's task in Spark's Python worker reads its spec: "emfile" fails once (out of file handles), "segv"
    crashes the worker."""
    if event != "pickle.find_class" or args[1] != "TaskSpec" or "pyspark.worker" not in sys.modules:
        return
    with open(MODE) as f:
        mode = f.read()
    if mode == "segv":
        import ctypes
        ctypes.string_at(0)
    if mode == "emfile":
        try:  # the first task to get here
            os.close(os.open(MODE + ".failed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        import errno
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))


sys.addaudithook(boot)
'''


def test_out_of_file_handles_at_start_is_relaunched_a_crash_that_repeats_is_not(cluster, tmp_path, monkeypatch,
                                                                                 no_orphans):
    # executors whose Spark workers start through a sitecustomize.py that fails tfnb's task as the file mode says
    (tmp_path / "sitecustomize.py").write_text(BOOT_HOOK)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{tmp_path}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    monkeypatch.setattr(cluster.sparkContext, "pythonExec", str(python))
    mode = tmp_path / "mode"

    mode.write_text("emfile")  # one task, once: no missing install, a relaunch starts
    seen = []
    assert tfnb.run(one, num_workers=2, spark=cluster, max_attempts=2, display=seen.append, timeout=300) == 1
    reason = [a["reason"] for a in _attempts(seen)]
    assert len(reason) == 1 and "could not start: OSError: [Errno 24] Too many open files" in reason[0], reason

    mode.write_text("segv")  # every launch: the second identical crash stops the run, whatever max_attempts says
    seen = []
    with pytest.raises(ClusterError) as info:
        tfnb.run(one, num_workers=2, spark=cluster, max_attempts=4, display=seen.append, timeout=300)
    text = str(info.value)
    print(text)
    assert [a["reason"] for a in _attempts(seen)] == ["a task's Spark Python worker crashed (Python worker exited "
                                                       "unexpectedly)"]
    first = text.splitlines()[0]
    assert re.match(r"Spark's Python worker on executor \S+ crashed the same way on two launches in a row; ", first) \
        and len(first) <= 200, first
    assert "stopped relaunching (max_attempts=4)" in text and "faulthandler.enabled" in text
