"""Elastic runs on a real standalone cluster started from the pip pyspark: a Worker daemon and its executor die with
nothing to replace them, the run goes on with fewer workers from its checkpoint, and grows back at an epoch boundary
once a Worker daemon starts again (tfnb/launcher/elastic.py, tfnb/_task/resize.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import tfnb
from tfnb import ClusterError
from tfnb.launcher import EventKind

from test_masters import _master_url, _wait_for_workers, executor_jvm_pid

GLOBAL_BATCH = 96  # split evenly by 3 and by 2 workers: the same gradient, whatever the size
ROWS = 6 * GLOBAL_BATCH


class Cluster:
    """A standalone master and single-core Worker daemons that a test adds one at a time."""

    def __init__(self, folder: Path):
        import pyspark

        self.folder, self.home = folder, os.path.dirname(pyspark.__file__)
        self.env = dict(os.environ, SPARK_HOME=self.home, SPARK_LOG_DIR=str(folder / "logs"),
                        SPARK_WORKER_DIR=str(folder / "work"),
                        # a Worker daemon told SIGPWR decommissions itself and its executors (a spot node's notice)
                        SPARK_WORKER_OPTS="-Dspark.decommission.enabled=true")
        self.procs: list[subprocess.Popen] = []
        self._start("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
                    "--webui-port", "0")
        self.log = folder / "daemon-0.log"
        self.url = _master_url(self.log, time.monotonic() + 60)

    def _start(self, *args, gate: Path | None = None) -> None:
        log = open(self.folder / f"daemon-{len(self.procs)}.log", "w")
        command = [os.path.join(self.home, "bin", "spark-class"), *args]
        if gate is not None:  # started now (the leak check counts it as the fixture's), running once gate exists
            command = ["sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.2; done; shift; exec "$@"', str(gate), "-",
                       *command]
        self.procs.append(subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))

    def add_worker(self, gate: Path | None = None) -> None:
        self._start("org.apache.spark.deploy.worker.Worker", "--cores", "1", "--memory", "1g", "--host", "127.0.0.1",
                    "--webui-port", "0", self.url, gate=gate)

    def close(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from conftest import spark_session

    c = Cluster(tmp_path_factory.mktemp("elastic"))
    try:
        for _ in range(3):
            c.add_worker()
        c.spare = c.folder / "start-the-spare-worker"
        c.add_worker(gate=c.spare)  # the Worker daemon that comes back during the run
        _wait_for_workers(c.log, 3, time.monotonic() + 120)
        c.session = spark_session(c.url, **{"spark.driver.host": "127.0.0.1", "spark.executor.memory": "768m",
                                            "spark.cores.max": "3", "spark.executor.cores": "1",
                                            "spark.decommission.enabled": "true"})
        yield c
        c.session.stop()
    finally:
        c.close()


def lose_this_node() -> None:
    """SIGKILL this task's Worker daemon, then its executor JVM: a spot node gone, nothing left to replace it."""
    jvm = executor_jvm_pid()
    worker = int(next(l.split()[1] for l in Path(f"/proc/{jvm}/status").read_text().splitlines()
                      if l.startswith("PPid:")))
    os.kill(worker, signal.SIGKILL)
    os.kill(jvm, signal.SIGKILL)
    time.sleep(60)  # no further step: this process goes down with its executor


def _model(keras, ids: Path | None = None):
    """The digits MLP; its input's last column is the row's id, which it leaves out (writing, while training,
    the ids of the rows each step trains on to ``ids``)."""
    import tensorflow as tf

    class Ids(keras.layers.Layer):
        def call(self, x, training=None):
            if training and ids is not None:
                def write(batch):
                    with ids.open("a") as f:
                        f.write(" ".join(str(int(i)) for i in batch.numpy().ravel()) + "\n")
                    return batch
                x = tf.concat([x[:, :64], tf.py_function(write, [x[:, 64:]], tf.float32)], axis=1)
            return x[:, :64]

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((65,)), Ids(), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def digits():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return np.hstack([x / 16.0, np.arange(len(x))[:, None]]).astype("float32"), y


