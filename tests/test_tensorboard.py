"""TensorBoard on the driver: real TensorBoard processes serving real tf.summary scalars over HTTP.

One TensorBoard (module fixture) serves most tests; the lifecycle tests start a few more. Each
TensorBoard start imports TensorFlow (~7 s idle, far more on a busy machine), so starts are few.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from browser import kill_processes_with, processes_with
import tfnb
from tfnb.monitor import tensorboard as tbp
from tfnb.errors import ConfigError
from tfnb.notebook.tensorboard import TensorBoardPanel, status_html
from tfnb.notebook.tensorboard import browser_url, databricks_proxy_url, tensorboard

_WRITE_SCALARS = textwrap.dedent("""
    import sys
    import tensorflow as tf
    log_dir = sys.argv[1]
    for run, tag, values in (("train", "loss", [1.0, 0.5, 0.25, 0.125, 0.0625]),
                             ("eval", "accuracy", [0.5, 0.625, 0.75, 0.875, 0.9375])):
        writer = tf.summary.create_file_writer(f"{log_dir}/{run}")
        with writer.as_default():
            for step, value in enumerate(values):
                tf.summary.scalar(tag, value, step=step)
        writer.close()
""")


def write_scalars(log_dir: Path) -> Path:
    """Event files from ``tf.summary``: run train/loss and run eval/accuracy, 5 steps each.

    Written in a child process so this test process never imports TensorFlow (other tests set
    TF_USE_LEGACY_KERAS before their first import).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    subprocess.run([sys.executable, "-c", _WRITE_SCALARS, str(log_dir)], check=True, env=env, timeout=300)
    return log_dir


