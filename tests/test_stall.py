"""The stall watchdog on a real Spark session: a frozen worker is relaunched and the run resumes; a worker stuck
in silence on the last attempt raises WorkerStalledError with its stack; nothing is left running."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

import tfnb
from tfnb.errors import WorkerError, WorkerStalledError


@pytest.fixture(autouse=True)
def no_tensorflow_preimport(monkeypatch):
    # These train_fns never import TensorFlow; skip the default early import to keep the suite fast.
    monkeypatch.setenv("TFNB_PREIMPORT", "")
    monkeypatch.setenv("TFNB_WARM", "0")  # the stack dumps come from fresh children, whatever ran before


def _save(path: Path, value) -> None:
    path.with_suffix(".part").write_text(json.dumps(value))
    os.replace(path.with_suffix(".part"), path)  # a checkpoint is whole or absent


def lockstep_fit(ctx, epochs, freeze_at_epoch):
    """A two-worker 'fit' without TensorFlow: each epoch ends in a file barrier (as a collective would), the
    finished epoch count is checkpointed to model_dir, and a relaunch resumes from the shared checkpoint."""
    from tfnb._task.events import emit

    model_dir = Path(ctx.model_dir)
    ckpts = [model_dir / f"ckpt-{i}.json" for i in range(ctx.num_workers)]
    done = [json.loads(p.read_text()) if p.exists() else 0 for p in ckpts]
    ran = []
    for epoch in range(min(done), epochs):
        ran.append(epoch)
        emit("progress", epoch=epoch + 1, epochs=epochs, step=1, steps=1)
        if ctx.attempt == 1 and ctx.task_index == 1 and epoch == freeze_at_epoch:
            os.kill(os.getpid(), signal.SIGSTOP)  # frozen mid-epoch: alive, but never heard from again
        time.sleep(0.1)
        _save(ckpts[ctx.task_index], epoch + 1)
        while any(not p.exists() or json.loads(p.read_text()) < epoch + 1 for p in ckpts):
            time.sleep(0.05)  # waiting on the peer, silently, like an all-reduce
    return {"attempt": ctx.attempt, "ran": ran}


def test_frozen_worker_is_relaunched_and_the_run_resumes(spark, tmp_path, no_orphans):
    seen = []
    result = tfnb.run(lockstep_fit, num_workers=2, args=(4, 1), spark=spark, model_dir=str(tmp_path),
                      stall_timeout=3, max_attempts=2, display=seen.append, timeout=300)
    # Resumed where the frozen worker stopped, not from the start. (Dumping its stack continues the stopped
    # process, which may finish an epoch or two, 0.1 s each, before the cancel lands: any of them is a
    # correct resume.)
    assert result["attempt"] == 2 and result["ran"][0] in (1, 2, 3) and result["ran"][-1] == 3
    stalled = [e for e in seen if e.kind == "state" and e.data.get("state") == "stalled"]
    assert ("worker", 1) in {(e.job_name, e.task_index) for e in stalled}
    relaunch = next(e for e in seen if e.kind == "attempt")
    assert relaunch.data["attempt"] == 2 and "stalled" in relaunch.data["reason"]
    status = json.loads((tmp_path / "tfnb_status.json").read_text())
    assert status["state"] == "succeeded"
    assert [a["outcome"] for a in status["attempts"]] == ["stalled", "succeeded"]
    assert status["attempts"][0]["relaunched"] and status["attempts"][1]["resumed_epoch"] == result["ran"][0] + 1


def stop_then_fail(ctx, folder):
    """Worker 1 stops itself (SIGSTOP) mid-run; the chief then fails, as a peer's collective does when one member
    stops answering: the run ends with a process that no SIGTERM reaches until it is continued."""
    pid_file = Path(folder, "stopped.pid")
    if ctx.task_index == 1:
        pid_file.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3600)
    while not pid_file.exists() or Path(f"/proc/{pid_file.read_text()}/stat").read_text().split(")")[-1].split()[0] \
            != "T":
        time.sleep(0.05)
    raise RuntimeError("the peer stopped answering")


@pytest.mark.parametrize("warm", ["0", "1"])
def test_a_stopped_worker_is_gone_when_the_run_ends(spark, tmp_path, monkeypatch, warm, no_orphans):
    monkeypatch.setenv("TFNB_WARM", warm)  # forked from a standby, or started fresh: either way it must go
    with pytest.raises(WorkerError, match="the peer stopped answering"):
        tfnb.run(stop_then_fail, num_workers=2, args=(str(tmp_path),), spark=spark, max_attempts=1, display=False,
                 timeout=300)
    pid = int((tmp_path / "stopped.pid").read_text())
    from leakcheck import processes, wait_gone

    stopped = [p for p in processes() if p.pid == pid]
    assert not wait_gone(stopped, 5.0), f"the stopped train_fn process {pid} outlived its run (5 s after SIGTERM)"


def silent_sleeper(ctx):
    if ctx.task_index == 1:
        print("about to wait for a lock that never comes", flush=True)
        time.sleep(3600)  # the stuck frame the error must show
    for i in range(3600):
        print(f"chief heartbeat {i}", flush=True)  # alive and talking: not stalled
        time.sleep(0.5)


def test_silent_worker_on_the_last_attempt_raises_with_its_stack(spark, no_orphans):
    with pytest.raises(WorkerStalledError) as info:  # stopped by the watchdog, not by the run's timeout
        tfnb.run(silent_sleeper, num_workers=2, spark=spark, stall_timeout=4, max_attempts=1, display=False,
                 timeout=300)
    err = info.value
    assert isinstance(err, WorkerError) and (err.job_name, err.task_index) == ("worker", 1)
    assert err.exc_type == "Stalled" and 4 <= err.seconds < 300  # silent for stall_timeout, said before timeout
    assert err.last_line == "about to wait for a lock that never comes"
    assert "in silent_sleeper" in err.stacks["worker 1"] and "in silent_sleeper" in str(err)
    assert "chief 0" in err.stacks  # every train_fn process dumps its stack
    assert "stall_timeout" in str(err)
    assert [a["outcome"] for a in err.attempts] == ["stalled"]


def test_stall_timeout_is_validated():
    with pytest.raises(tfnb.ConfigError, match="stall_timeout=-1"):
        tfnb.run(silent_sleeper, num_workers=1, stall_timeout=-1)
