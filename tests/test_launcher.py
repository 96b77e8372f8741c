"""tfnb.run on a real local[2] Spark session: context, reruns, logs, failures, fail-fast, cancel, timeout."""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import pytest

import tfnb
from tfnb.errors import ClusterError, ConfigError, RunCancelledError, RunTimeoutError, WorkerError



@pytest.fixture(autouse=True)
def no_tensorflow_preimport(monkeypatch):
    # These train_fns never import TensorFlow; skip the default early import to keep the suite fast.
    monkeypatch.setenv("TFNB_PREIMPORT", "")

def describe(ctx, tag):
    return {"tag": tag, "job_name": ctx.job_name, "task_index": ctx.task_index, "is_chief": ctx.is_chief,
            "num_workers": ctx.num_workers, "cluster_spec": dict(ctx.cluster_spec),
            "tf_config_env": json.loads(os.environ["TF_CONFIG"]), "tf_config": dict(ctx.tf_config),
            "legacy": os.environ.get("TF_USE_LEGACY_KERAS"), "pid": os.getpid(), "attempt": ctx.attempt,
            "model_dir": ctx.model_dir, "log_dir": ctx.log_dir, "gpus": list(ctx.gpus),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}


def write_and_describe(ctx, tag, out_dir):
    """Every task writes its description; the chief returns its own."""
    info = describe(ctx, tag)
    with open(os.path.join(out_dir, f"{ctx.job_name}-{ctx.task_index}.json"), "w") as f:
        json.dump(info, f)
    return info


def test_run_returns_chief_value_with_tf_config(spark, tmp_path, no_orphans):
    model_dir = str(tmp_path / "model")
    chief = tfnb.run(write_and_describe, num_workers=2, args=("a", str(tmp_path)), spark=spark,
                     model_dir=model_dir, log_dir=str(tmp_path / "logs"), display=False)
    worker = json.loads((tmp_path / "worker-1.json").read_text())
    assert chief["tag"] == "a" and chief["job_name"] == "chief" and chief["is_chief"]
    assert worker["job_name"] == "worker" and worker["task_index"] == 1 and not worker["is_chief"]
    workers = chief["cluster_spec"]["worker"]
    assert len(workers) == 2 and len(set(workers)) == 2 and chief["cluster_spec"] == worker["cluster_spec"]
    assert chief["tf_config_env"] == chief["tf_config"] == {"cluster": {"worker": workers},
                                                            "task": {"type": "worker", "index": 0}}
    assert worker["tf_config_env"]["task"] == {"type": "worker", "index": 1}
    assert chief["legacy"] == "1" and chief["attempt"] == 1 and chief["model_dir"] == model_dir
    assert chief["pid"] != worker["pid"] != os.getpid()
    assert json.loads((tmp_path / "model" / "tfnb_status.json").read_text())["state"] == "succeeded"


def test_reruns_get_fresh_processes(spark, tmp_path):
    first = tfnb.run(write_and_describe, num_workers=2, args=("1", str(tmp_path)), spark=spark, display=False)
    second = tfnb.run(write_and_describe, num_workers=2, args=("2", str(tmp_path)), spark=spark, display=False)
    assert (first["tag"], second["tag"]) == ("1", "2")
    assert first["pid"] != second["pid"]
    assert first["cluster_spec"] != second["cluster_spec"]  # fresh ports each run


def chief_returns_at_once(ctx, out_dir):
    """The chief returns at once; worker 1, once the driver has heard that the chief's train_fn returned,
    checks that the chief's process still runs."""
    pid_file = os.path.join(out_dir, "chief.pid")
    if ctx.is_chief:
        with open(pid_file + ".part", "w") as f:
            f.write(str(os.getpid()))
        os.replace(pid_file + ".part", pid_file)
        return "chief done"
    while not os.path.exists(os.path.join(out_dir, "chief-done")):  # touched by the driver's display
        time.sleep(0.05)
    pid = int(open(pid_file).read())
    with open(f"/proc/{pid}/stat") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
    if state == "Z":
        raise RuntimeError("the chief's train_fn process exited while this worker still ran")
    return "worker done"