def get_json(url: str, timeout: float = 30):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def leftovers(folder: Path) -> list[str]:
    """The files in a bookkeeping folder, TensorBoard's own records (``.tensorboard-info/``) included."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir())


def refuses(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def info_dir(tmp_path_factory):
    """tfnb's TensorBoard bookkeeping in a private folder, so other test runs' instances are not seen."""
    path = tmp_path_factory.mktemp("tb-info")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TFNB_TENSORBOARD_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    return write_scalars(tmp_path_factory.mktemp("tb-logs") / "logs")


@pytest.fixture(scope="module")
def tb(info_dir, log_dir):
    outcome = tbp.ensure_tensorboard(log_dir, reload_interval=1)
    assert isinstance(outcome, tbp.Launched), outcome
    yield outcome
    tbp.stop(outcome)
    assert not kill_processes_with(str(log_dir)), "TensorBoard outlived stop()"


# ---------------------------------------------------------------- the running instance


def test_tensorboard_serves_the_scalars_over_http(tb, log_dir):
    assert tb.url == f"http://127.0.0.1:{tb.port}/"
    assert tb.log_dir == str(log_dir)
    tags = get_json(tb.url + "data/plugin/scalars/tags")
    assert set(tags) == {"train", "eval"}
    assert "loss" in tags["train"] and "accuracy" in tags["eval"]
    points = get_json(tb.url + "data/plugin/scalars/scalars?run=train&tag=loss")
    assert [step for _wall, step, _v in points] == [0, 1, 2, 3, 4]
    assert [v for _wall, _step, v in points] == pytest.approx([1.0, 0.5, 0.25, 0.125, 0.0625])


def test_tensorboard_listens_on_loopback_only(tb):
    # Its own report of the flags it runs with, and no answer on a non-loopback address.
    env = get_json(tb.url + "data/environment")
    assert env["debug"]["flags"]["host"] == "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent; this just picks the outgoing interface
            own = s.getsockname()[0]
        except OSError:
            pytest.skip("no non-loopback interface")
    if own.startswith("127."):
        pytest.skip("no non-loopback interface")
    with socket.socket() as s:
        s.settimeout(5)
        assert s.connect_ex((own, tb.port)) != 0


def test_tensorboards_own_record_stays_in_the_private_folder(tb, info_dir):
    # TensorBoard writes a record of itself (pid, port, logdir) under $TMPDIR/.tensorboard-info, by default a
    # folder of the system temp dir that it makes writable by all users.
    record = info_dir / ".tensorboard-info" / f"pid-{tb.pid}.info"
    assert (json.loads(record.read_text())["port"], os.stat(record.parent).st_mode & 0o777) == (tb.port, 0o700)
    assert not (Path(tempfile.gettempdir()) / ".tensorboard-info" / f"pid-{tb.pid}.info").exists()


def test_second_call_reuses_the_same_process(tb, log_dir):
    again = tbp.ensure_tensorboard(str(log_dir) + "/", reload_interval=1)
    assert isinstance(again, tbp.Reused)
    assert isinstance(tbp.ensure_tensorboard(log_dir, port=tb.port), tbp.Reused)
    assert (again.pid, again.port, again.url) == (tb.pid, tb.port, tb.url)
    assert tb.instance in tbp.instances()
    assert tfnb.tensorboard.instances() == tbp.instances()  # the public way to list them


def test_outside_a_notebook_the_url_is_printed(tb, log_dir, capsys):
    outcome = tensorboard(log_dir, display=False)  # no reload_interval given: any instance for log_dir
    assert isinstance(outcome, tbp.Reused) and outcome.pid == tb.pid
    out = capsys.readouterr().out
    assert f"Reusing TensorBoard for {log_dir} at http://127.0.0.1:{tb.port}/ (pid {tb.pid})" in out


def test_the_public_name_is_the_verb_whatever_was_imported(tb, log_dir, capsys):
    # importing the display layer's module does not rebind tfnb.tensorboard: it stays the function
    import tfnb
    import tfnb.notebook.tensorboard as module

    assert tfnb.tensorboard is module.tensorboard
    assert isinstance(tfnb.tensorboard(log_dir, display=False), tbp.Reused)
    assert capsys.readouterr().out.count(f"at {tb.url}") == 1


def test_panel_shows_status_link_buttons_and_iframe(tb, log_dir, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_PROXY_URL", raising=False)
    monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX", raising=False)
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    panel = TensorBoardPanel(log_dir, reload_interval=1, height=600)
    assert isinstance(panel.outcome, tbp.Reused) and panel.outcome.pid == tb.pid
    assert panel.url == tb.url
    status, row, frame = panel.widget.children
    reload_button, stop_button, link = row.children
    assert f"pid {tb.pid}" in status.value and str(log_dir) in status.value
    assert f'href="{tb.url}"' in link.value
    assert f'<iframe src="{tb.url}"' in frame.value and 'height="600"' in frame.value
    assert (reload_button.description, stop_button.description) == ("Reload", "Stop")
    assert not stop_button.disabled

    reload_button.click()  # what the button does in the browser
    assert panel.outcome.pid == tb.pid
    assert f'src="{tb.url}?tfnb_reload=2"' in frame.value


def test_panel_uses_the_proxy_url(tb, log_dir, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_PROXY_URL", "/user/alice/proxy/%PORT%/")
    panel = TensorBoardPanel(log_dir, reload_interval=1)
    assert panel.url == f"/user/alice/proxy/{tb.port}/"
    assert f'src="/user/alice/proxy/{tb.port}/"' in panel.widget.children[2].value


def test_panel_is_shown_once_per_cell(shell, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: shown.append(obj))
    panel = TensorBoardPanel("unused", start=False)
    panel._ipython_display_()   # tensorboard() shows it
    panel._ipython_display_()   # the same cell's value: no second copy
    shell.execution_count += 1
    panel._ipython_display_()   # a later cell evaluating `panel`
    assert shown == [panel.widget, panel.widget]


# ---------------------------------------------------------------- magics


@pytest.fixture
def shell():
    """A real (terminal-less) IPython shell; dropped afterwards so other tests see no IPython."""
    from IPython.core.interactiveshell import InteractiveShell

    yield InteractiveShell.instance()
    InteractiveShell.clear_instance()


def test_magic_shows_tensorboard(tb, log_dir, shell, capsys):
    shell.extension_manager.load_extension("tfnb.notebook.magics")
    shell.run_line_magic("tfnb_tensorboard", f"--logdir {log_dir} --reload_interval 1")
    assert f"at http://127.0.0.1:{tb.port}/ (pid {tb.pid})" in capsys.readouterr().out


def test_magic_rejects_a_bad_line(shell):
    shell.extension_manager.load_extension("tfnb.notebook.magics")
    with pytest.raises(ConfigError, match="--logdir"):
        shell.run_line_magic("tfnb_tensorboard", "--port 6006")
    with pytest.raises(ConfigError, match="invalid int value: 'abc'"):
        shell.run_line_magic("tfnb_tensorboard", "--logdir x --port abc")


def test_load_ext_tfnb_offers_the_magic(shell):
    shell.run_line_magic("load_ext", "tfnb")
    assert "tfnb_tensorboard" in shell.magics_manager.magics["line"]


def test_tensorboards_own_magic_keeps_working_with_ours(shell):
    shell.extension_manager.load_extension("tfnb.notebook.magics")
    shell.extension_manager.load_extension("tensorboard")
    line = shell.magics_manager.magics["line"]
    assert line["tensorboard"].__module__ == "tensorboard.notebook"
    assert line["tfnb_tensorboard"].__module__ == "tfnb.notebook.magics"
    shell.extension_manager.reload_extension("tfnb.notebook.magics")  # loading ours again, after theirs
    assert shell.magics_manager.magics["line"]["tensorboard"].__module__ == "tensorboard.notebook"


# ---------------------------------------------------------------- failures


def test_port_in_use_is_a_clear_failure(tb, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    busy = tbp.ensure_tensorboard(other, port=tb.port)
    assert isinstance(busy, tbp.Failed)
    assert f"port {tb.port} on 127.0.0.1 is already in use by the TensorBoard pid {tb.pid}" in busy.error
    assert "port=None" in busy.fix
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        busy = tbp.ensure_tensorboard(other, port=taken)
    assert isinstance(busy, tbp.Failed) and "in use by another program" in busy.error


def test_bad_logdir_is_a_clear_failure(info_dir, tmp_path):
    before = sorted(info_dir.iterdir())
    missing = tbp.ensure_tensorboard(tmp_path / "nope")
    assert isinstance(missing, tbp.Failed)
    assert missing.error == f"log_dir {tmp_path / 'nope'} does not exist" and "os.makedirs" in missing.fix
    afile = tmp_path / "events.txt"
    afile.write_text("x")
    wrong = tbp.ensure_tensorboard(afile)
    assert isinstance(wrong, tbp.Failed) and "is a file, not a directory" in wrong.error
    assert sorted(info_dir.iterdir()) == before, "nothing was started"


@pytest.mark.parametrize("kwargs, message", [
    (dict(log_dir=None), "log_dir=None is not a path"),
    (dict(log_dir=""), "log_dir is empty"),
    (dict(log_dir="x", port=70000), "port=70000 is not a TCP port"),
    (dict(log_dir="x", host=""), "host='' is not an address"),
    (dict(log_dir="x", timeout=0), "timeout=0 must be a positive number"),
    (dict(log_dir="x", reload_interval="5"), "reload_interval='5' must be a positive number"),
])
def test_bad_arguments_raise_config_error(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        tbp.ensure_tensorboard(**kwargs)


def test_failed_outcome_renders_error_fix_and_output():
    failed = tbp.Failed("/x", "TensorBoard exited with code 1 before serving: ERROR: boom", "do this",
                        exit_code=1, output="line <1>\nERROR: boom")
    html = status_html(failed)
    assert "could not start: TensorBoard exited with code 1" in html and "Fix: do this" in html
    assert "line &lt;1&gt;" in html  # escaped


def test_stop_refuses_a_failed_outcome():
    with pytest.raises(ConfigError, match="Failed or TimedOut outcome has nothing to stop"):
        tbp.stop(tbp.Failed("/x", "e", "f"))


# ---------------------------------------------------------------- stale entries and stopping


def _write_entry(folder: Path, pid: int, log_dir: str, port: int = 1, proc_start: int = 0) -> Path:
    inst = tbp.TensorBoardInstance(pid=pid, port=port, host="127.0.0.1", log_dir=log_dir,
                                   url=f"http://127.0.0.1:{port}/", reload_interval=5.0, start_time=1.0,
                                   launched_by=pid, proc_start=proc_start)
    path = folder / f"{pid}.json"
    path.write_text(json.dumps({"format": 1, **inst.__dict__}))
    return path


def test_stale_entries_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TFNB_TENSORBOARD_DIR", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    dead_entry = _write_entry(tmp_path, dead.pid, str(tmp_path))
    # Live pids that are not the recorded process (the pid was recycled): entries removed,
    # processes left alone. One is not TensorBoard at all; one looks like TensorBoard but started
    # at another time than recorded.
    other = subprocess.Popen(["sleep", "60"])
    lookalike = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "tensorboard"])
    try:
        recycled_entry = _write_entry(tmp_path, other.pid, str(tmp_path))
        started = tbp._proc_start(lookalike.pid)
        assert started, "/proc/<pid>/stat should give a start time on Linux"
        lookalike_entry = _write_entry(tmp_path, lookalike.pid, str(tmp_path), proc_start=started + 1)
        garbage = tmp_path / "999999.json"
        garbage.write_text("{not json")
        assert tbp.instances() == []
        for path in (dead_entry, recycled_entry, lookalike_entry, garbage):
            assert not path.exists(), path
        assert other.poll() is None and lookalike.poll() is None
    finally:
        for p in (other, lookalike):
            p.kill()
            p.wait()


# Stands in for a hung TensorBoard: "tensorboard" in its command line, its port accepts
# connections, but it never answers (like a TensorBoard stopped with SIGSTOP, without paying
# for one more TensorBoard start).
_HUNG = textwrap.dedent("""
    import socket, sys, time
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    print(s.getsockname()[1], flush=True)
    time.sleep(600)
