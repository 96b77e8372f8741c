"""Profiler traces in TensorBoard: ``tfnb.run(..., log_dir=..., profile_steps=(first, last))``.

Real components throughout: a 2-worker MultiWorkerMirroredStrategy run on local[2] writing its trace
to S3 (``rclone serve s3`` on loopback), the driver-side EventSync bringing it to a local folder, and
TensorBoard with the profile plugin (started by tfnb's own launcher) listing it over its HTTP API. Under
that strategy only the chief traces: stopping TensorFlow's profiler can kill the other workers
(tfnb/_task/profiling.py ``collective_role``; ``./dev bench profiler`` repeats runs to count crashes).
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import urllib.parse
import urllib.request

import pytest

import tfnb
from components import need
from s3server import rclone_s3  # noqa: F401
from tfnb.errors import ConfigError


def keras_fit(ctx):
    """8 steps over 2 epochs of MWMS Keras fit; the progress callback takes the trace."""
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(ctx.task_index)
    x = rng.normal(size=(128, 8)).astype("float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).repeat().batch(16).with_options(options)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(8, activation="relu"),
                                     tf.keras.layers.Dense(1)])
        model.compile("adam", "mse")
    model.fit(ds, epochs=2, steps_per_epoch=4, callbacks=[ctx.progress_callback()], verbose=0)
    return "trained"


def custom_loop(ctx, bad_log_dir):
    """A custom loop under ``ctx.profile(step)``; worker 1's traces go where nothing can be written."""
    import dataclasses

    import tensorflow as tf

    if ctx.task_index == 1:
        ctx = dataclasses.replace(ctx, log_dir=bad_log_dir)
    x = tf.random.normal((32, 32))
    for step in range(1, 9):
        with ctx.profile(step):
            x = tf.tanh(tf.matmul(x, x))
    return "trained"


def get_json(url: str):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=120) as resp:
        body = resp.read()
        return json.loads(gzip.decompress(body) if resp.headers.get("Content-Encoding") == "gzip" else body)


@pytest.mark.parametrize("steps, log_dir, says", [
    ((25, 20), "/tmp/logs", r"profile_steps=\(25, 20\) .* did you mean profile_steps=\(20, 25\)"),
    ((-3, 5), "/tmp/logs", r"profile_steps=\(-3, 5\) must be .* counted from 1"),
    (0, "/tmp/logs", r"profile_steps=0 must be"),
    ((20,), "/tmp/logs", r"profile_steps=\(20,\) must be \(first, last\)"),
    ("20,25", "/tmp/logs", r"profile_steps='20,25' must be"),
    ((20.0, 25), "/tmp/logs", r"e\.g\. profile_steps=\(20, 25\)"),
    ((20, 25), None, r"profile_steps=\(20, 25\) needs log_dir=.* pass log_dir="),
])
def test_bad_profile_steps_fail_before_launch(steps, log_dir, says):
    # spark= is not a session: had tfnb got as far as launching, the error would be about that
    with pytest.raises(ConfigError, match=says):
        tfnb.run(keras_fit, num_workers=2, spark=object(), log_dir=log_dir, profile_steps=steps, display=False)


