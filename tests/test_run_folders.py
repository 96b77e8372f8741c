"""The notebooks' run folders (00_constants): each user's own by default, recorded as theirs, and never written
to or deleted from by a notebook of another user. 00_constants' code runs here as Jupyter runs it (its cells in
one namespace, values set before it winning); tests/test_dbsim.py runs it as two users of a simulated Databricks
workspace."""
from __future__ import annotations

import getpass
import json
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CELLS = ["".join(c["source"]) for c in json.loads((ROOT / "notebooks" / "00_constants.ipynb").read_text())["cells"]
         if c["cell_type"] == "code"]


def constants(user: str, monkeypatch, **before) -> dict:
    """00_constants' namespace for ``user``, with ``before`` set first (as papermill or a %run caller does)."""
    monkeypatch.setattr(getpass, "getuser", lambda: user)
    ns = dict(before)
    for cell in CELLS:
        exec(cell, ns)
    return ns


def test_a_run_folder_is_recorded_as_its_users_and_another_user_is_stopped_before_writing(tmp_path, monkeypatch):
    alice = constants("alice", monkeypatch, BASE_DIR=str(tmp_path), RUN_NAME="digits")
    run = tmp_path / "digits"
    assert alice["RUN_DIR"] == str(run) and alice["RUN_USER"] == "alice"
    assert (run / "tfnb-owner.txt").read_text() == "alice\n"
    (run / "model").mkdir()
    (run / "model" / "ckpt-1.weights.h5").write_text("alice's")
    assert constants("alice", monkeypatch, BASE_DIR=str(tmp_path), RUN_NAME="digits")["RUN_DIR"] == str(run)

    with pytest.raises(PermissionError) as stopped:
        constants("bob", monkeypatch, BASE_DIR=str(tmp_path), RUN_NAME="digits", FRESH_RUN=True)
    assert str(stopped.value) == (
        f"{run} holds a run of alice, and you are bob: these notebooks never write to or delete another user's run. "
        "Choose another RUN_NAME, or leave BASE_DIR empty for a folder of your own")
    assert (run / "model" / "ckpt-1.weights.h5").read_text() == "alice's"
    assert (run / "tfnb-owner.txt").read_text() == "alice\n"


def test_fresh_run_deletes_only_inside_your_own_run_folder(tmp_path, monkeypatch):
    ns = constants("alice", monkeypatch, BASE_DIR=str(tmp_path / "runs"), RUN_NAME="digits")
    Path(ns["MODEL_DIR"]).mkdir()
    (Path(ns["MODEL_DIR"]) / "ckpt-1.weights.h5").write_text("x")
    ns["delete_run_files"](ns["MODEL_DIR"], ns["LOG_URL"])
    assert not Path(ns["MODEL_DIR"]).exists() and Path(ns["OWNER_FILE"]).exists()
    for outside in (str(tmp_path), ns["RUN_DIR"], str(Path(ns["RUN_DIR"]) / ".." / "other")):
        with pytest.raises(PermissionError, match="FRESH_RUN deletes only folders inside your run folder"):
            ns["delete_run_files"](outside)
    Path(ns["OWNER_FILE"]).write_text("bob\n")  # the folder became another user's meanwhile
    Path(ns["MODEL_DIR"]).mkdir()
    with pytest.raises(PermissionError, match="holds a run of bob, and you are alice"):
        ns["delete_run_files"](ns["MODEL_DIR"])
    assert Path(ns["MODEL_DIR"]).exists()


def test_a_folder_without_a_record_is_left_alone_with_the_way_to_claim_it(tmp_path, monkeypatch):
    (tmp_path / "digits" / "model").mkdir(parents=True)  # a run of an earlier tfnb
    with pytest.raises(PermissionError) as stopped:
        constants("alice", monkeypatch, BASE_DIR=str(tmp_path), RUN_NAME="digits")
    said = str(stopped.value)
    assert said.startswith(f"{tmp_path / 'digits'} holds files but no record of whose run they are")
    assert f"open({str(tmp_path / 'digits' / 'tfnb-owner.txt')!r}, 'w').write('alice')" in said
    exec(said.split("record it in a cell: ", 1)[1].split("; else", 1)[0])  # the fix it gives, as a user runs it
    assert constants("alice", monkeypatch, BASE_DIR=str(tmp_path), RUN_NAME="digits")["RUN_USER"] == "alice"


def test_notebooks_starting_together_on_a_new_folder_agree_on_its_owner(tmp_path, monkeypatch):
    monkeypatch.setattr(getpass, "getuser", lambda: "alice")
    errors = []

    def start():
        ns = {"BASE_DIR": str(tmp_path), "RUN_NAME": "digits"}
        try:
            for cell in CELLS:
                exec(cell, ns)
            (Path(ns["RUN_DIR"]) / f"written-{threading.get_ident()}").write_text("x")  # as 01_data_ingest does
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and (tmp_path / "digits" / "tfnb-owner.txt").read_text() == "alice\n"


def test_driver_local_files_are_per_user(tmp_path, monkeypatch):
    a = constants("alice", monkeypatch, BASE_DIR=str(tmp_path), RUN_NAME="a")
    b = constants("bob", monkeypatch, BASE_DIR=str(tmp_path), RUN_NAME="b")
    assert "/tfnb/alice/a" in a["LOCAL_DIR"] and "/tfnb/bob/b" in b["LOCAL_DIR"]
    assert a["TB_DIR"].startswith(a["LOCAL_DIR"])


def test_user_tag_names_things_in_a_shared_namespace(monkeypatch, tmp_path):
    ns = constants("Alice.Smith@example.com", monkeypatch, BASE_DIR=str(tmp_path), RUN_NAME="a")
    assert ns["USER_TAG"] == "alice_smith_example_com"  # a table or model name part: letters, digits, _
