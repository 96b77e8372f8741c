"""The Databricks simulator (tests/dbsim) on small synthetic notebooks: each test builds a DBC archive with
tools.dbc from notebooks written here, runs it as a Databricks user would (Run All on a cluster of a
simulated runtime) and checks what that user would see. One cluster of runtime A serves the module, as
one Databricks cluster serves a workspace's notebooks; runtime B gets one small test of its own."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import dbsim
from dbsim import RUNTIME_A, RUNTIME_B, Cluster

from tools import dbc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parent.parent


def _notebook(cells: list[str]) -> dict:
    """nbformat 4 JSON of ``cells``; a cell starting with ``# md`` is a markdown cell (the rest its text)."""
    out = []
    for src in cells:
        if src.startswith("# md\n"):
            out.append({"cell_type": "markdown", "metadata": {}, "source": src[len("# md\n"):]})
        else:
            out.append({"cell_type": "code", "metadata": {}, "source": src, "outputs": [], "execution_count": None})
    return {"nbformat": 4, "nbformat_minor": 5, "cells": out,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}


def archive(tmp_path: Path, notebooks: dict[str, list[str]], folder: str = "sim") -> Path:
    """A DBC archive of ``notebooks`` (name -> cells), built by tools.dbc as the project's archive is."""
    src = tmp_path / "notebooks"
    src.mkdir(exist_ok=True)
    for name, cells in notebooks.items():
        (src / f"{name}.ipynb").write_text(json.dumps(_notebook(cells)))
    return dbc.build(src, tmp_path / f"{folder}.dbc").path


def probe_wheel(out_dir: Path, value: str) -> Path:
    """A pure-Python wheel of a package ``dbsim_probe`` whose ``VALUE`` is ``value``, written by hand
    (a wheel is a zip with a dist-info): no build backend or index needed."""
    name, version = "dbsim_probe", "0.1"
    files = {f"{name}/__init__.py": f"VALUE = {value!r}\n".encode(),
             f"{name}-{version}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: dbsim\nRoot-Is-Purelib: true\n"
                                                  b"Tag: py3-none-any\n"}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for path, data in files.items())
    files[f"{name}-{version}.dist-info/RECORD"] = (record + f"{name}-{version}.dist-info/RECORD,,\n").encode()
    wheel = out_dir / f"{name}-{version}-py3-none-any.whl"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    wheel.write_bytes(buf.getvalue())
    return wheel


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.fixture(scope="module")
def cluster_a():
    with dbsim.cluster(RUNTIME_A) as cluster:
        yield cluster


def test_markdown_is_text_and_run_shares_the_namespace_nesting_relative_to_the_target(cluster_a, tmp_path):
    arc = archive(tmp_path, {
        "00_inner": ["INNER = 'inner'\nprint('inner ran')"],
        "01_outer": ["# md\n1 / 0  (a markdown command: never run)", "OUTER = 'outer'", '%run "./00_inner"',
                     "BOTH = OUTER + '+' + INNER\nBOTH"],
        "02_main": ["# md\n# Main", "%run ./01_outer", "print(BOTH, OUTER, INNER)"],
    })
    result = cluster_a.run(arc, "02_main").check()

    assert [(c.index, c.first_line, c.process) for c in result.commands] == [
        (2, "%run ./01_outer", 1), (3, "print(BOTH, OUTER, INNER)", 1)]
    run_cmd = result.command("%run")
    assert "inner ran" in run_cmd.stdout and "'outer+inner'" in run_cmd.stdout  # the target's last expression shows
    assert result.command("print").stdout == "outer+inner outer inner\n"
    assert result.restarts == () and result.processes == 1