def test_a_finished_process_stays_up_until_every_train_fn_returned(spark, tmp_path, no_orphans):
    # MultiWorkerMirroredStrategy: a peer's last all-reduce may still need this process' TensorFlow
    # server; exiting at once aborts it ("Socket closed"). Finished processes wait for the others.
    def display(event):  # the chief's task says "done" once its train_fn returned, its process kept
        if (event.kind, event.job_name, event.data.get("state")) == ("state", "chief", "done"):
            (tmp_path / "chief-done").touch()

    assert tfnb.run(chief_returns_at_once, num_workers=2, args=(str(tmp_path),), spark=spark,
                    display=display, max_attempts=1, timeout=300) == "chief done"


def print_then_wait(ctx, flag_dir):
    import sys

    print(f"hello stdout from {ctx.task_index}", flush=True)
    print(f"hello stderr from {ctx.task_index}", file=sys.stderr, flush=True)
    # Only a live log stream lets the driver see the line and create the flag before we return.
    flag = os.path.join(flag_dir, f"seen-{ctx.task_index}")
    while not os.path.exists(flag):
        time.sleep(0.05)
    return "released"


def test_logs_stream_live_with_role_prefix(spark, tmp_path, capsys):
    from tfnb.notebook.console import ConsoleDisplay

    console = ConsoleDisplay()
    seen = []

    def display(event):
        console(event)
        if event.kind == "log":
            seen.append((event.job_name, event.task_index, event.data["stream"], event.data["line"]))
            if event.data["line"].startswith("hello stdout"):
                (tmp_path / f"seen-{event.task_index}").touch()

    assert tfnb.run(print_then_wait, num_workers=2, args=(str(tmp_path),), spark=spark, display=display,
                    timeout=120) == "released"
    assert ("chief", 0, "stdout", "hello stdout from 0") in seen
    assert ("worker", 1, "stderr", "hello stderr from 1") in seen
    out = capsys.readouterr().out
    assert "[chief 0] hello stdout from 0" in out and "[worker 1] hello stderr from 1" in out


def fail_on_worker_1(ctx):
    if ctx.task_index == 1:
        raise ValueError("bad shard 7 on purpose")
    time.sleep(600)  # the chief would wait forever: tfnb must stop it


def test_worker_exception_reaches_driver_and_stops_others(spark, no_orphans):
    with pytest.raises(WorkerError) as info:  # not RunTimeoutError: the sleeping chief was stopped, not waited for
        tfnb.run(fail_on_worker_1, num_workers=2, spark=spark, display=False, timeout=300)
    err = info.value
    assert err.task_index == 1 and err.job_name == "worker"
    assert err.exc_type == "ValueError" and "bad shard 7 on purpose" in str(err)
    assert "fail_on_worker_1" in err.worker_traceback and "raise ValueError" in err.worker_traceback
    assert "Py4J" not in str(err) and "at org.apache" not in str(err)


def test_process_crash_without_exception_is_reported(spark):
    def crash(ctx):
        if ctx.task_index == 0:
            os._exit(3)
        time.sleep(600)

    with pytest.raises(WorkerError) as info:
        tfnb.run(crash, num_workers=2, spark=spark, display=False, max_attempts=1, timeout=300)
    assert info.value.exc_type == "ProcessDied" and "exited with code 3" in str(info.value)


@pytest.mark.parametrize("kwargs, needle", [
    ({"num_workers": 0}, "num_workers=0"),
    ({"num_workers": 2, "num_ps": -1}, "num_ps=-1"),
    ({"num_workers": 1, "num_ps": 1}, "num_workers >= 2"),
    ({"num_workers": 2, "args": 5}, "args=(value,)"),
    ({"num_workers": 2, "timeout": 0}, "timeout=0"),
    ({"num_workers": 2, "max_attempts": 0}, "max_attempts=0"),
])
def test_bad_arguments_fail_fast(spark, kwargs, needle):
    with pytest.raises(ConfigError, match=r".*") as info:
        tfnb.run(describe, spark=spark, display=False, **kwargs)
    assert needle in str(info.value)


