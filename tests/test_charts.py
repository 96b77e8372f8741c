"""Evaluator.plot(): evaluation metrics by epoch against the training curve, as a matplotlib Figure.

The evaluated checkpoints are given as EvalResults (evaluating real checkpoints is test_evaluator's
job); the training curve comes from a Keras-style history, or from the ``train`` scalars Keras'
TensorBoard callback writes, written here with tensorboard's own event writer.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tfnb.errors import ConfigError
from tfnb.monitor.evaluator import EvalResult, Evaluator


def _evaluated(log_dir, epochs=4) -> Evaluator:
    ev = Evaluator(lambda: None, lambda: None, log_dir, log_dir)
    ev._history = [EvalResult(step=e, checkpoint=f"ckpt-{e + 1}", metrics={"loss": 1.2 / (e + 1), "accuracy": 0.45 + e / 10},
                              seconds=1.0, started_at=0.0, found_at=0.0) for e in range(epochs)]
    return ev


def _lines(fig) -> dict:
    return {(ax.get_title(), line.get_label()): [(float(x), float(y)) for x, y in zip(*line.get_data())]
            for ax in fig.axes for line in ax.get_lines()}


def test_plot_draws_evaluation_by_epoch_against_the_training_history(tmp_path, artifacts):
    ev = _evaluated(tmp_path)
    fig = ev.plot(training={"loss": [1.0, 0.5, 0.4, 0.3], "accuracy": [0.5, 0.6, 0.7, 0.8], "lr": [0.1] * 4})
    lines = _lines(fig)
    assert [ax.get_title() for ax in fig.axes] == ["loss", "accuracy"]
    # checkpoint ckpt-1 (step 0) is epoch 1, like the history's first value
    assert lines[("loss", "training")] == [(1, 1.0), (2, 0.5), (3, 0.4), (4, 0.3)]
    assert lines[("accuracy", "evaluation")][0] == (1, 0.45) and len(lines[("accuracy", "evaluation")]) == 4
    png = fig._repr_png_()  # how a notebook shows it, with or without pyplot
    assert png.startswith(b"\x89PNG")
    (artifacts / "evaluator_plot.png").write_bytes(png)
    assert list(_lines(ev.plot(metrics=["accuracy"]))) == [("accuracy", "evaluation")]  # no train scalars here


def test_plot_reads_the_training_curve_from_the_keras_tensorboard_scalars(tmp_path):
    # in a child: tensorboard's reader imports TensorFlow, which this test process must not (see test_tensorboard)
    script = textwrap.dedent(f"""
        import time
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        from tensorboard.util.tensor_util import make_tensor_proto
        sys_path = {str(tmp_path)!r}
        w = EventFileWriter(sys_path + "/train")
        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))
        for step in range(3):  # what Keras' TensorBoard callback writes at each epoch's end (0-based)
            value = Summary.Value(tag="epoch_loss", tensor=make_tensor_proto(1.0 / (step + 1)), metadata=meta)
            w.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=[value])))
        w.close()
        import test_charts
        lines = test_charts._lines(test_charts._evaluated(sys_path, epochs=3).plot())
        print(lines[("loss", "training")], sorted(lines))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=str(__import__("pathlib").Path(__file__).parent))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ("[(1.0, 1.0), (2.0, 0.5), (3.0, 0.3333333432674408)] "
                                  "[('accuracy', 'evaluation'), ('loss', 'evaluation'), ('loss', 'training')]")


def test_plot_without_matplotlib_names_the_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ConfigError, match="pip install matplotlib"):
        _evaluated(tmp_path).plot()
