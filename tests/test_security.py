"""Threats to a driver shared by several users, tried with real processes and files.

TensorBoard bookkeeping: a folder another user created first is refused; entries planted in it (or
tampered with) cannot make tfnb delete a file outside it, signal a process group that is not its
TensorBoard, or show a URL other than the one it launched. The warm standbys' and run logs' folders
of another user are not used by a run. A staged object whose key climbs out with ``..`` is refused.
Secrets: a run's ``env=`` stays out of reprs, and the notebook/DBC credential check catches the usual
ways of pasting a credential.
"""
from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

import leakcheck
import tfnb
from components import need
from s3server import put_tree
from tfnb.monitor import tensorboard as tbp
from tfnb._task import warm as _warm
from tools import dbc
from tfnb._private import private_dir
from tfnb.errors import ConfigError, StorageError, UnsafePathError

NOBODY = 65534


def need_root() -> None:
    need("root (to create files and processes of another uid)", os.getuid() == 0, "run the tests as root, as CI does")


def entry(folder: Path, proc: int, log_dir, *, port: int = 1, host: str = "127.0.0.1", url: str | None = None,
          proc_start: int = 0, log_path: str = "") -> Path:
    """A bookkeeping entry as tfnb writes it (``<pid>.json``), with the given fields."""
    inst = tbp.TensorBoardInstance(pid=proc, port=port, host=host, log_dir=str(log_dir),
                                   url=url or f"http://{host}:{port}/", reload_interval=5.0, start_time=1.0,
                                   launched_by=proc, log_path=log_path, proc_start=proc_start)
    path = folder / f"{proc}.json"
    path.write_text(json.dumps({"format": 1, **inst.__dict__}))
    return path


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.fixture
def info(tmp_path, monkeypatch) -> Path:
    """A private bookkeeping folder of this user, as tfnb creates it."""
    folder = tmp_path / "info"
    monkeypatch.setenv("TFNB_TENSORBOARD_DIR", str(folder))
    assert tbp.instances() == []
    return folder


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "thesis.tex"
    path.write_text("years of work")
    return path


# ---------------------------------------------------------------- a folder someone else made


@pytest.mark.parametrize("how", ["other owner", "writable by all", "symlink"])
def test_foreign_bookkeeping_folder_is_refused_and_nothing_in_it_is_touched(tmp_path, monkeypatch, victim, how):
    # The default folder name is predictable: <TFNB_STATE_DIR or /tmp>/tfnb-tensorboard-<uid>.
    base = tmp_path / "shared-tmp"
    base.mkdir()
    folder = base / f"tfnb-tensorboard-{os.getuid()}"
    if how == "symlink":
        target = tmp_path / "elsewhere"
        target.mkdir(mode=0o700)
        folder.symlink_to(target)
    else:
        folder.mkdir()
        folder.chmod(0o777)
        if how == "other owner":
            need_root()
            os.chown(folder, NOBODY, NOBODY)
    planted = entry(folder, dead_pid(), tmp_path, log_path=str(victim))
    log = folder / "tb-0123456789ab.log"
    log.write_text("a log file")
    monkeypatch.setenv("TFNB_STATE_DIR", str(base))
    monkeypatch.delenv("TFNB_TENSORBOARD_DIR", raising=False)
    log_dir = tmp_path / "logs"
    log_dir.mkdir()

    with pytest.raises(UnsafePathError, match=f"{folder} (is owned by uid|is writable by other|is not a directory)"):
        tbp.ensure_tensorboard(log_dir)
    with pytest.raises(UnsafePathError, match=r"remove it .*\(TFNB_TENSORBOARD_DIR\)$"):  # what moves this folder
        tbp.instances()
    assert victim.read_text() == "years of work"
    assert planted.exists() and log.exists()
    # The same folder named explicitly is refused too.
    monkeypatch.setenv("TFNB_TENSORBOARD_DIR", str(folder))
    with pytest.raises(UnsafePathError):
        tbp.instances()
    assert planted.exists() and log.exists() and victim.exists()