def test_tensorboard_shows_the_chiefs_trace_and_worker_1_says_why_it_has_none(spark, tmp_path, rclone_s3,  # noqa: F811
                                                                              no_orphans, monkeypatch):
    need("tensorboard-plugin-profile", importlib.util.find_spec("xprof") is not None,
         "pip install tensorboard-plugin-profile (the tfnb[monitoring] extra)")
    from tfnb.monitor.tensorboard import Launched, Reused, ensure_tensorboard, stop

    rclone_s3.client().create_bucket(Bucket="profiled")
    log_dir, tb_dir = "s3://profiled/run1/logs", tmp_path / "tb"
    # the workers reach S3 with the endpoint and credentials in env=, as a user passes them
    seen = []
    # max_attempts=1: a worker killed by the profiler fails the run instead of being relaunched unseen
    assert tfnb.run(keras_fit, num_workers=2, spark=spark, log_dir=log_dir, profile_steps=(1, 6),
                    env=rclone_s3.env(), display=seen.append, timeout=600, max_attempts=1) == "trained"
    # each says once why its trace is smaller than asked: the chief skips the step that sets up the
    # collectives, worker 1 takes none
    reports = sorted((e.label, e.data["line"]) for e in seen if e.kind == "log" and "profiler" in e.data["line"])
    assert [label for label, _ in reports] == ["chief 0", "worker 1"], reports
    assert reports[0][1].startswith("tfnb: the chief traces steps 2-6, not 1-6: stopping TensorFlow's profiler "
                                    "after the step that sets up the collectives can crash it"), reports
    assert reports[1][1].startswith("tfnb: only the chief takes a profiler trace: stopping TensorFlow's profiler "
                                    "can crash a worker whose collectives another task leads"), reports

    # the driver side of the notebook: storage -> the folder TensorBoard reads
    tfnb.EventSync(log_dir, str(tb_dir), storage_options={
        "endpoint_url": rclone_s3.endpoint_url, "key": rclone_s3.access_key, "secret": rclone_s3.secret_key,
        "region": "us-east-1"}).stop()
    traces = [p.relative_to(tb_dir).as_posix() for p in tb_dir.rglob("*.xplane.pb")]
    assert len(traces) == 1 and traces[0].startswith("plugins/profile/") and traces[0].endswith(
        "/chief-0.xplane.pb"), traces
    run = traces[0].split("/")[2]

    monkeypatch.setenv("TFNB_TENSORBOARD_DIR", str(tmp_path / "tb-info"))
    board = ensure_tensorboard(str(tb_dir), reload_interval=1)
    try:
        assert isinstance(board, (Launched, Reused)), board
        base = f"http://127.0.0.1:{board.port}/data/plugin/profile/"
        assert get_json(base + "runs") == [run]
        query = urllib.parse.urlencode({"run": run, "tag": "trace_viewer"})
        assert [h["hostname"] for h in get_json(base + "hosts?" + query)] == ["chief-0"]
        assert "trace_viewer@" in get_json(base + "run_tools?" + urllib.parse.urlencode({"run": run}))
        # the trace opens and holds exactly steps 2..6, across the epoch boundary
        query = urllib.parse.urlencode({"run": run, "tag": "trace_viewer", "host": "chief-0"})
        events = get_json(base + "data?" + query)["traceEvents"]
        assert sum(e.get("name") == "train_function" for e in events) == 5
    finally:
        if isinstance(board, Launched):
            stop(board.instance)


def test_a_trace_that_cannot_be_written_is_reported_once_and_training_goes_on(spark, tmp_path, rclone_s3,  # noqa: F811
                                                                              no_orphans):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where worker 1 would need a folder")
    seen = []
    log_dir = tmp_path / "logs"
    # the same env= as the run above, so this run takes over its warm processes (TensorFlow imported); no
    # strategy, no collectives: both workers trace
    assert tfnb.run(custom_loop, num_workers=2, args=(str(blocker / "logs"),), spark=spark, log_dir=str(log_dir),
                    profile_steps=(3, 5), env=rclone_s3.env(), display=seen.append, timeout=600,
                    max_attempts=1) == "trained"

    reports = [(e.label, e.data["line"]) for e in seen if e.kind == "log" and "profiler" in e.data["line"]]
    assert len(reports) == 1, reports
    label, line = reports[0]
    assert label == "worker 1" and "was not written" in line and "not-a-folder" in line, reports
    # the chief, whose log_dir works, wrote its trace in the custom loop
    assert [p.name for p in log_dir.rglob("*.xplane.pb")] == ["chief-0.xplane.pb"]


def test_a_trace_that_cannot_start_is_reported_once_not_per_step(caplog):
    from tfnb._task.context import WorkerContext

    # no log_dir to write to (tfnb.run refuses that; a train_fn can still replace its context)
    ctx = WorkerContext(task_index=1, num_workers=2, job_name="worker", cluster_spec={}, tf_config={},
                        profile_steps=(2, 4), profile_run="r")
    ran = []
    with caplog.at_level("WARNING", logger="tfnb._task.profiling"):
        for step in range(1, 9):
            with ctx.profile(step):
                ran.append(step)
    assert ran == list(range(1, 9))
    assert len(caplog.records) == 1, caplog.records
    line = caplog.records[0].getMessage()
    assert line.startswith("tfnb: the profiler trace of steps 2-4 could not start") and "pass log_dir=" in line