def test_pip_install_of_a_wheel_on_a_volume_reaches_the_driver_and_the_executors_for_that_notebook_only(
        cluster_a, tmp_path):
    probe_wheel(cluster_a.host_path("/Volumes/main/default/libs"), "from the volume")
    on_executors = ("sc.parallelize(range(2), 2).map(lambda _: __import__('dbsim_probe').VALUE + ' @ ' + "
                    "__import__('sys').executable).collect()")
    arc = archive(tmp_path, {
        "01_install": [
            "try:\n    import dbsim_probe\nexcept ModuleNotFoundError as e:\n    print('before:', e)",
            "%pip install /Volumes/main/default/libs/dbsim_probe-0.1-py3-none-any.whl",
            "import dbsim_probe, sys\nprint('driver:', dbsim_probe.VALUE, sys.executable)",
            f"print('executors:', {on_executors})"],
        "02_forgot": ["import dbsim_probe"],
    })
    installed = cluster_a.run(arc, "01_install").check()

    assert "before: No module named 'dbsim_probe'" in installed.commands[0].stdout
    assert "Successfully installed dbsim-probe-0.1" in installed.command("%pip").stdout
    driver = installed.command("import dbsim_probe").stdout
    assert driver.startswith(f"driver: from the volume {dbsim.CLUSTERS}/cluster-")
    env_python = driver.split()[-1]
    executors = installed.command("print('executors:'").stdout
    assert executors.count(f"from the volume @ {env_python}") == 2, executors

    # Notebook-scoped: the next notebook starts from the runtime as built.
    forgot = cluster_a.run(arc, "02_forgot")
    assert forgot.failure is not None and forgot.failure.error_type == "ModuleNotFoundError"
    assert forgot.failure.index == 1 and "No module named 'dbsim_probe'" in forgot.failure.message


def test_pip_inside_a_run_target_fails_the_run_command_clearly(cluster_a, tmp_path):
    arc = archive(tmp_path, {
        "00_setup": ["print('setup starts')", "get_ipython().run_line_magic('pip', 'install --no-index nothing')"],
        "01_main": ["print('first')", "%run ./00_setup", "print('never')"],
    })
    result = cluster_a.run(arc, "01_main")

    assert result.failure is not None
    assert (result.failure.index, result.failure.first_line) == (2, "%run ./00_setup")
    assert result.failure.error_type == "PipInsideRun"
    assert "inside a %run target (sim/00_setup, run from sim/01_main)" in result.failure.message
    assert "PipInsideRun" in result.failure.traceback
    assert "<sim/00_setup command 2>" in result.failure.traceback  # the frame in the target, with its line
    assert "get_ipython().run_line_magic('pip', 'install --no-index nothing')" in result.failure.traceback
    assert [c.first_line for c in result.commands] == ["print('first')", "%run ./00_setup"]
    assert result.commands[1].stdout == "setup starts\n"


def test_restart_python_ends_the_command_and_a_run_in_progress_then_goes_on_in_a_new_process(cluster_a, tmp_path):
    arc = archive(tmp_path, {
        "00_restarts": ["print('target before restart')\ndbutils.library.restartPython()\nprint('not reached')",
                        "print('rest of the target: not reached')"],
        "01_main": ["x = 1\ndbutils.widgets.text('w', 'default')\ndbutils.widgets.text('p', 'default')",
                    "%run ./00_restarts",
                    "import os\nprint('x' in globals(), dbutils.widgets.get('w'), dbutils.widgets.get('p'), "
                    "spark.range(3).count(), os.getpid())",
                    "%restart_python",
                    "print('third process', 'os' in globals())"],
    })
    result = cluster_a.run(arc, "01_main", params={"p": "from the job"}).check()

    assert [(c.index, c.process, c.status) for c in result.commands] == [
        (1, 1, "ok"), (2, 1, "restart"), (3, 2, "ok"), (4, 2, "restart"), (5, 3, "ok")]
    assert result.commands[1].stdout == "target before restart\n"
    assert result.command("import os").stdout.startswith("False default from the job 3 ")
    assert result.command("print('third").stdout == "third process False\n"
    assert result.restarts == (2, 4) and result.processes == 3
    assert result.widgets == {"w": "default", "p": "from the job"}