def elastic_fit(ctx, epochs):
    """Keras 3 on the fed DataFrame through ctx.dataset, GLOBAL_BATCH rows a step at every size (each worker takes
    GLOBAL_BATCH // num_workers), BackupAndRestore, 1.5 s more per epoch while smaller; every worker writes the ids of the rows it
    trains on. The last worker of the first launch loses its node after epoch 1's backup."""
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = _model(keras, Path(ctx.model_dir, f"ids-{ctx.attempt}-{ctx.task_index}.txt"))
    per_worker = GLOBAL_BATCH // ctx.num_workers  # the global batch, and so the learning dynamics, stay the same
    train = ctx.dataset(per_worker, label_col="label", strategy=strategy)
    began = []

    class Pace(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            began.append(epoch)
            Path(ctx.model_dir, f"launch-{ctx.attempt}.json").write_text(json.dumps({
                "num_workers": ctx.num_workers, "requested": ctx.requested_workers, "resized_from": ctx.resized_from,
                "began": began, "steps": ctx.steps_per_epoch(per_worker), "per_worker": per_worker}))

        def on_epoch_end(self, epoch, logs=None):
            if ctx.attempt == 1 and ctx.task_index == ctx.num_workers - 1 and epoch == 1:
                lose_this_node()
            if ctx.num_workers < ctx.requested_workers:
                time.sleep(1.5)  # time for a Worker daemon to come back while the run is smaller

    model.fit(train, epochs=epochs, steps_per_epoch=ctx.steps_per_epoch(per_worker), verbose=0, callbacks=[
        ctx.progress_callback(), keras.callbacks.BackupAndRestore(os.path.join(ctx.model_dir, "backup")), Pace()])
    x, y = digits()
    return {"accuracy": float(model.evaluate(x[ROWS:], y[ROWS:], verbose=0)[1])}


def one_process_accuracy(epochs):
    import keras

    x, y = digits()
    model = _model(keras)
    model.fit(x[:ROWS], y[:ROWS], batch_size=GLOBAL_BATCH, epochs=epochs, shuffle=False, verbose=0)
    return float(model.evaluate(x[ROWS:], y[ROWS:], verbose=0)[1])


def epochs_read(folder: Path, launch: dict, attempt: int) -> list[list[int]]:
    """Per epoch the launch trained to its end: the ids of the rows its workers trained on."""
    size = launch["steps"] * launch["per_worker"]
    streams = []
    for i in range(launch["num_workers"]):
        text = (folder / f"ids-{attempt}-{i}.txt").read_text().split()
        streams.append([int(float(v)) for v in text])
    return [sorted(v for s in streams for v in s[e * size:(e + 1) * size]) for e in range(len(launch["began"]))]


@pytest.mark.long  # ./dev matrix: a node killed and one started (~100 s); `./dev bench elastic` does it under chaos
@pytest.mark.timeout(900)
def test_a_lost_node_shrinks_the_run_and_a_returning_one_grows_it_back(cluster, tmp_path, no_orphans):
    seen = []

    def display(event):
        seen.append(event)
        if event.kind == EventKind.ATTEMPT and (event.data.get("resize") or {}).get("to") == 2:
            cluster.spare.touch()  # the run goes on with two: now a Worker daemon comes back

    epochs = 12
    x, y = digits()
    df = cluster.session.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x[:ROWS], y[:ROWS])],
                                         "features array<float>, label long")
    result = tfnb.run(elastic_fit, num_workers=3, min_workers=2, replace_wait=5, args=(epochs,), spark=cluster.session,
                      data=df, model_dir=str(tmp_path), max_attempts=1, display=display, timeout=800)
    status = json.loads((tmp_path / "tfnb_status.json").read_text())
    attempts = status["attempts"]
    # max_attempts=1: the lost node cost no failed launch, since the run shrank (a resize is not a failure)
    assert [a["outcome"] for a in attempts] == ["failed", "resized", "succeeded"], attempts
    assert [a["workers"] for a in attempts] == [3, 2, 3]
    assert attempts[0]["resize"] == {"from": 3, "to": 2, "why": "executor lost, no replacement in 5 s"}
    assert attempts[1]["resize"] == {"from": 2, "to": 3, "why": "executors returned"}
    launches = [json.loads((tmp_path / f"launch-{n}.json").read_text()) for n in (1, 2, 3)]
    assert [(l["num_workers"], l["requested"], l["resized_from"]) for l in launches] == \
        [(3, 3, None), (2, 3, 3), (3, 3, 2)]
    # no epoch lost beyond the one in progress at the loss: each launch starts where the last one's backup was
    assert launches[0]["began"][:2] == [0, 1] and launches[1]["began"][0] == 2
    # the widening launch starts right after the epoch the smaller one finished (its boundary came first)
    assert launches[2]["began"][0] == launches[1]["began"][-1] + 1 and launches[2]["began"][-1] == epochs - 1
    relaunches = [e.data for e in seen if e.kind == EventKind.ATTEMPT]
    assert "resized 3 → 2 workers" in relaunches[0]["reason"] and "resized 2 → 3" in relaunches[1]["reason"]
    # the fed DataFrame follows the size: every row read once per epoch at 3, at 2 and at 3 workers again
    for attempt, launch in enumerate(launches, 1):
        for read in epochs_read(tmp_path, launch, attempt):
            assert read == list(range(ROWS)), (attempt, launch["num_workers"])
    # the same global batch at every size: as accurate as one undisturbed process over batches of that size
    assert result["accuracy"] == pytest.approx(one_process_accuracy(epochs), abs=0.03)