def test_more_tasks_than_slots_fails_fast(spark):
    # refused before launch: a barrier job "waiting for reservations" would end in RunTimeoutError instead
    with pytest.raises(ClusterError) as info:
        tfnb.run(describe, num_workers=3, spark=spark, display=False, timeout=120)
    msg = str(info.value)
    assert "needs 3 task slots" in msg and "has 2" in msg and "spark.executor.instances" in msg


def test_unpicklable_train_fn_fails_fast(spark):
    lock = threading.Lock()

    def uses_lock(ctx):
        with lock:
            return 1

    with pytest.raises(ConfigError) as info:
        tfnb.run(uses_lock, num_workers=2, spark=spark, display=False)
    assert "cannot be sent to the workers" in str(info.value) and "lock" in str(info.value)


def sleep_forever(ctx):
    print("sleeping", flush=True)
    time.sleep(600)


def _port_closed(host, port) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) != 0


def test_timeout_cancels_and_cleans_up(spark, no_orphans):
    ports = []
    import tfnb.launcher.channel as channel

    original = channel.DriverChannel.__init__

    def spy(self, *a, **k):
        original(self, *a, **k)
        ports.append(self.address)

    channel.DriverChannel.__init__ = spy
    try:
        with pytest.raises(RunTimeoutError, match="timed out"):
            tfnb.run(sleep_forever, num_workers=2, spark=spark, display=False, timeout=8)
    finally:
        channel.DriverChannel.__init__ = original
    assert ports and all(_port_closed(*addr) for addr in ports)
    # the session is still usable
    assert tfnb.run(describe, num_workers=2, args=("after",), spark=spark, display=False)["tag"] == "after"


def test_keyboard_interrupt_cancels_the_job(spark, no_orphans):
    pressed = []

    def display(event):  # called on the thread that called tfnb.run
        if event.kind == "log" and event.data.get("line") == "sleeping" and not pressed:
            pressed.append(event)
            os.kill(os.getpid(), signal.SIGINT)  # what the notebook's stop button does: SIGINT to the kernel

    with pytest.raises(KeyboardInterrupt) as info:
        tfnb.run(sleep_forever, num_workers=2, spark=spark, display=display, timeout=300)
    assert isinstance(info.value, RunCancelledError), info.getrepr()
    assert tfnb.run(describe, num_workers=2, args=("again",), spark=spark, display=False)["tag"] == "again"


def lines_then_sleep(ctx):
    if ctx.attempt == 1 and ctx.task_index == 1 and os.environ.get("TFNB_TEST_DIE"):
        os._exit(9)  # a relaunch: the interrupt may land while the driver decides it and starts the next launch
    for i in range(4):
        print(f"line {i}", flush=True)
        time.sleep(0.05)
    time.sleep(600)


@pytest.mark.parametrize("at, die", [(0, False), (2, False), (9, False), ("failed", True), ("attempt", True)])
def test_an_interrupt_at_any_point_of_a_run_is_a_cancel(spark, at, die, no_orphans):
    """The notebook's stop button at the n-th thing the run shows (its start, the tasks' states, log lines), at a
    task's failure or at the relaunch that follows: always RunCancelledError, never pyspark's bare
    KeyboardInterrupt, and nothing left running."""
    seen = []

    def display(event):
        seen.append(event.kind)
        if (len(seen) == at + 1) if isinstance(at, int) else (event.kind == at and seen.count(at) == 1):
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt) as info:
        tfnb.run(lines_then_sleep, num_workers=2, spark=spark, display=display, preimport=(), timeout=120,
                 env={"TFNB_TEST_DIE": "1"} if die else None)
    assert isinstance(info.value, RunCancelledError), (seen, info.getrepr())
    assert len(seen) > at if isinstance(at, int) else at in seen, seen