def test_run_all_stops_at_the_first_command_that_raises_and_reports_it(cluster_a, tmp_path):
    shows = ("print('one')\ndisplayHTML('<b>shown</b>')\nfrom IPython.display import display as show, HTML\n"
             "show(HTML('<i>too</i>'))\ndisplay(spark.range(2))")
    arc = archive(tmp_path, {"01_fails": [shows, "def f():\n    raise ValueError('boom')\n\nf()", "print('never')"]})
    result = cluster_a.run(arc, "01_fails")

    assert not result.ok and [c.status for c in result.commands] == ["ok", "failed"]
    assert result.commands[0].html == ("<b>shown</b>", "<i>too</i>")
    assert result.commands[0].stdout.startswith("one\n<IPython.core.display.HTML object>\n+---+\n| id|\n")
    failure = result.failure
    assert (failure.index, failure.first_line, failure.process) == (2, "def f():", 1)
    assert (failure.error_type, failure.message) == ("ValueError", "boom")
    assert "raise ValueError('boom')" in failure.traceback and "ValueError: boom" in failure.traceback
    with pytest.raises(dbsim.NotebookFailed, match=r"Cmd 2 \('def f\(\):'.*ValueError: boom"):
        result.check()


def test_widgets_as_databricks_has_them_and_job_parameters_as_their_values(cluster_a, tmp_path):
    arc = archive(tmp_path, {"01_widgets": [
        "print('param before any widget:', dbutils.widgets.get('EPOCHS'))",
        "dbutils.widgets.text('EPOCHS', '10', 'Epochs')\n"
        "dbutils.widgets.dropdown('MODE', 'fast', ['fast', 'slow'])\n"
        "dbutils.widgets.dropdown('MODE', 'slow', ['fast', 'slow'])  # exists: keeps its value\n"
        "print(dbutils.widgets.get('EPOCHS'), dbutils.widgets.get('MODE'), sorted(dbutils.widgets.getAll().items()))",
        "try:\n    dbutils.widgets.dropdown('BAD', 'x', ['a', 'b'])\nexcept Exception as e:\n    print('refused:', e)",
        "dbutils.widgets.remove('MODE')\nprint(getArgument('MODE', 'gone'))",
        "dbutils.widgets.get('NEVER_CREATED')",
        "print('never')"]})
    result = cluster_a.run(arc, "01_widgets", params={"EPOCHS": "3"})

    assert result.commands[0].stdout == "param before any widget: 3\n"
    assert result.commands[1].stdout == "3 fast [('EPOCHS', '3'), ('MODE', 'fast')]\n"
    assert "refused: Default value 'x' of dropdown widget 'BAD' is not one of its choices" in result.commands[2].stdout
    assert result.commands[3].stdout == "gone\n"
    assert result.failure.index == 5 and result.failure.error_type == "InputWidgetNotDefined"
    assert ("com.databricks.dbutils_v1.InputWidgetNotDefined: No input widget named NEVER_CREATED"
            in result.failure.message)


