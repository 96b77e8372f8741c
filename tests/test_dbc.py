"""DBC archive build / read / extract: real zips, real files, the real command line."""
from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tools import dbc
from tfnb.errors import ConfigError, DbcFormatError

ROOT = Path(__file__).resolve().parent.parent

# Every field Databricks' exporter writes, in its order (from a 2024 DBC export).
NOTEBOOK_FIELDS = [
    "version", "origId", "name", "language", "commands", "dashboards", "guid", "globalVars",
    "iPythonMetadata", "inputWidgets", "notebookMetadata", "reposExportFormat"]
COMMAND_FIELDS = [
    "version", "origId", "guid", "subtype", "commandType", "position", "command", "commandVersion",
    "state", "results", "resultDbfsStatus", "resultDbfsErrorMessage", "errorSummary", "errorTraceType",
    "error", "errorDetails", "baseErrorDetails", "workflows", "startTime", "submitTime", "finishTime",
    "collapsed", "bindings", "inputWidgets", "displayType", "width", "height", "xColumns", "yColumns",
    "pivotColumns", "pivotAggregation", "useConsistentColors", "customPlotOptions", "commentThread",
    "commentsVisible", "parentHierarchy", "diffInserts", "diffDeletes", "globalVars", "latestUser",
    "latestUserId", "commandTitle", "showCommandTitle", "hideCommandCode", "hideCommandResult",
    "isLockedInExamMode", "iPythonMetadata", "metadata", "streamStates", "datasetPreviewNameToCmdIdMap",
    "tableResultIndex", "listResultMetadata", "subcommandOptions", "contentSha256Hex",
    "tableResultSettingsMap", "nuid"]


_ids = itertools.count(1)


def _cell(kind, source, *, tags=None, outputs=None, hidden=False):
    meta = {}
    if tags:
        meta["tags"] = tags
    if hidden:
        meta["jupyter"] = {"source_hidden": True}
    cell = {"cell_type": kind, "id": f"c{next(_ids)}", "metadata": meta,
            "source": source.splitlines(keepends=True)}
    if kind == "code":
        cell.update(execution_count=None, outputs=outputs or [])
    return cell