def test_a_fresh_folder_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("TFNB_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("TFNB_TENSORBOARD_DIR", raising=False)
    assert tbp.instances() == []
    st = os.stat(tmp_path / f"tfnb-tensorboard-{os.getuid()}")
    assert (st.st_uid, st.st_mode & 0o777) == (os.getuid(), 0o700)


def _pid(ctx):
    import os as _os

    return _os.getpid()


def test_another_users_standby_and_run_log_folders_are_not_used_by_a_run(spark, tmp_path, caplog, monkeypatch):
    # TFNB_STATE_DIR is this test process's own (conftest.py): here its folders change hands for a run
    need_root()
    monkeypatch.setenv("TFNB_PREIMPORT", "json")
    warm, runs = private_dir("warm"), private_dir("runs")
    planted, path = socket.socket(socket.AF_UNIX), os.path.join(warm, "0" * 20 + "-1-1.sock")
    planted.bind(path)  # a standby as another user would plant it: the run's payload and env= would go to it
    planted.listen(8)
    planted.setblocking(False)
    before, run_logs, seen = {p.pid for p in leakcheck.processes()}, sorted(os.listdir(runs)), []
    try:
        for folder in (warm, runs):
            os.chown(folder, NOBODY, NOBODY)
        with pytest.raises(UnsafePathError, match=rf"{warm} is owned by uid {NOBODY}.*remove it .*\(TFNB_STATE_DIR\)"):
            list(_warm.claim("0" * 20))
        with caplog.at_level(logging.WARNING, logger="tfnb"):
            tfnb.run(_pid, num_workers=2, spark=spark, display=seen.append, env={"SECRET": "s3cr3t"})
        with pytest.raises(BlockingIOError):
            planted.accept()                   # nothing connected to it
    finally:
        for folder in (warm, runs):
            os.chown(folder, os.getuid(), os.getgid())
        planted.close()
        os.unlink(path)
    assert not [p for p in leakcheck.processes() if p.kind == leakcheck.STANDBY and p.pid not in before], \
        "a standby was left in another user's folder"
    assert re.search(rf"no log file for this run: {runs} is owned by uid {NOBODY}, not by this user .*"
                     r"so tfnb will not trust what is in it; remove it .*\(TFNB_STATE_DIR\)", caplog.text), caplog.text
    assert sorted(os.listdir(runs)) == run_logs
    warned = [e.data["line"] for e in seen if e.kind == "log" and "warm standby" in e.data.get("line", "")]
    assert len(warned) == 2 and re.fullmatch(rf"tfnb: no warm standby on this executor, train_fn starts fresh: {warm} "
                                             rf"is owned by uid {NOBODY}.*\(TFNB_STATE_DIR\)", warned[0]), warned


def test_keys_the_native_client_cannot_name_are_staged_through_boto3(moto_s3, tmp_path):
    # "a//b" and "a/./b" are S3 keys like any other; obstore's paths cannot hold an empty or '.' part
    bucket = f"oddkeys-{uuid.uuid4().hex[:8]}"
    put_tree(moto_s3.client(), bucket, {"data/ok.bin": b"fine", "data/twice//slash.bin": b"odd"})
    dest = tmp_path / "staged"
    tfnb.stage(f"s3://{bucket}/data", dest, endpoint_url=moto_s3.endpoint_url,
               storage_options={"key": moto_s3.access_key, "secret": moto_s3.secret_key, "region": "us-east-1"})
    assert (dest / "ok.bin").read_bytes() == b"fine" and (dest / "twice" / "slash.bin").read_bytes() == b"odd"


def test_a_staged_key_that_climbs_out_of_dest_dir_is_refused(moto_s3, tmp_path):
    # S3 keys are names, not paths: "data/../escaped.bin" is one object, listed under data/
    bucket = f"dotdot-{uuid.uuid4().hex[:8]}"
    put_tree(moto_s3.client(), bucket, {"data/ok.bin": b"fine", "data/../escaped.bin": b"planted"})
    dest = tmp_path / "staged" / "train"
    with pytest.raises(StorageError, match=rf"^s3://{bucket}/data/\.\./escaped\.bin would be written outside "
                                           r"dest \('\.\.' in its key\); rename the object or stage a prefix"):
        tfnb.stage(f"s3://{bucket}/data", dest, endpoint_url=moto_s3.endpoint_url,
                   storage_options={"key": moto_s3.access_key, "secret": moto_s3.secret_key, "region": "us-east-1"})
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


# ---------------------------------------------------------------- planted or tampered entries


def test_a_log_path_outside_the_folder_is_never_deleted(info, tmp_path, victim):
    outside = [str(victim), str(info / ".." / victim.name)]
    link = info / "tb-aaaaaaaaaaaa.log"
    link.symlink_to(victim)
    own_log = info / "tb-bbbbbbbbbbbb.log"
    own_log.write_text("TensorBoard output")
    entries = [entry(info, dead_pid(), tmp_path, log_path=p) for p in outside + [str(link), str(own_log)]]

    assert tbp.instances() == []
    assert not any(e.exists() for e in entries), "stale entries are removed"
    assert victim.read_text() == "years of work"
    assert not own_log.exists(), "the log tfnb wrote in its own folder is cleaned up"


def test_tensorboards_shared_record_folder_is_not_touched(info, tmp_path, monkeypatch):
    # TensorBoard's own records (read by %tensorboard) default to <tmp>/.tensorboard-info, shared by all
    # users; tfnb's TensorBoards write theirs in the private folder, so nothing in the shared one is removed.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    elsewhere = tmp_path / "someone-elses"
    elsewhere.mkdir()
    pid = dead_pid()
    kept = elsewhere / f"pid-{pid}.info"
    kept.write_text("{}")
    (tmp / ".tensorboard-info").symlink_to(elsewhere)
    entry(info, pid, tmp_path)
    assert tbp.instances() == []
    assert kept.exists()
    # The record a SIGKILLed TensorBoard left in the private folder goes with its stale entry.
    record = info / ".tensorboard-info" / f"pid-{pid}.info"
    record.parent.mkdir()
    record.write_text("{}")
    entry(info, pid, tmp_path)
    assert tbp.instances() == []
    assert not record.exists() and kept.exists()


def _own_session(cmd: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL, **kwargs)


def _survives_a_planted_entry(info: Path, tmp_path: Path, proc: subprocess.Popen) -> None:
    # Taken for a hung TensorBoard (its entry's port does not answer), its process group would be
    # killed if tfnb trusted the pid and start time an entry gives.
    try:
        entry(info, proc.pid, tmp_path, port=1, proc_start=tbp._proc_start(proc.pid))
        assert tbp.instances() == []
        assert proc.poll() is None, "a planted entry got a process killed"
        assert list(info.glob("*.json")) == []
    finally:
        proc.kill()
        proc.wait()


def test_a_planted_pid_of_this_users_other_program_is_not_killed(info, tmp_path):
    _survives_a_planted_entry(info, tmp_path, _own_session(["sleep", "120"]))


def test_a_planted_pid_of_another_users_tensorboard_is_not_killed(info, tmp_path):
    need_root()
    lookalike = _own_session(["bash", "-c", "exec -a tensorboard sleep 120"], user=NOBODY, group=NOBODY, cwd="/")
    _survives_a_planted_entry(info, tmp_path, lookalike)


# Stands in for a TensorBoard of this user (a real TensorBoard start costs 10-30 s here): "tensorboard" in
# its command line, its own session, and it answers /data/environment for its log_dir like TensorBoard.
_FAKE_TENSORBOARD = textwrap.dedent("""
    import http.server, json, sys
    body = json.dumps({"data_location": sys.argv[1]}).encode()
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    server = http.server.HTTPServer((sys.argv[2], 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
""")


@pytest.fixture
def fake_tensorboard(tmp_path):
    started = []

    def start(log_dir: Path, host: str = "127.0.0.1"):
        proc = _own_session([sys.executable, "-c", _FAKE_TENSORBOARD, str(log_dir), host, "fake-tensorboard"],
                            stdout=subprocess.PIPE, text=True)
        started.append(proc)
        return proc, int(proc.stdout.readline())

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_planted_url_is_not_shown(info, tmp_path, fake_tensorboard):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    proc, port = fake_tensorboard(log_dir)
    start = tbp._proc_start(proc.pid)
    good = f"http://127.0.0.1:{port}/"
    # The honest entry is reused: the check below is what keeps the others out, not something else.
    entry(info, proc.pid, log_dir, port=port, proc_start=start)
    reused = tbp.ensure_tensorboard(log_dir)
    assert isinstance(reused, tbp.Reused) and reused.url == good and reused.warning == ""

    for url in ("https://attacker.example/", f"http://attacker.example:{port}/", f"http://127.0.0.1:{port}@evil/",
                f"http://127.0.0.1:{port + 1}/", f"http://127.0.0.1:{port}/../../evil", f"https://127.0.0.1:{port}/"):
        planted = entry(info, proc.pid, log_dir, port=port, proc_start=start, url=url)
        assert tbp.instances() == [], url
        assert not planted.exists()
        assert proc.poll() is None, "a wrong URL removes the entry; it kills nothing"
    # ensure_tensorboard starts its own instead of showing the planted URL (stopped at once by the short
    # timeout, unless it was serving by then)
    entry(info, proc.pid, log_dir, port=port, proc_start=start, url="https://attacker.example/")
    outcome = tbp.ensure_tensorboard(log_dir, timeout=0.5)
    if isinstance(outcome, tbp.Launched):
        tbp.stop(outcome)
        assert outcome.url == f"http://127.0.0.1:{outcome.port}/" and outcome.pid != proc.pid, outcome
    else:
        assert isinstance(outcome, tbp.TimedOut), outcome


# ---------------------------------------------------------------- TensorBoard on the network


def test_tensorboard_reachable_from_the_network_warns(info, tmp_path, fake_tensorboard, caplog):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    proc, port = fake_tensorboard(log_dir, host="0.0.0.0")
    entry(info, proc.pid, log_dir, port=port, host="0.0.0.0", proc_start=tbp._proc_start(proc.pid))
    with caplog.at_level(logging.WARNING, logger="tfnb.monitor.tensorboard"):
        outcome = tbp.ensure_tensorboard(log_dir, host="0.0.0.0")
    assert isinstance(outcome, tbp.Reused), outcome
    assert outcome.warning.startswith(f"TensorBoard listens on 0.0.0.0 port {port}, reachable from the network")
    assert "host='127.0.0.1'" in outcome.warning
    assert outcome.warning in caplog.text


@pytest.mark.slow
def test_a_launched_network_tensorboard_warns(info, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="tfnb.monitor.tensorboard"):
        outcome = tbp.ensure_tensorboard(tmp_path, host="0.0.0.0")
    try:
        assert isinstance(outcome, tbp.Launched), outcome
        assert "reachable from the network" in outcome.warning and outcome.warning in caplog.text
    finally:
        if isinstance(outcome, tbp.Launched):
            tbp.stop(outcome)


# ---------------------------------------------------------------- secrets


def test_env_values_stay_out_of_the_task_spec_repr():
    from tfnb._task.setup import TaskSpec

    spec = TaskSpec(run_id="r", attempt=1, max_attempts=1, num_workers=1, num_ps=0, channel=("127.0.0.1", 1),
                    token="t0ken", payload=b"", env=(("AWS_SECRET_ACCESS_KEY", "s3cr3t-value"),))
    assert "s3cr3t-value" not in repr(spec) and "t0ken" not in repr(spec)
    assert spec.env == (("AWS_SECRET_ACCESS_KEY", "s3cr3t-value"),)


# Fakes built from parts so that secret scanners do not flag this file (AWS's documentation examples).
SECRET = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"
KEY_ID = "ASIA" + "IOSFODNN7EXAMPLE"
SESSION = "IQoJb3JpZ2lu" + "ZWMQ7wEaCXVzLWVhc3QtMSJHMEUCIQCexampleexampleexampleexample0123456789"


def _notebook(folder: Path, *sources: str) -> Path:
    folder.mkdir(exist_ok=True)
    cells = [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": src, "outputs": [],
              "execution_count": None} for i, src in enumerate(sources)]
    doc = {"nbformat": 4, "nbformat_minor": 5, "cells": cells,
           "metadata": {"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}}}
    (folder / "01_leaky.ipynb").write_text(json.dumps(doc))
    return folder


@pytest.mark.parametrize("source", [
    f'os.environ["AWS_SECRET_ACCESS_KEY"] = "{SECRET}"',
    f"os.environ['AWS_SESSION_TOKEN'] = '{SECRET}'",
    f'os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "{SECRET}")',
    f'os.environ.update(AWS_SECRET_ACCESS_KEY="{SECRET}")',
    f'os.environ.update({{"AWS_SESSION_TOKEN": "{SECRET}"}})',
    f"%env AWS_SECRET_ACCESS_KEY={SECRET}",
    f"%sh\nexport AWS_SESSION_TOKEN={SECRET}",
    f'tfnb.stage("s3://b/train", storage_options={{"key": os.environ["K"], "secret": "{SECRET}"}})',
    'opts = dict(key="MINIO0EXAMPLE0KEY00", secret=os.environ["S"])',
    f'storage_options = {{"token": "{SECRET}"}}',
    f'creds = {{"AccessKeyId": "{KEY_ID}"}}',
    f'session = "{SESSION}"',
    "KEY = '''-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----'''",
    "pem = '-----BEGIN RSA PRIVATE KEY-----'",
    "host_token = 'dapi" + "0123456789abcdef" * 2 + "'",
])
def test_credentials_in_a_notebook_are_refused_without_repeating_them(tmp_path, source):
    src = _notebook(tmp_path / "nb", "import os, tfnb", source)
    with pytest.raises(ConfigError, match="notebook 01_leaky.ipynb, cell 2 contains what looks like") as e:
        dbc.build_bytes(src)
    for value in (SECRET, KEY_ID, SESSION, "MINIO0EXAMPLE0KEY00", "b3BlbnNzaC1rZXktdjEAAAAA"):
        assert value not in str(e.value)


@pytest.mark.parametrize("source", [
    'os.environ["AWS_SECRET_ACCESS_KEY"] = dbutils.secrets.get("aws", "secret")',
    'tfnb.stage(url, storage_options={"key": os.environ["AWS_ACCESS_KEY_ID"], "secret": os.environ["S"]})',
    'os.environ.setdefault("AWS_SESSION_TOKEN", "")',
    'df.sort_values(key="loss"); tok = tokenizer(text, pad_token="[PAD]")',
    'model.secret_sauce = "not-a-credential"',
])
def test_reading_credentials_at_run_time_is_fine(tmp_path, source):
    _, names = dbc.build_bytes(_notebook(tmp_path / "nb", source))
    assert names == ["tfnb/01_leaky"]


def test_the_shipped_notebooks_pass_the_check():
    root = Path(__file__).resolve().parent.parent
    _, names = dbc.build_bytes(root / "notebooks")
    assert len(names) == len(list((root / "notebooks").glob("*.ipynb"))) > 0