def test_files_volumes_dbfs_working_directory_and_nothing_of_this_checkout(cluster_a, tmp_path):
    checks = f"CHECKOUT = {str(ROOT)!r}" + """
import os, sys, json
cwd = os.getcwd()
report = {
    "runtime": os.environ.get("DATABRICKS_RUNTIME_VERSION"),
    "cwd": cwd, "cwd_entries": os.listdir(cwd), "cwd_on_path": cwd in sys.path,
    "pythonpath": os.environ.get("PYTHONPATH"), "spark_home": os.environ.get("SPARK_HOME"),
    "tf_legacy": os.environ.get("TF_USE_LEGACY_KERAS"),
    "dbfs_tmp": os.path.isdir("/dbfs/tmp"),
    "runtime_writable": os.access(os.path.dirname(os.__file__), os.W_OK)
                        or os.access(os.path.dirname(json.__file__), os.W_OK),
    "runtime_site_writable": os.access(os.path.dirname(os.path.dirname(__import__("numpy").__file__)), os.W_OK),
    "checkout_on_path": [p for p in sys.path if p.startswith(CHECKOUT)],
    "checkout_entries": os.listdir(CHECKOUT),
}
with open("/Volumes/main/default/tfnb/from_01.txt", "w") as f:
    f.write("written by 01")
try:
    open("/Volumes/main/default/not_a_volume.txt", "w")
    report["beside_volume"] = "writable"
except OSError as e:
    report["beside_volume"] = type(e).__name__
dbutils.fs.put("dbfs:/tmp/dbsim/put.txt", "hello dbfs", overwrite=True)
report["head"] = dbutils.fs.head("/tmp/dbsim/put.txt")
report["ls"] = [f.name for f in dbutils.fs.ls("/Volumes/main/default/tfnb")]
print(json.dumps(report))
"""
    on_executors = ("sc.parallelize(range(2), 2).map(lambda _: __import__('importlib.util').util.find_spec('tfnb') "
                    "is None).collect()")
    # A Databricks worker is another machine: what the driver wrote to its /tmp or home is not on the executors.
    tmp_apart = ("open('/tmp/driver_only.txt', 'w').write('driver')\n"
                 "open(os.path.expanduser('~/driver_home.txt'), 'w').write('driver')\n"
                 "def probe(i):\n"
                 "    import os\n"
                 "    seen = (os.path.exists('/tmp/driver_only.txt')\n"
                 "            or os.path.exists(os.path.expanduser('~/driver_home.txt')))\n"
                 "    open('/tmp/executor_wrote.txt', 'w').write('x')\n"
                 "    return seen\n"
                 "print('executors see the driver /tmp:', sc.parallelize(range(2), 2).map(probe).collect(), "
                 "os.path.exists('/tmp/executor_wrote.txt'))")
    arc = archive(tmp_path, {
        "01_files": [checks, f"print('executors without tfnb:', {on_executors})", tmp_apart,
                     "import subprocess\nsubprocess.Popen(['sleep', '987'])", "import tfnb"],
        "02_reads": ["print(open('/Volumes/main/default/tfnb/from_01.txt').read())"],
    })
    first = cluster_a.run(arc, "01_files")
    wrote, shown = first.commands[0].stdout.splitlines()
    assert wrote == "Wrote 10 bytes."  # what dbutils.fs.put prints
    report = json.loads(shown)

    assert report == {
        "runtime": "15.4", "cwd": "/Workspace/Users/sim-user@example.com/sim", "cwd_entries": [],
        "cwd_on_path": True, "pythonpath": None, "spark_home": None, "tf_legacy": None, "dbfs_tmp": True,
        "runtime_writable": False, "runtime_site_writable": False,
        "checkout_on_path": [], "checkout_entries": [], "beside_volume": "OSError", "head": "hello dbfs",
        "ls": ["from_01.txt"]}
    assert first.command("print('executors").stdout == "executors without tfnb: [True, True]\n"
    assert first.command("open('/tmp").stdout == "executors see the driver /tmp: [False, False] False\n"
    assert cluster_a.host_path("/tmp/driver_only.txt").read_text() == "driver"
    assert any(cluster_a.executor_tmp(i).joinpath("executor_wrote.txt").exists() for i in (0, 1))
    assert cluster_a.host_path(str(Path.home() / "driver_home.txt")).read_text() == "driver"
    assert not os.path.exists("/tmp/driver_only.txt") and not (Path.home() / "driver_home.txt").exists()
    assert first.failure.index == 5 and first.failure.error_type == "ModuleNotFoundError"
    assert "No module named 'tfnb'" in first.failure.message
    # A process the notebook left behind is reported and gone.
    assert [p for p in first.leftovers if p.endswith("sleep 987")], first.leftovers
    assert not [p for p in first.leftovers if _running(int(p.split(":")[0]))]

    # Files outlive the notebook on the cluster, and exist only there.
    assert cluster_a.run(arc, "02_reads").check().commands[0].stdout == "written by 01\n"
    assert cluster_a.host_path("/Volumes/main/default/tfnb/from_01.txt").read_text() == "written by 01"
    assert cluster_a.host_path("/dbfs/tmp/dbsim/put.txt").read_text() == "hello dbfs"
    assert not os.path.exists("/Volumes/main/default/tfnb/from_01.txt")


def _carried_wheel() -> tuple[str, bytes]:
    """(file name, bytes) of the tfnb wheel the project's archive carries."""
    import re

    (cell,) = [c for nb in dbc.read(ROOT / "dbc" / "tfnb.dbc") for c in nb.cells if c.source.startswith("TFNB_WHEEL = (")]
    name, _, b64 = re.match(r'TFNB_WHEEL = \("([^"]+)", "([0-9a-f]{64})", "([^"]+)"\)', cell.source).groups()
    return name, base64.b64decode(b64)