class ReturnAtLaunch:
    """Stands in for tfnb.launcher.elastic.Watch: executors "return" as each launch starts, before its tasks are even
    scheduled (the moment a real return is hardest to catch), so the resize is asked of tasks not yet connected."""

    def __init__(self, spark, placement, num_ps, size, wanted, resize, tag=None):
        self.why, self.resize = None, resize

    def __enter__(self):
        self.why = "executors returned"
        self.resize()
        return self

    def __exit__(self, *exc):
        pass


def loop_with_own_error_handling(ctx, epochs):
    """A custom loop without TensorFlow (one worker, so the epoch-boundary vote needs no collective), with the error
    handling train_fns have: a catch-all around each epoch's start, and its own error raised from anything else. Its
    second launch calls no epoch boundary at all."""
    ckpt = Path(ctx.model_dir, "epoch")
    start = int(ckpt.read_text()) if ckpt.exists() else 0
    try:
        for epoch in range(start, epochs):
            if epoch > start and ctx.attempt == 1:
                try:
                    ctx.epoch_boundary(None, epoch)
                except Exception:  # noqa: BLE001 - logged and carried on, as a train_fn may: a resize goes through
                    pass
            time.sleep(0.3)
            ckpt.write_text(str(epoch + 1))
    except BaseException as e:
        raise RuntimeError("train_fn's own error") from e
    return {"attempt": ctx.attempt, "start": start}


def test_a_return_while_the_launch_starts_grows_it_or_is_said_to_be_lost(cluster, tmp_path, monkeypatch):
    """A resize asked while the tasks are being scheduled reaches them with the cluster's addresses (a broadcast then
    reaches no task); one that train_fn catches and re-raises as its own error is still a resize. A launch whose
    train_fn reaches no epoch boundary goes on at its size, and says why, once."""
    monkeypatch.setattr("tfnb.launcher.elastic.Watch", ReturnAtLaunch)
    monkeypatch.setenv("TFNB_PREIMPORT", "")  # no TensorFlow in this train_fn: its processes start without it
    seen = []
    result = tfnb.run(loop_with_own_error_handling, num_workers=1, min_workers=1, args=(3,), spark=cluster.session,
                      model_dir=str(tmp_path), max_attempts=1, display=seen.append, timeout=300)
    attempts = json.loads((tmp_path / "tfnb_status.json").read_text())["attempts"]
    assert [a["outcome"] for a in attempts] == ["resized", "succeeded"], attempts
    assert attempts[0]["cause"] == "executors returned" and result == {"attempt": 2, "start": 1}
    said = [e.data["line"] for e in seen if e.kind == EventKind.LOG and e.job_name == "driver"]
    assert len(said) == 1, said
    assert said[0].startswith("tfnb: the run could not grow back to 1 workers when executors returned, and went on "
                              "with 1: train_fn never reached an epoch boundary") and \
        "Add ctx.progress_callback() to model.fit(callbacks=[...]) on every worker" in said[0], said[0]
    log_file = next(e.data["log_file"] for e in seen if e.kind == EventKind.STATE and e.data.get("log_file"))
    assert "could not grow back" in Path(log_file).read_text()


def vote_on_the_chief_only(ctx):
    """What ctx.progress_callback() in the chief's model.fit alone does, without TensorFlow: the chief joins the
    epoch-boundary vote at fit's start and reports its first epoch's end; then every worker waits, as in the
    one-sided vote."""
    from tfnb._task.events import emit
    from tfnb._task.resize import join_vote

    if ctx.task_index == 0 and ctx.job_name == "chief":
        join_vote(ctx)
        emit("progress", epoch=1, epochs=3, step=4, steps=4, epoch_end=True)
    time.sleep(600)


def test_a_vote_on_some_workers_only_is_refused_before_it_hangs(cluster, monkeypatch):
    monkeypatch.setenv("TFNB_PREIMPORT", "")  # no TensorFlow in this train_fn
    started = time.monotonic()
    with pytest.raises(tfnb.ConfigError) as info:
        tfnb.run(vote_on_the_chief_only, num_workers=2, min_workers=1, spark=cluster.session, display=False,
                 stall_timeout=300, timeout=300)
    assert time.monotonic() - started < 120
    assert str(info.value).startswith("worker 1 takes no part in this elastic run's epoch-boundary vote, which chief 0 "
                                      "takes at every epoch start"), info.value
    assert "Add ctx.progress_callback() to model.fit(callbacks=[...]) on every worker, not only on the chief" in \
        str(info.value)