def _write_nb(folder: Path, name: str, cells) -> Path:
    doc = {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
           "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                        "language_info": {"name": "python"}}}
    path = folder / f"{name}.ipynb"
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return path


NOTEBOOKS = {
    "00_constants": [
        ("markdown", "# Constants\n\nShared settings, used by `%run ./00_constants`.", {}),
        ("code", "NUM_WORKERS = 2\nDATA = 'digits'", {}),
    ],
    "01_train": [
        ("markdown", "# Train\n\n* two workers\n* résumé ✓", {}),
        ("code", "%pip install tfnb", {}),
        ("code", "%run ./00_constants.ipynb", {}),  # Jupyter form; Databricks form in the DBC
        ("code", "epochs = 3\nbatch_size = 64", {"tags": ["parameters"]}),
        ("code", "%sh\nls -la /tmp\necho done", {"hidden": True}),
        ("code", "import tfnb\n\n\nresult = tfnb.run(train_fn, num_workers=NUM_WORKERS)\n", {}),
        ("markdown", "", {}),
    ],
}


@pytest.fixture
def src(tmp_path) -> Path:
    folder = tmp_path / "notebooks"
    folder.mkdir()
    for name, cells in NOTEBOOKS.items():
        _write_nb(folder, name, [_cell(k, s, **kw) for k, s, kw in cells])
    (folder / ".ipynb_checkpoints").mkdir()   # Jupyter's folder: must not end up in the archive
    (folder / "notes.txt").write_text("not a notebook")
    return folder


def test_build_writes_databricks_entries_in_run_order_with_full_field_set(src, tmp_path):
    res = dbc.build(src, tmp_path / "out" / "tfnb.dbc")

    assert res.path == tmp_path / "out" / "tfnb.dbc"
    assert res.notebooks == ("tfnb/00_constants", "tfnb/01_train")
    data = res.path.read_bytes()
    assert res.sha256 == hashlib.sha256(data).hexdigest()
    with zipfile.ZipFile(res.path) as zf:
        assert zf.testzip() is None
        # Like a Databricks export: manifest first, a FolderV1 entry, every entry deflated.
        assert zf.namelist() == ["manifest.mf", "tfnb/", "tfnb/00_constants.python", "tfnb/01_train.python"]
        for info in zf.infolist():
            assert info.date_time == (1980, 1, 1, 0, 0, 0)
            assert info.compress_type == zipfile.ZIP_DEFLATED and info.compress_size < info.file_size
        manifest = json.loads(zf.read("manifest.mf"))
        assert list(manifest) == ["version", "guid", "origId", "name"]
        assert (manifest["version"], manifest["origId"], manifest["name"]) == ("Manifest", -1, "manifest.mf")
        folder = json.loads(zf.read("tfnb/"))
        assert (folder["version"], folder["name"], folder["children"]) == ("FolderV1", "tfnb", [])
        docs = {n: json.loads(zf.read(n)) for n in zf.namelist()[2:]}

    train = docs["tfnb/01_train.python"]
    assert list(train) == NOTEBOOK_FIELDS
    assert (train["version"], train["name"], train["language"]) == ("NotebookV1", "01_train", "python")
    assert [list(c) for c in train["commands"]] == [COMMAND_FIELDS] * 7
    cmds = train["commands"]
    assert [c["position"] for c in cmds] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert {c["version"] for c in cmds} == {"CommandV1"}
    assert {(c["subtype"], c["commandType"], c["state"]) for c in cmds} == {("command", "auto", "input")}
    assert [c["command"] for c in cmds] == [
        "%md\n# Train\n\n* two workers\n* résumé ✓",
        "%pip install tfnb",
        "%run ./00_constants",
        "epochs = 3\nbatch_size = 64",
        "%sh\nls -la /tmp\necho done",
        "import tfnb\n\n\nresult = tfnb.run(train_fn, num_workers=NUM_WORKERS)\n",
        "%md\n",
    ]
    assert all(c["metadata"] == {} for c in cmds)  # as in exports; the papermill tag stays in Jupyter
    assert cmds[4]["hideCommandCode"] is True and cmds[3]["hideCommandCode"] is False
    # Ids look like Databricks' and are unique across the archive.
    all_cmds = cmds + docs["tfnb/00_constants.python"]["commands"]
    assert len({c["guid"] for c in all_cmds}) == len({c["nuid"] for c in all_cmds}) == len(all_cmds)
    assert len({c["origId"] for c in all_cmds}) == len(all_cmds)
    assert all(len(c["guid"]) == 36 and c["guid"].count("-") == 4 for c in all_cmds)
    assert all(isinstance(c["origId"], int) and 0 < c["origId"] < 2 ** 53 for c in all_cmds)
    # Nothing about the machine or the person who built it leaks in.
    assert b"/tmp" not in data.replace(b"ls -la /tmp", b"") and os.environ.get("USER", "root").encode() not in data


def test_build_is_byte_identical_whatever_the_file_times(src, tmp_path):
    first = dbc.build(src, tmp_path / "a" / "tfnb.dbc")
    for p in src.glob("*.ipynb"):
        os.utime(p, (1_000_000_000, 1_000_000_000))
    second = dbc.build(src, tmp_path / "b" / "tfnb.dbc")
    assert first.path.read_bytes() == second.path.read_bytes()
    assert first.sha256 == second.sha256
    assert dbc.is_fresh(src, first.path)

    # A changed cell changes the archive and is detected as stale.
    nb = src / "00_constants.ipynb"
    nb.write_text(nb.read_text().replace("NUM_WORKERS = 2", "NUM_WORKERS = 3"))
    assert not dbc.is_fresh(src, first.path)


def test_round_trip_to_ipynb_keeps_every_cell_source_type_and_hidden_flag(src, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    archive = dbc.build(src, tmp_path / "tfnb.dbc").path
    written = dbc.extract(archive, tmp_path / "out", formats=("ipynb",))

    assert written == [tmp_path / "out" / "tfnb" / "00_constants.ipynb", tmp_path / "out" / "tfnb" / "01_train.ipynb"]
    for path in written:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        original = nbformat.read(src / path.name, as_version=4)
        assert [(c.cell_type, c.source) for c in nb.cells] == [(c.cell_type, c.source) for c in original.cells]
        assert all("tags" not in c.metadata for c in nb.cells)  # exports carry no tags
        assert [c.metadata.get("jupyter", {}) for c in nb.cells] == \
            [c.metadata.get("jupyter", {}) for c in original.cells]
        assert nb.metadata.kernelspec.name == "python3"

    # read() gives the same, typed.
    train = dbc.read(archive)[1]
    assert (train.path, train.name, train.language, train.folder) == ("tfnb/01_train", "01_train", "python", "tfnb")
    assert train.cells[3] == dbc.Cell("code", "epochs = 3\nbatch_size = 64")
    assert train.cells[2].source == "%run ./00_constants"


def test_extract_writes_databricks_source_format(src, tmp_path):
    archive = dbc.build(src, tmp_path / "tfnb.dbc").path
    written = dbc.extract(archive, tmp_path / "out", formats=("py",))
    assert [p.name for p in written] == ["00_constants.py", "01_train.py"]
    assert written[1].read_text(encoding="utf-8") == (
        "# Databricks notebook source\n"
        "# MAGIC %md\n# MAGIC # Train\n# MAGIC\n# MAGIC * two workers\n# MAGIC * résumé ✓\n"
        "\n# COMMAND ----------\n\n"
        "# MAGIC %pip install tfnb\n"
        "\n# COMMAND ----------\n\n"
        "# MAGIC %run ./00_constants\n"
        "\n# COMMAND ----------\n\n"
        "epochs = 3\nbatch_size = 64\n"
        "\n# COMMAND ----------\n\n"
        "# MAGIC %sh\n# MAGIC ls -la /tmp\n# MAGIC echo done\n"
        "\n# COMMAND ----------\n\n"
        "import tfnb\n\n\nresult = tfnb.run(train_fn, num_workers=NUM_WORKERS)\n\n"
        "\n# COMMAND ----------\n\n"
        "# MAGIC %md\n# MAGIC\n")


def _zip(path: Path, entries: dict[str, object]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, content in entries.items():
            zf.writestr(name, content if isinstance(content, str | bytes) else json.dumps(content))
    return path


def _export_cmd(position, command, **extra):
    return {"version": "CommandV1", "subtype": "command", "position": position, "command": command, **extra}


def test_read_accepts_a_databricks_export(tmp_path):
    # Shaped like a Workspace export: manifest at the root, commands out of order, inline %md.
    archive = _zip(tmp_path / "export.dbc", {
        "manifest.mf": '{"version":"DBCv1"}',
        "Shared/demo/Analysis.python": {
            "version": "NotebookV1", "origId": 1, "name": "Analysis", "language": "python",
            "commands": [_export_cmd(2000.0, "display(df)"),
                         _export_cmd(500.5, "%md ## Load\nthe data"),
                         _export_cmd(1000.0, "df = spark.table('t')", hideCommandResult=True)]},
        "Shared/demo/Report.sql": {
            "version": "NotebookV1", "name": "Report", "language": "sql",
            "commands": [_export_cmd(1, "SELECT 1")]},
    })
    analysis, report = dbc.read(archive)
    assert analysis.path == "Shared/demo/Analysis"
    assert [(c.cell_type, c.source) for c in analysis.cells] == [
        ("markdown", "## Load\nthe data"), ("code", "df = spark.table('t')"), ("code", "display(df)")]
    assert analysis.cells[1].hide_result
    written = dbc.extract(archive, tmp_path / "out")
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in written) == [
        "Shared/demo/Analysis.ipynb", "Shared/demo/Analysis.py", "Shared/demo/Report.ipynb", "Shared/demo/Report.sql"]
    assert (tmp_path / "out/Shared/demo/Report.sql").read_text() == "-- Databricks notebook source\nSELECT 1\n"


FIXTURES = ROOT / "tests" / "fixtures"


def test_read_real_databricks_exports():
    # Public files exported by Databricks (tests/fixtures/README.md): data descriptors, manifest.mf,
    # FolderV1 folder entries, commands opening with a blank line, %md-sandbox, no metadata field.
    with zipfile.ZipFile(FIXTURES / "learning_spark_v2_ch11.dbc") as zf:
        assert all(i.flag_bits & 0x08 and i.compress_type == zipfile.ZIP_DEFLATED for i in zf.infolist())
    hyperopt, readme = dbc.read(FIXTURES / "learning_spark_v2_ch11.dbc")
    assert hyperopt.path == "Learning-Spark/Python/Chapter11/11-6 Hyperopt"
    # "\n%md\n# README..." in the export: one markdown cell, the magic line and blank line gone
    (cell,) = readme.cells
    assert cell.cell_type == "markdown" and cell.source.startswith("# README\n\nTo run the notebooks")
    kinds = [c.cell_type for c in hyperopt.cells]
    assert kinds.count("markdown") >= 3 and kinds.count("code") >= 3
    sandbox = next(c for c in hyperopt.cells if "## Keras Model" in c.source)
    assert sandbox.cell_type == "markdown" and not sandbox.source.startswith("%md")
    (sales,) = dbc.read(FIXTURES / "mslearn_sample_sales.dbc")
    assert (sales.path, sales.language, [c.cell_type for c in sales.cells]) == (
        "Sample_sales Notebook", "python", ["code", "code"])


def test_extract_real_export_to_ipynb_and_source(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    written = dbc.extract(FIXTURES / "learning_spark_v2_ch11.dbc", tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == [
        "Learning-Spark/Python/Chapter11/11-6 Hyperopt.ipynb", "Learning-Spark/Python/Chapter11/11-6 Hyperopt.py",
        "Learning-Spark/Python/Chapter11/README.ipynb", "Learning-Spark/Python/Chapter11/README.py"]
    nb = nbformat.read(tmp_path / "Learning-Spark/Python/Chapter11/11-6 Hyperopt.ipynb", as_version=4)
    nbformat.validate(nb)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# Hyperopt")
    source = (tmp_path / "Learning-Spark/Python/Chapter11/11-6 Hyperopt.py").read_text()
    assert source.startswith("# Databricks notebook source\n# MAGIC %md\n# MAGIC # Hyperopt")


class _Unseekable(io.RawIOBase):
    """A write-only stream: zipfile then writes data descriptors, as Databricks' exporter does."""

    def __init__(self):
        self.buf = bytearray()

    def writable(self):
        return True

    def write(self, b):
        self.buf += b
        return len(b)


def test_read_export_quirks(tmp_path):
    out = _Unseekable()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("manifest.mf", '{"version":"Manifest","guid":"g","origId":-1,"name":"manifest.mf"}')
        zf.writestr("Course/", '{"version":"FolderV1","origId":1,"name":"Course","guid":"","children":[]}')
        zf.writestr("Course/Lesson.python", json.dumps({
            "version": "NotebookV1", "origId": 2, "name": "Lesson", "language": "python", "commands": [
                _export_cmd(1.0, "\n%md-sandbox\n<div>Setup</div>"),
                _export_cmd(2.0, '%run "./Includes/Classroom Setup"'),
                _export_cmd(3.0, '\n%run "./00 setup"', metadata={}),
                _export_cmd(4.0, "%run ./00_constants", metadata=None),
                _export_cmd(5.0, "print(1)", subtype="results")]}))
    archive = tmp_path / "export.dbc"
    archive.write_bytes(bytes(out.buf))
    with zipfile.ZipFile(archive) as zf:
        assert all(i.flag_bits & 0x08 for i in zf.infolist())
    (lesson,) = dbc.read(archive)
    assert lesson.path == "Course/Lesson"
    assert [(c.cell_type, c.source) for c in lesson.cells] == [
        ("markdown", "<div>Setup</div>"), ("code", '%run "./Includes/Classroom Setup"'),
        ("code", '\n%run "./00 setup"'), ("code", "%run ./00_constants")]
    cells = json.loads(dbc.to_ipynb(lesson))["cells"]
    # Notebooks of the same folder become .ipynb files: the %run lines follow, quoted or not.
    assert ["".join(c["source"]) for c in cells[1:]] == [
        '%run "./Includes/Classroom Setup"', '\n%run "./00 setup.ipynb"', "%run ./00_constants.ipynb"]


NB = {"version": "NotebookV1", "name": "x", "language": "python", "commands": [_export_cmd(1.0, "1")]}


@pytest.mark.parametrize("entries, message", [
    ({}, "empty DBC archive"),
    ({"tfnb/": ""}, "empty DBC archive"),
    ({"manifest.mf": "{}"}, "empty DBC archive"),
    ({"tfnb/x.python": "{not json"}, "'tfnb/x.python' is not notebook JSON"),
    ({"tfnb/x.python": [1, 2]}, "'tfnb/x.python' is not a notebook object"),
    ({"tfnb/x.python": {k: v for k, v in NB.items() if k != "commands"}},
     "'tfnb/x.python' lacks the required field 'commands'"),
    ({"tfnb/x.python": {k: v for k, v in NB.items() if k != "language"}},
     "'tfnb/x.python' lacks the required field 'language'"),
    ({"tfnb/x.python": {**NB, "commands": [{"version": "CommandV1", "position": 1.0}]}},
     "'tfnb/x.python': command 0 lacks the required field 'command'"),
    ({"tfnb/x.python": {**NB, "commands": [{"command": "1", "position": "first"}]}},
     "field 'position' is not a number"),
    ({"tfnb/x.python": {**NB, "language": "cobol"}}, "unknown language 'cobol'"),
    ({"tfnb/x.python": {**NB, "version": "NotebookV9"}}, "version 'NotebookV9'"),
    ({"../evil.python": NB}, "points outside the archive folder"),
])
def test_malformed_archive_errors_name_entry_and_field(tmp_path, entries, message):
    archive = _zip(tmp_path / "bad.dbc", entries)
    with pytest.raises(DbcFormatError, match=message.replace("(", r"\(").replace(")", r"\)")):
        dbc.read(archive)


def test_not_a_zip_is_a_clear_error(tmp_path):
    bogus = tmp_path / "tfnb.dbc"
    bogus.write_text('{"version": "NotebookV1"}')
    with pytest.raises(DbcFormatError, match="not a zip"):
        dbc.read(bogus)
    with pytest.raises(ConfigError, match="does not exist"):
        dbc.read(tmp_path / "missing.dbc")


# Built from parts so no secret scanner flags this file; they are fakes (AWS's documentation example).
FAKE_KEY_ID = "AKIA" + "IOSFODNN7EXAMPLE"
FAKE_SECRET = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"
FAKE_TOKEN = "dapi" + "0123456789abcdef" * 2


@pytest.mark.parametrize("source, what", [
    (f"import boto3\ns3 = boto3.client('s3', aws_access_key_id='{FAKE_KEY_ID}')", "AWS access key id"),
    (f'boto3.client("s3", aws_secret_access_key = "{FAKE_SECRET}")', "aws_secret_access_key literal"),
    (f"%sh\ncat > ~/.aws/credentials <<EOF\naws_secret_access_key = {FAKE_SECRET}\nEOF",
     "aws_secret_access_key literal"),
    (f"TOKEN = '{FAKE_TOKEN}'", "Databricks token"),
])
def test_build_refuses_credentials_naming_the_cell_not_the_value(src, tmp_path, source, what):
    _write_nb(src, "02_leaky", [_cell("markdown", "# Leaky"), _cell("code", source)])
    out = tmp_path / "tfnb.dbc"
    with pytest.raises(ConfigError, match=f"notebook 02_leaky.ipynb, cell 2 contains what looks like an? {what}") as e:
        dbc.build(src, out)
    for secret in (FAKE_KEY_ID, FAKE_SECRET, FAKE_TOKEN):
        assert secret not in str(e.value)
    assert not out.exists() and not list(tmp_path.glob(".tfnb.dbc*"))


def test_reading_credentials_from_the_environment_is_fine(src, tmp_path):
    _write_nb(src, "02_s3", [_cell("code", "import os\nboto3.client('s3', aws_secret_access_key="
                                           "os.environ['AWS_SECRET_ACCESS_KEY'])")])
    assert dbc.build(src, tmp_path / "tfnb.dbc").notebooks[-1] == "tfnb/02_s3"


@pytest.mark.parametrize("cells, message", [
    ([_cell("code", "print(1)", outputs=[{"output_type": "stream", "name": "stdout", "text": ["1\n"]}])],
     r"cell 1 has outputs; .*jupyter nbconvert --clear-output"),
    ([{"cell_type": "raw", "id": "r", "metadata": {}, "source": "x"}], r"cell 1 is a 'raw' cell"),
    ([_cell("code", "%run ./00_constants\nprint(NUM_WORKERS)")], r"cell 1 has %run together with other lines"),
    ([_cell("markdown", "# x"), _cell("code", "%run ./00_constants_v2")],
     r"cell 2 runs './00_constants_v2' but the archive has no notebook '00_constants_v2'"),
])
def test_build_refuses_notebooks_databricks_would_break_on(src, tmp_path, cells, message):
    _write_nb(src, "02_bad", cells)
    with pytest.raises(ConfigError, match=r"notebook 02_bad\.ipynb, " + message):
        dbc.build(src, tmp_path / "tfnb.dbc")


def test_build_input_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        dbc.build(tmp_path / "nowhere", tmp_path / "x.dbc")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no .ipynb notebooks"):
        dbc.build(tmp_path / "empty", tmp_path / "x.dbc")
    with pytest.raises(ConfigError, match="folder='a/b'"):
        dbc.build(tmp_path / "empty", tmp_path / "x.dbc", folder="a/b")
    with pytest.raises(ConfigError, match="formats="):
        dbc.extract(tmp_path / "x.dbc", tmp_path, formats=("html",))


def test_cli_build_extract_check_and_errors(src, tmp_path, capsys):
    archive = tmp_path / "dbc" / "tfnb.dbc"
    assert dbc.main(["build", str(src), "-o", str(archive)]) == 0
    assert f"wrote {archive}: 2 notebooks, sha256 " in capsys.readouterr().out

    assert dbc.main(["check", str(src), str(archive)]) == 0
    assert "up to date" in capsys.readouterr().out

    assert dbc.main(["extract", str(archive), "-o", str(tmp_path / "x"), "--format", "py"]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "x/tfnb/00_constants.py"),
                                               str(tmp_path / "x/tfnb/01_train.py")]

    (src / "00_constants.ipynb").write_text((src / "00_constants.ipynb").read_text().replace("= 2", "= 4"))
    assert dbc.main(["check", str(src), str(archive)]) == 1
    assert "is stale: rebuild with" in capsys.readouterr().err

    bogus = tmp_path / "bogus.dbc"
    bogus.write_bytes(b"PK\x05\x06 definitely not a zip")
    assert dbc.main(["extract", str(bogus), "-o", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tools.dbc: error: ") and "not a zip" in err and err.count("\n") == 1


def test_python_dash_m_entry_point(src, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "tfnb.dbc"
    ok = subprocess.run([sys.executable, "-m", "tools.dbc", "build", str(src), "-o", str(out)],
                        capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert out.is_file() and "2 notebooks" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "tools.dbc", "extract", str(src / "00_constants.ipynb"),
                          "-o", str(tmp_path / "x")], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.startswith("tools.dbc: error: ") and bad.stderr.count("\n") == 1
    assert "not a zip" in bad.stderr


def _built_wheel():
    from tools.wheel import build_wheel

    return build_wheel(ROOT)


def test_committed_dbc_is_fresh_and_carries_the_wheel_of_this_tree():
    committed = ROOT / "dbc" / "tfnb.dbc"
    assert committed.is_file(), "dbc/tfnb.dbc is missing: run `./dev dbc`"
    assert dbc.is_fresh(ROOT / "notebooks", committed, folder="tfnb", wheel=_built_wheel()), (
        "dbc/tfnb.dbc is stale (the notebooks or tfnb/ changed since it was built): run `./dev dbc` and commit it")


def _carried(archive) -> tuple[str, bytes]:
    import base64
    import hashlib
    import re

    (cell,) = [c for nb in dbc.read(archive) for c in nb.cells if c.source.startswith("TFNB_WHEEL = (")]
    name, digest, b64 = re.match(r'TFNB_WHEEL = \("([^"]+)", "([0-9a-f]{64})", "([^"]+)"\)', cell.source).groups()
    assert cell.hide_code  # 300 KB of base64 is nothing to read: the command's code is hidden
    data = base64.b64decode(b64)
    assert hashlib.sha256(data).hexdigest() == digest  # the hash the install checks and pins pip to
    return name, data


def test_the_archive_carries_a_reproducible_wheel_that_installs(tmp_path):
    name, wheel = _built_wheel()
    assert _built_wheel() == (name, wheel)  # byte for byte the same from the same tree
    first = dbc.build(ROOT / "notebooks", tmp_path / "a" / "tfnb.dbc", wheel=(name, wheel))
    second = dbc.build(ROOT / "notebooks", tmp_path / "b" / "tfnb.dbc", wheel=(name, wheel))
    assert first.sha256 == second.sha256
    assert _carried(first.path) == (name, wheel)
    # what pip makes of it: tfnb itself, its extras as setup.cfg declares them
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                    "--target", str(target), str(_write(tmp_path / name, wheel))], check=True, timeout=300)
    installed = (target / "tfnb" / "__init__.py").read_text()
    assert installed == (ROOT / "tfnb" / "__init__.py").read_text()
    (meta,) = target.glob("tfnb-*.dist-info")
    text = (meta / "METADATA").read_text()
    assert 'Requires-Dist: tensorflow>=2.16; extra == "tf"' in text and "Requires-Dist: pyspark" not in text.split(
        "Provides-Extra")[0], "pyspark and TensorFlow are extras, never forced on a host"


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_changed_package_makes_the_archive_stale(tmp_path):
    import shutil

    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "tfnb", tree / "tfnb", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "setup.cfg", tree / "setup.cfg")
    from tools.wheel import build_wheel

    archive = dbc.build(ROOT / "notebooks", tmp_path / "tfnb.dbc", wheel=build_wheel(tree)).path
    assert dbc.is_fresh(ROOT / "notebooks", archive, wheel=build_wheel(tree))
    (tree / "tfnb" / "errors.py").write_text((tree / "tfnb" / "errors.py").read_text() + "\n# changed\n")
    assert not dbc.is_fresh(ROOT / "notebooks", archive, wheel=build_wheel(tree))
    assert not dbc.is_fresh(ROOT / "notebooks", archive)  # no wheel given: not the archive's notebooks either


def test_a_wheel_needs_exactly_one_place_to_go(src, tmp_path):
    with pytest.raises(ConfigError, match="have 0 lines `TFNB_WHEEL = None`"):
        dbc.build(src, tmp_path / "x.dbc", wheel=("tfnb-0.1.0-py3-none-any.whl", b"PK"))
    with pytest.raises(ConfigError, match="is not a wheel file name"):
        dbc.build(src, tmp_path / "x.dbc", wheel=("../evil.zip", b"PK"))


def test_the_install_notebook_adds_what_setup_cfg_declares():
    import configparser

    import nbformat

    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "setup.cfg")
    source = "\n".join(c.source for c in nbformat.read(ROOT / "notebooks" / "tfnb_install.ipynb", as_version=4).cells)
    namespace: dict = {}
    exec(source.split("TFNB_EXTRAS = ", 1)[1].split("\n}\n", 1)[0].join(["TFNB_EXTRAS = ", "\n}\n"]), namespace)
    for extra, requirements in namespace["TFNB_EXTRAS"].items():
        declared = [ln.strip() for ln in cfg["options.extras_require"][extra].splitlines() if ln.strip()]
        assert requirements == declared, f"the install notebook's {extra!r} differs from setup.cfg's"


def _install_cell() -> dict:
    """The install notebook's code run in a namespace of its own, as ``%run ./tfnb_install`` runs it."""
    import nbformat

    namespace: dict = {}
    for cell in nbformat.read(ROOT / "notebooks" / "tfnb_install.ipynb", as_version=4).cells:
        if cell.cell_type == "code":
            exec(cell.source, namespace)
    return namespace


def test_a_wheel_is_installed_only_with_its_sha256_and_a_planted_one_is_refused_in_one_line(tmp_path):
    import hashlib

    ns = _install_cell()
    name, wheel = _built_wheel()
    digest = hashlib.sha256(wheel).hexdigest()
    (tmp_path / "good").mkdir()
    good = _write(tmp_path / "good" / name, wheel)
    requirement, _ = ns["_tfnb_pinned_wheel"](f"{good}#sha256={digest}", None)
    assert requirement == f"tfnb @ file://{good}#sha256={digest}"
    # a wheel of the archive's name, copied to a volume: the archive's own hash pins it
    assert ns["_tfnb_pinned_wheel"](str(good), (name, digest))[0] == requirement

    (tmp_path / "planted").mkdir()
    planted = _write(tmp_path / "planted" / name, wheel + b"planted")
    with pytest.raises(ns["TfnbInstallError"]) as err:
        ns["_tfnb_pinned_wheel"](str(planted), (name, digest))
    said = str(err.value)
    assert "\n" not in said and said.startswith(f"tfnb_install: {planted} is not the wheel TFNB_SOURCE pins")
    assert "so it is not installed" in said and "TFNB_SOURCE=archive" in said
    with pytest.raises(ns["TfnbInstallError"], match="names no sha256 to check the wheel against"):
        ns["_tfnb_pinned_wheel"](str(tmp_path / "other-0.1-py3-none-any.whl"), (name, digest))

    # pip itself checks the pin on every machine that installs: a file swapped after the check is refused
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp_path / "dl"),
                           f"tfnb @ file://{planted}#sha256={digest}"], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "DO NOT MATCH THE HASHES" in done.stderr


def test_the_jupyter_advice_brings_what_the_notebooks_import():
    """In Jupyter tfnb_install never installs: it names `./dev notebooks` / the `notebooks` extra, which must bring
    every package the notebooks import (scikit-learn for the digits, matplotlib for the plots, Optuna, Jupyter)."""
    import configparser

    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "setup.cfg")
    extras = cfg["options.extras_require"]

    def packages(extra: str) -> set[str]:
        out = set()
        for line in (ln.strip() for ln in extras[extra].splitlines() if ln.strip()):
            if line.startswith("tfnb["):
                for nested in line[len("tfnb["):-1].split(","):
                    out |= packages(nested.strip())
            else:
                out.add(line.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip())
        return out

    have = packages("notebooks")
    for needed in ("pyspark", "tensorflow", "tensorboard", "scikit-learn", "matplotlib", "optuna", "jupyterlab",
                   "ipykernel"):
        assert needed in have, f"the notebooks extra lacks {needed}"
    advice = _install_cell()["_TFNB_JUPYTER_FIX"]
    assert "./dev notebooks" in advice and "pip install -e '.[notebooks]'" in advice
    assert "\n  notebooks)" in (ROOT / "dev").read_text() and "setup_venv notebooks" in (ROOT / "dev").read_text()