def test_tfnb_install_where_pip_runs_only_as_a_cells_first_line_stops_with_the_line_to_run(cluster_a, tmp_path):
    """On a runtime whose %pip is only a command's first line (no line magic for code to call), tfnb_install()
    stops with the one %pip line; that line in a command of its own installs tfnb, and tfnb_install() then has
    nothing to do. The install notebook is this tree's, with the wheel the project's archive carries."""
    import shutil

    wheel = _carried_wheel()

    def build(cells: list[str], folder: str) -> Path:
        src = tmp_path / folder
        src.mkdir()
        shutil.copy(ROOT / "notebooks" / "tfnb_install.ipynb", src)
        (src / "01_caller.ipynb").write_text(json.dumps(_notebook(cells)))
        return dbc.build(src, tmp_path / f"{folder}.dbc", folder="tfnb", wheel=wheel).path

    digest = hashlib.sha256(wheel[1]).hexdigest()
    # someone in the workspace planted another file where the install writes the wheel (the DBFS root is everyone's)
    planted = cluster_a.host_path(f"/dbfs/tmp/tfnb/{cluster_a.user}/wheels/{wheel[0]}")
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(wheel[1] + b"planted")
    stopped = cluster_a.run(build(["%run ./tfnb_install", "tfnb_install()"], "first"), "01_caller", pip="cell")
    assert (stopped.failure.index, stopped.failure.error_type) == (2, "RuntimeError"), stopped.failure
    said, line, cause = stopped.failure.message.splitlines()
    assert said == ("tfnb_install: this runtime did not run %pip from code; run this line in a cell of its own "
                    "above this one, then this cell again:")
    # the archive's own bytes replaced the planted file, and pip is pinned to their sha256
    assert line == f"%pip install 'tfnb @ file:///dbfs/tmp/tfnb/{cluster_a.user}/wheels/{wheel[0]}#sha256={digest}'"
    assert planted.read_bytes() == wheel[1]
    assert cause.startswith("(%pip from code: UsageError: Line magic function `%pip` not found")

    pasted = cluster_a.run(build([line, "%run ./tfnb_install", "tfnb_install()"], "pasted"), "01_caller",
                           pip="cell").check()
    version = wheel[0].split("-")[1]
    assert f"Successfully installed tfnb-{version}" in pasted.command("%pip").stdout
    assert pasted.command("tfnb_install()").stdout.startswith(f"tfnb {version} is already importable")

    # a wheel named by TFNB_SOURCE that is not the one pinned (here: the archive's own name, its hash): one line
    cluster_a.host_path(f"/Volumes/main/default/libs/{wheel[0]}").write_bytes(wheel[1] + b"planted")
    refused = cluster_a.run(build(["%run ./tfnb_install", "tfnb_install()"], "pinned"), "01_caller",
                            params={"TFNB_SOURCE": f"/Volumes/main/default/libs/{wheel[0]}"})
    assert (refused.failure.index, refused.failure.error_type) == (2, "TfnbInstallError"), refused.failure
    assert "\n" not in refused.failure.message
    assert refused.failure.message.startswith(f"tfnb_install: /Volumes/main/default/libs/{wheel[0]} is not the wheel "
                                              f"TFNB_SOURCE pins (sha256 ")
    assert "so it is not installed" in refused.failure.message


