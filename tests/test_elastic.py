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

from components import free_port
from test_masters import _wait_for_port, _wait_for_workers, executor_jvm_pid

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
        self.port, self.ui = free_port(), free_port()
        self.procs: list[subprocess.Popen] = []
        self._start("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
                    "--webui-port", str(self.ui))
        _wait_for_port(self.port, time.monotonic() + 60)
        self.url = f"spark://127.0.0.1:{self.port}"

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
                    "--webui-port", str(free_port()), self.url, gate=gate)

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
        _wait_for_workers(c.ui, 3, time.monotonic() + 120)
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


@pytest.mark.slow
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


def test_a_decommission_notice_is_seen_as_an_executor_leaving(cluster):
    """What a spot cluster's notice looks like from the driver: SIGPWR to a Worker daemon (Spark's decommission
    signal) makes its executor a leaving one, which an elastic run stops for at its next epoch boundary
    (tfnb.launcher.elastic.Watch) and does not count as room for its next launch."""
    from tfnb.launcher.elastic import leaving, worker_room
    from tfnb.launcher.resources import Ask, Placement

    placement = Placement(workers=Ask(1, 0.0))
    assert leaving(cluster.session) == frozenset()
    before = worker_room(cluster.session, placement, 0)
    # a Worker daemon of the cluster still running (the first process is the master; a test before may have
    # killed one)
    daemon = next(p for p in cluster.procs[1:] if p.poll() is None)
    os.kill(daemon.pid, signal.SIGPWR)
    end = time.monotonic() + 60
    while not leaving(cluster.session) and time.monotonic() < end:
        time.sleep(0.5)
    assert len(leaving(cluster.session)) == 1, "no executor was seen leaving within 60 s"
    assert worker_room(cluster.session, placement, 0) == before - 1