def test_use_gpu_true_without_gpus_is_a_clear_error(spark):
    with pytest.raises(ClusterError) as info:  # refused on the driver, before launch
        tfnb.run(describe, num_workers=2, args=("x",), spark=spark, display=False, use_gpu=True)
    assert "spark.task.resource.gpu.amount" in str(info.value)


def test_dynamic_allocation_fails_fast():
    from conftest import spark_session

    session = spark_session("local[2]", **{"spark.dynamicAllocation.enabled": "true",
                                           "spark.shuffle.service.enabled": "false",
                                           "spark.dynamicAllocation.shuffleTracking.enabled": "true"})
    with pytest.raises(ClusterError, match="spark.dynamicAllocation.enabled=false"):
        tfnb.run(describe, num_workers=2, spark=session, display=False)


def report_modules(ctx):
    import sys

    return {"tensorflow_loaded": "tensorflow" in sys.modules}


def test_preimport_loads_modules_before_train_fn(spark):
    assert tfnb.run(report_modules, num_workers=2, spark=spark, display=False, preimport=("json", "tensorflow"))[
        "tensorflow_loaded"]
    assert not tfnb.run(report_modules, num_workers=2, spark=spark, display=False)["tensorflow_loaded"]


def print_tf_startup_noise(ctx):
    import sys

    print("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR", file=sys.stderr)
    print("I0000 00:00:1795312524.552894    1802 cudart_stub.cc:31] Could not find cuda drivers on your machine",
          file=sys.stderr)
    print("E0000 00:00:1795309761.365416    8734 base_collective_executor.cc:252] a real TensorFlow error",
          file=sys.stderr, flush=True)
    return "ok"


def test_tensorflow_startup_noise_is_dropped_real_errors_kept(spark):
    lines = []
    tfnb.run(print_tf_startup_noise, num_workers=2, spark=spark, timeout=120,
             display=lambda e: lines.append(e.data["line"]) if e.kind == "log" else None)
    assert sum("a real TensorFlow error" in line for line in lines) == 2
    assert not any("absl::InitializeLog" in line or "cudart_stub" in line for line in lines)


def read_setting(ctx):
    # what tfnb.stage inside train_fn resolves, and whether the executor's environment was the source
    from tfnb.storage.s3 import endpoint_url

    return endpoint_url(None), os.environ.get("TFNB_S3_ENDPOINT_URL")


def test_driver_settings_travel_with_the_task(spark, monkeypatch):
    # set after the session (and its Python workers) started: only the task can have brought it
    spark.range(1).collect()
    monkeypatch.setenv("TFNB_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("TFNB_PREIMPORT", "")
    # resolved once on the driver, carried in the task's context: not copied into the process environment
    assert tfnb.run(read_setting, num_workers=2, spark=spark, display=False) == ("http://127.0.0.1:9", None)


def test_options_resolve_once_and_are_reused_with_keywords_over_them(monkeypatch):
    monkeypatch.setenv("TFNB_MAX_ATTEMPTS", "3")
    monkeypatch.delenv("TFNB_PREIMPORT", raising=False)
    base = tfnb.RunOptions.resolve(num_workers=2, timeout=60, env={"DATA": "s3://b/p"},
                                   storage_options={"secret": "hunter2-not-shown"})
    assert (base.max_attempts, base.timeout, base.preimport) == (3, 60.0, ("tensorflow",))  # env, then defaults
    again = tfnb.RunOptions.resolve(base, args=(5,), timeout=120)  # what tfnb.run(fn, base, ...) does
    assert (again.num_workers, again.args, again.timeout, again.env) == (2, (5,), 120.0, (("DATA", "s3://b/p"),))
    assert "hunter2" not in repr(again) and "s3://b/p" not in repr(again)  # env= and storage_options: credentials
    with pytest.raises(tfnb.ConfigError, match="unknown option.*num_worker; the options are"):
        tfnb.RunOptions.resolve(num_worker=2)