def test_two_users_of_one_workspace_get_runs_of_their_own_and_neither_touches_the_others(cluster_a, tmp_path):
    """Two colleagues, one workspace (same DBFS root, same volume): each one's 00_constants of the project's archive,
    with the defaults, gives a run folder of their own; one who points at the other's folder is stopped before
    anything is written there."""
    archive_path = ROOT / "dbc" / "tfnb.dbc"
    alice, bob = "alice@example.com", "bob@example.com"
    who = archive(tmp_path, {"01_who": [
        "ctx = dbutils.notebook.entry_point.getDbutils().notebook().getContext()\n"
        "print(spark.sql('select current_user()').first()[0], ctx.userName().get(), ctx.apiToken().isDefined(), "
        "__import__('os').getcwd())"]})
    assert cluster_a.run(who, "01_who", user=bob).check().stdout == f"{bob} {bob} False /Workspace/Users/{bob}/sim\n"
    # both at once, side by side on the cluster: with the defaults, and on a volume they share
    for params, base in (({}, "/dbfs/tmp/tfnb"), ({"VOLUME": "main.default.tfnb"}, "/Volumes/main/default/tfnb/tfnb")):
        with ThreadPoolExecutor(2) as pool:
            both = dict(zip((alice, bob), pool.map(
                lambda u: cluster_a.run(archive_path, "00_constants", params=params, user=u), (alice, bob))))
        for user, ran in both.items():
            assert f"run dir: {base}/{user}/digits ({user}'s)" in ran.check().stdout
            assert cluster_a.host_path(f"{base}/{user}/digits/tfnb-owner.txt").read_text() == f"{user}\n"
    (cluster_a.host_path(f"/dbfs/tmp/tfnb/{alice}/digits/model")).mkdir()
    (cluster_a.host_path(f"/dbfs/tmp/tfnb/{alice}/digits/model/ckpt-1.weights.h5")).write_text("alice's")

    # bob aims at alice's folder, even with FRESH_RUN: stopped at 00_constants, before any write or delete
    taken = cluster_a.run(archive_path, "00_constants", user=bob,
                          params={"BASE_DIR": f"/dbfs/tmp/tfnb/{alice}", "FRESH_RUN": "True"})
    assert taken.failure is not None and taken.failure.error_type == "PermissionError", taken.failure
    assert taken.failure.message.startswith(f"/dbfs/tmp/tfnb/{alice}/digits holds a run of {alice}, and you are {bob}: "
                                            "these notebooks never write to or delete another user's run")
    assert cluster_a.host_path(f"/dbfs/tmp/tfnb/{alice}/digits/model/ckpt-1.weights.h5").read_text() == "alice's"


def test_runtime_b_runs_spark_4_on_python_3_12_without_tensorflow_or_dbfs(tmp_path):
    dbsim.need_simulator()
    arc = archive(tmp_path, {"01_b": [
        "import os, sys, importlib.util, pyspark\n"
        "print(os.environ['DATABRICKS_RUNTIME_VERSION'], pyspark.__version__, sys.version_info[:2], spark.version)",
        "print(importlib.util.find_spec('tensorflow') is None, os.path.exists('/dbfs'), "
        "spark.range(100).selectExpr('sum(id)').first()[0])",
        "dbutils.fs.ls('dbfs:/tmp')"]})
    # one executor: the one Spark job here runs no Python on it
    with Cluster(RUNTIME_B, volumes=("main.default.tfnb",), executors=1) as cluster:
        result = cluster.run(arc, "01_b")

    assert result.commands[0].stdout == "17.3 4.0.1 (3, 12) 4.0.1\n"
    assert result.commands[1].stdout == "True False 4950\n"
    assert result.failure.index == 3 and result.failure.error_type == "PermissionError"
    assert "this workspace has no DBFS root" in result.failure.message


def test_a_python_process_that_dies_or_hangs_fails_the_command_it_was_running(cluster_a, tmp_path):
    arc = archive(tmp_path, {"01_dies": ["print('a')", "import os\nos._exit(3)", "print('never')"],
                             "02_hangs": ["import time\ntime.sleep(600)", "print('never')"]})
    died = cluster_a.run(arc, "01_dies")
    assert [(c.index, c.status) for c in died.commands] == [(1, "ok"), (2, "died")]
    assert (died.failure.index, died.failure.error_type) == (2, "PythonProcessDied")
    assert died.failure.message == "the Python process exited with code 3 during this command"

    hung = cluster_a.run(arc, "02_hangs", timeout=20)
    assert [(c.index, c.status) for c in hung.commands] == [(1, "timeout")]
    assert hung.failure.error_type == "TimeoutError" and "within 20 s" in hung.failure.message
    assert 20 <= hung.seconds < 60
