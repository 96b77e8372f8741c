"""The notebooks, executed headless in real Jupyter kernels as a user runs them, on small settings injected
after the tagged parameters cell (as papermill does): 04_evaluate started in its own kernel before 03_train
and running beside it, then 05_tensorboard. Checks what a user would: training finished above chance, the
evaluator saw every checkpoint and ended with training, TensorBoard answering over the synced logs."""
from __future__ import annotations

import getpass
import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ORDER = ["00_constants", "01_data_ingest", "02_model", "03_train", "04_evaluate", "05_tensorboard", "06_sweep",
         "tfnb_install"]


def _inject_parameters(path: Path, params: dict) -> None:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    # after the tagged cell, or first when there is none: what papermill does
    at = next((i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), -1)
    cell = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in params.items()))
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(at + 1, cell)
    nbformat.write(nb, path)


def _append_cell(path: Path, source: str) -> None:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(source))
    nbformat.write(nb, path)


def _execute(path: Path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)
    return nb


def _text(nb) -> str:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") or "".join(o.get("data", {}).get("text/plain", "")))
    # the live progress widget's table and log lines are widget state, stored in the notebook's metadata
    out.append(json.dumps(nb.metadata.get("widgets", {})))
    return "\n".join(out)


def test_notebooks_are_stored_clean():
    import nbformat

    for name in ORDER:
        nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
        assert nb.cells[0].cell_type == "markdown", f"{name} starts with a markdown cell saying what it does"
        for cell in nb.cells:
            assert not cell.get("outputs") and not cell.get("execution_count"), f"{name} has outputs"
            assert "/work/" not in cell.source and "/root" not in cell.source and "AKIA" not in cell.source


@pytest.mark.slow
def test_notebooks_run_with_evaluator_beside_training(tmp_path, artifacts, no_orphans):
    work = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", work)
    runs = tmp_path / "runs"
    _inject_parameters(work / "00_constants.ipynb",
                       {"BASE_DIR": str(runs), "RUN_NAME": "ci", "SYNC_INTERVAL": 1, "EVAL_INTERVAL": 1})
    # Set on 03 itself, as papermill or a job would: must survive its nested %run of 00_constants (default 8).
    _inject_parameters(work / "03_train.ipynb", {"EPOCHS": 3})
    _append_cell(work / "05_tensorboard.ipynb", "\n".join([
        "import json, urllib.request",
        "sync.flush()",
        "base = f'http://127.0.0.1:{panel.outcome.port}'",
        "with urllib.request.urlopen(base + '/data/runs', timeout=30) as r:",
        "    print('TB_RUNS ' + json.dumps(sorted(json.load(r))))",
        "sync.stop(); panel.stop()",
    ]))
    _append_cell(work / "04_evaluate.ipynb", "print('EVALUATED ' + json.dumps([os.path.basename(r.checkpoint) for r in evaluator.history]))")
    texts = {}

    def run(name):
        texts[name] = _text(_execute(work / f"{name}.ipynb"))
        shutil.copy(work / f"{name}.ipynb", artifacts / f"executed-{name}.ipynb")

    run("00_constants")
    # 04 first, in its own kernel: both notebooks %run 01_data_ingest (the source is written once) and
    # 04 watches for checkpoints until 03's training ends.
    with ThreadPoolExecutor(1) as pool:
        evaluating = pool.submit(run, "04_evaluate")
        run("03_train")
        evaluating.result(timeout=900)
    run("05_tensorboard")
    accuracy = float(re.search(r"final training accuracy: ([0-9.]+) after 3 epochs", texts["03_train"]).group(1))
    assert accuracy >= 0.9, texts["03_train"][-2000:]  # chance is 0.1
    assert "[worker 1]" in texts["03_train"] and "rows of tfnb_digits" in texts["03_train"]  # worker logs reached the cell
    best = float(re.search(r"validation accuracy ([0-9.]+)", texts["04_evaluate"]).group(1))
    assert best >= 0.9
    evaluated = json.loads(re.search(r"EVALUATED (.*)", texts["04_evaluate"]).group(1))
    written = sorted(p.name for p in (runs / "ci" / "model").glob("ckpt-*"))  # Keras 3's weights files, one per epoch
    assert sorted(evaluated) == written == [f"ckpt-{e}.weights.h5" for e in (1, 2, 3)], (evaluated, written)
    assert not (runs / "ci" / "evaluator.json").exists()  # the heartbeat ends with the evaluator
    status = json.loads((runs / "ci" / "model" / "tfnb_status.json").read_text())
    assert status["state"] == "succeeded"
    eval_events = list((runs / "ci" / "logs" / "eval").glob("events.out.tfevents.*"))
    assert eval_events, "evaluator wrote no summaries"
    tb_runs = json.loads(re.search(r"TB_RUNS (.*)", texts["05_tensorboard"]).group(1))
    assert "eval" in tb_runs and any(r.startswith("train") for r in tb_runs), tb_runs


def _cells(name: str) -> list[str]:
    import nbformat

    return [c.source for c in nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4).cells]


def test_source_is_written_once_and_fresh_run_spares_a_watched_run(tmp_path):
    import nbformat
    from nbclient.exceptions import CellExecutionError

    work = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", work)
    runs = tmp_path / "runs"
    source, model = runs / "ci" / "source", runs / "ci" / "model"
    source.mkdir(parents=True)
    (source / "meta.json").write_text('{"train_rows": 1}')  # data already there: 01 must leave it alone
    model.mkdir()
    (model / "ckpt-1.index").write_text("checkpoint")
    (runs / "ci" / "tfnb-owner.txt").write_text(getpass.getuser() + "\n")  # this user's run (00_constants checks)
    ingest = next(s for s in _cells("01_data_ingest") if "write_digits_source(SOURCE_URL)" in s)
    guard = next(s for s in _cells("03_train") if "if FRESH_RUN:" in s)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in [
        f"BASE_DIR = {str(runs)!r}; RUN_NAME = 'ci'; FRESH_RUN = True",   # as papermill sets them
        "%run ./00_constants.ipynb",
        ingest,
        # 04_evaluate's heartbeat, as it writes it while it watches this run
        "import json, time\nwith open(EVALUATOR_MARK, 'w') as f:\n"
        "    json.dump({'host': 'nb2', 'pid': 1, 'time': time.time(), 'interval': EVAL_INTERVAL}, f)",
        guard,
    ]]
    path = work / "check.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(CellExecutionError) as err:
        _execute(path)
    # the values set before the nested %run ./00_constants stuck: the guard speaks of this run's folder
    assert f"FRESH_RUN=True would delete {model} while an evaluator watches" in str(err.value)
    assert "04_evaluate on nb2" in str(err.value)
    assert (model / "ckpt-1.index").exists()
    assert (source / "meta.json").read_text() == '{"train_rows": 1}' and not (source / "train").exists()