""")


@pytest.mark.slow
def test_hung_instance_is_replaced_and_stop_leaves_nothing(tmp_path, monkeypatch):
    info = tmp_path / "info"
    monkeypatch.setenv("TFNB_TENSORBOARD_DIR", str(info))
    log_dir = tmp_path / "logs2"
    log_dir.mkdir()
    hung = subprocess.Popen([sys.executable, "-c", _HUNG, "fake-tensorboard", str(log_dir)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        port = int(hung.stdout.readline())
        info.mkdir()
        entry = _write_entry(info, hung.pid, str(log_dir), port, proc_start=tbp._proc_start(hung.pid))
        outcome = tbp.ensure_tensorboard(log_dir, reload_interval=5)
        assert isinstance(outcome, tbp.Launched), outcome
        assert hung.wait(timeout=30) is not None, "hung instance not stopped"
        assert not entry.exists()

        assert get_json(outcome.url + "data/environment")["data_location"] == str(log_dir)
        assert tbp.stop(outcome) is True
        assert refuses(outcome.port), "port still open after stop()"
        assert not processes_with(str(log_dir)), "TensorBoard or its data server outlived stop()"
        assert leftovers(info) == [".lock"]
        assert tbp.stop(outcome) is False
    finally:
        hung.kill()
        hung.wait()
        kill_processes_with(str(log_dir), wait=0)


@pytest.mark.slow
def test_tensorboard_exiting_at_start_is_a_failure_with_its_output(tmp_path, monkeypatch):
    monkeypatch.setenv("TFNB_TENSORBOARD_DIR", str(tmp_path / "info"))
    # 192.0.2.1 (TEST-NET-1) is not an address of this machine: TensorBoard cannot bind and exits.
    outcome = tbp.ensure_tensorboard(tmp_path, host="192.0.2.1")
    assert isinstance(outcome, tbp.Failed), outcome
    assert outcome.exit_code not in (None, 0)
    assert outcome.error.startswith(f"TensorBoard exited with code {outcome.exit_code} before serving: ")
    assert "192.0.2.1" in outcome.fix
    assert outcome.output
    assert not processes_with(str(tmp_path)) and leftovers(tmp_path / "info") == [".lock"]


def test_interrupting_the_start_leaves_no_process(tmp_path):
    # A notebook user pressing "interrupt" while TensorBoard starts: KeyboardInterrupt in the wait.
    log_dir = tmp_path / "logs3"
    log_dir.mkdir()
    env = dict(os.environ, TFNB_TENSORBOARD_DIR=str(tmp_path / "info"))
    start = "import sys; from tfnb.monitor.tensorboard import ensure_tensorboard; ensure_tensorboard(sys.argv[1])"
    child = subprocess.Popen([sys.executable, "-c", start, str(log_dir)], env=env, stderr=subprocess.PIPE, text=True)

    def tensorboards():
        return [p for p in processes_with(str(log_dir)) if "tensorboard.main" in p]

    try:
        deadline = time.monotonic() + 60
        while not tensorboards():
            assert child.poll() is None and time.monotonic() < deadline, "TensorBoard was not started"
            time.sleep(0.05)  # waiting for another process to appear: nothing to block on
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
        assert "KeyboardInterrupt" in err
        assert not tensorboards(), "TensorBoard outlived the interrupted start"
        assert leftovers(tmp_path / "info") == [".lock"]
    finally:
        child.kill()
        child.wait()
        kill_processes_with(str(log_dir), wait=0)


def test_timeout_stops_the_process(tmp_path, monkeypatch):
    monkeypatch.setenv("TFNB_TENSORBOARD_DIR", str(tmp_path / "info"))
    outcome = tbp.ensure_tensorboard(tmp_path, timeout=0.3)
    assert isinstance(outcome, tbp.TimedOut), outcome
    assert "raise timeout=" in outcome.fix
    assert not any(p.startswith(f"{outcome.pid}:") for p in processes_with("tensorboard"))
    assert leftovers(tmp_path / "info") == [".lock"]


# ---------------------------------------------------------------- browser URLs (no live proxy here)


def _running(port=6006):
    return SimpleNamespace(port=port, url=f"http://127.0.0.1:{port}/")


def test_plain_jupyter_uses_the_loopback_url():
    assert browser_url(_running(), environ={}) == "http://127.0.0.1:6006/"


def test_proxy_template_wins():
    env = {"TENSORBOARD_PROXY_URL": "https://hub.example/user/a/proxy/%PORT%/",
           "JUPYTERHUB_SERVICE_PREFIX": "/user/a/", "DATABRICKS_RUNTIME_VERSION": "15.4"}
    assert browser_url(_running(), environ=env) == "https://hub.example/user/a/proxy/6006/"
    assert browser_url(_running(), environ=env, proxy_url="/p/%PORT%/") == "/p/6006/"


# URL forms as the proxies document them, with their placeholders: the tests below check that what
# browser_url gives parses as the documented form with the right parts, not that it equals the code's
# own format string.
# jupyter-server-proxy (docs/source/arbitrary-ports-hosts.md): "<notebook-base>/proxy/<port>" removes
# the prefix before the request reaches the server (TensorBoard serves from "/", so this is the form it
# needs); "<notebook-base>/proxy/absolute/<port>" passes the full path through.
JSP_PROXY = "<notebook-base>/proxy/<port>/"
JSP_ABSOLUTE = "<notebook-base>/proxy/absolute/<port>/"
# Databricks driver proxy: the browser form (the workspace login's session) and the API form (bearer
# token, for REST clients; an iframe cannot send one).
DATABRICKS_BROWSER = "https://<workspace>/driver-proxy/o/<org-id>/<cluster-id>/<port>/"
DATABRICKS_API = "https://<workspace>/driver-proxy-api/o/<org-id>/<cluster-id>/<port>/"


def parse_as(form: str, url: str) -> dict | None:
    """The placeholder values when ``url`` has the documented ``form``, else None."""
    import re

    pattern = ""
    for literal, name in re.findall(r"([^<]*)(?:<([^>]+)>)?", form):
        pattern += re.escape(literal)
        if name:
            pattern += f"(?P<{name.replace('-', '_')}>{'.*' if name == 'notebook-base' else '[^/]+'})"
    m = re.fullmatch(pattern, url)
    return m.groupdict() if m else None


def test_jupyterhub_uses_jupyter_server_proxy():
    url = browser_url(_running(7000), environ={"JUPYTERHUB_SERVICE_PREFIX": "/user/alice/"})
    assert parse_as(JSP_PROXY, url) == {"notebook_base": "/user/alice", "port": "7000"}
    assert parse_as(JSP_ABSOLUTE, url) is None


# Databricks cannot run here: the Spark conf is given as a dict (what spark.conf.get would return there).
_TAGS = {"spark.databricks.clusterUsageTags.clusterOwnerOrgId": "1234567890",
         "spark.databricks.clusterUsageTags.clusterId": "0101-123456-abcd"}


def test_databricks_driver_proxy_url():
    conf = dict(_TAGS, **{"spark.databricks.workspaceUrl": "dbc-1.cloud.databricks.com"})
    for url in (databricks_proxy_url(6006, conf),
                browser_url(_running(), environ={"DATABRICKS_RUNTIME_VERSION": "15.4"}, spark_conf=conf)):
        assert parse_as(DATABRICKS_BROWSER, url) == {"workspace": "dbc-1.cloud.databricks.com",
                                                     "org_id": "1234567890", "cluster_id": "0101-123456-abcd",
                                                     "port": "6006"}
        assert parse_as(DATABRICKS_API, url) is None
    # Without the workspace URL: the same path, relative to the workspace page that shows the iframe.
    relative = databricks_proxy_url(6006, _TAGS)
    assert parse_as(DATABRICKS_BROWSER, "https://dbc-1.cloud.databricks.com" + relative)["cluster_id"] == \
        "0101-123456-abcd"
    assert relative.startswith("/driver-proxy/")


def test_databricks_without_tags_falls_back_to_the_driver_url():
    assert databricks_proxy_url(6006, {}) is None
    assert browser_url(_running(), environ={"DATABRICKS_RUNTIME_VERSION": "15.4"}, spark_conf={}) == \
        "http://127.0.0.1:6006/"