def test_below_min_workers_waits_then_names_the_room(cluster):
    from tfnb.launcher.elastic import next_size, worker_room
    from tfnb.launcher.resources import Ask, Placement

    placement = Placement(workers=Ask(1, 0.0))
    have = worker_room(cluster.session, placement, 0)
    started = time.monotonic()
    with pytest.raises(ClusterError) as info:
        next_size(cluster.session, placement, 0, wanted=have + 2, minimum=have + 1, wait=3)
    took = time.monotonic() - started
    text = str(info.value)
    assert f"can hold {have} of this run's workers, fewer than min_workers={have + 1}" in text.splitlines()[0], text
    assert "within 3 s" in text and f"{have} executor" in text, text
    assert 3 <= took < 3 + 5, took


def hold_a_slot(folder: str):
    """A one-task barrier job's body: writes its Worker daemon's pid to ``folder``, then holds the slot."""
    def task(_):
        from test_masters import executor_jvm_pid

        jvm = executor_jvm_pid()
        daemon = next(l.split()[1] for l in Path(f"/proc/{jvm}/status").read_text().splitlines()
                      if l.startswith("PPid:"))
        Path(folder, f"{os.getpid()}.pid").write_text(daemon)
        time.sleep(300)
        yield 0
    return task


def holding(session, group: str, folder: Path) -> int:
    """Starts a job in job group ``group`` whose one task holds a slot; the pid of the Worker daemon it runs under."""
    import contextlib
    import threading

    folder.mkdir()

    def job():
        session.sparkContext.setJobGroup(group, group, interruptOnCancel=True)
        with contextlib.suppress(Exception):  # cancelled at the end of the test
            session.sparkContext.parallelize([0], 1).barrier().mapPartitions(hold_a_slot(str(folder))).collect()

    threading.Thread(target=job, daemon=True).start()
    end = time.monotonic() + 60
    while not list(folder.glob("*.pid")) and time.monotonic() < end:
        time.sleep(0.2)
    return int(next(folder.glob("*.pid")).read_text())


def test_a_notice_or_a_busy_slot_counts_only_where_the_run_is(cluster, tmp_path):
    """What a spot cluster's notice looks like from the driver: SIGPWR to a Worker daemon (Spark's decommission
    signal) makes its executor a leaving one. An elastic run stops for it at its next epoch boundary only when one of
    its own tasks runs there (tfnb.launcher.elastic.Watch); and the room it grows into is free slots, not cores
    another job's tasks hold. Here "the run" is a job in the run's job group holding one slot, beside another job's."""
    import threading

    from tfnb.launcher.elastic import _POLL, Watch, leaving, run_executors, worker_room
    from tfnb.launcher.resources import Ask, Placement

    placement, session = Placement(workers=Ask(1, 0.0)), cluster.session
    assert leaving(session) == frozenset()
    before = worker_room(session, placement, 0)
    mine, other = "tfnb-test-mine-1", "tfnb-test-other-1"
    try:
        mine_daemon = holding(session, mine, tmp_path / "mine")
        other_daemon = holding(session, other, tmp_path / "other")
        own = run_executors(session, mine)
        assert sum(own.values()) == 1, own
        # the status store counts a task once its start event is handled, a moment after the task itself started
        status, end = session.sparkContext._jsc.sc().statusStore(), time.monotonic() + 60
        while time.monotonic() < end:
            listed = status.executorList(True)
            if sum(listed.apply(i).activeTasks() for i in range(listed.size())) >= 2:
                break
            time.sleep(0.2)
        # the other job's slot is no room; the run's own is (it frees it when it stops)
        assert worker_room(session, placement, 0, own) == before - 1
        fired = threading.Event()
        with Watch(session, placement, 0, 1, 1, fired.set, tag=mine) as watch:
            os.kill(other_daemon, signal.SIGPWR)
            end = time.monotonic() + 60
            while not leaving(session) and time.monotonic() < end:
                time.sleep(0.2)
            assert len(leaving(session)) == 1, "no executor was seen leaving within 60 s"
            assert worker_room(session, placement, 0) == before - 2  # leaving: no room either
            time.sleep(3 * _POLL)
            assert not fired.is_set(), watch.why  # another job's node: the run goes on
            os.kill(mine_daemon, signal.SIGPWR)
            assert fired.wait(30), "the run's own executor leaving did not stop it"
            assert watch.why.endswith("leaving (decommission notice)"), watch.why
    finally:
        session.sparkContext.cancelJobGroup(mine)
        session.sparkContext.cancelJobGroup(other)
