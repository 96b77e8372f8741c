"""The TensorBoard panel rendered by the real JupyterLab front end in Debian chromium.

A notebook calling ``tensorboard(log_dir)``, then ``%tfnb_tensorboard`` for the same log_dir, is run
through the JupyterLab UI (Run > Run All Cells); the test waits for the panel's iframe and reads
TensorBoard's own page inside it: the run and tag names of the tf.summary scalars in ``log_dir``.
The screenshot is saved to ``test-artifacts/tensorboard_widget.png``. Then the panel's Stop and
Reload buttons are clicked.
JupyterLab, its kernel, the TensorBoard the kernel started and chromium must all be gone
afterwards (the fixtures check their temp dirs).
"""
from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest

from browser import chromium_page, require_browser_stack, run_all_cells, running_jupyter_lab  # noqa: F401
from test_tensorboard import get_json, refuses, write_scalars

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TB_TIMEOUT_MS = 180_000  # TensorBoard's start (it imports TensorFlow) on a busy machine


@pytest.fixture
def lab(tmp_path):
    """JupyterLab whose kernels keep tfnb's TensorBoard records in the test's temp dir."""
    require_browser_stack()
    workdir = tmp_path / "jl"
    env = dict(os.environ, TFNB_TENSORBOARD_DIR=str(workdir / "tb-info"))
    with running_jupyter_lab(workdir, env=env) as lab:
        yield lab


def test_panel_shows_tensorboard_in_jupyterlab(lab, chromium_page, artifacts):
    page = chromium_page
    write_scalars(lab.root / "logs")
    notebook = lab.write_notebook("tensorboard.ipynb", [
        "from tfnb import tensorboard",
        "tensorboard('logs', reload_interval=1)",
        "%load_ext tfnb\n%tfnb_tensorboard --logdir logs",
    ])
    try:
        run_all_cells(page, lab.notebook_url(notebook), timeout=TB_TIMEOUT_MS / 1000)
        cells = page.locator(".jp-CodeCell")
        # one panel per cell: the value tensorboard() returns is not shown a second time
        assert cells.nth(1).locator(".tfnb-tensorboard").count() == 1
        assert cells.nth(2).locator(".tfnb-tensorboard").count() == 1
        panel = cells.nth(1).locator(".tfnb-tensorboard")
        status = panel.locator(".widget-html").first
        status.get_by_text("TensorBoard started for").wait_for(timeout=TB_TIMEOUT_MS)
        assert str(lab.root / "logs") in status.inner_text()
        for name in ("Reload", "Stop"):
            assert panel.get_by_role("button", name=name).is_visible()

        iframe = panel.locator("iframe")
        src = iframe.get_attribute("src")
        assert src.startswith("http://127.0.0.1:") and src.endswith("/")
        assert panel.get_by_role("link", name=src).is_visible()
        # The kernel-side TensorBoard really serves the log_dir (not just some page at that URL).
        assert get_json(src + "data/environment")["data_location"] == str(lab.root / "logs")
        # The magic's panel (next cell) reuses that TensorBoard.
        magic_panel = cells.nth(2).locator(".tfnb-tensorboard")
        assert "Reusing the TensorBoard serving" in magic_panel.locator(".widget-html").first.inner_text()
        assert magic_panel.locator("iframe").get_attribute("src") == src

        tb = panel.frame_locator("iframe")
        # TensorBoard's own UI inside the iframe: its title bar, the runs and the scalar tags.
        tb.get_by_text("TensorBoard", exact=True).first.wait_for(timeout=TB_TIMEOUT_MS)
        for text in ("loss", "accuracy", "train", "eval"):
            tb.get_by_text(text, exact=True).first.wait_for(timeout=TB_TIMEOUT_MS)
        # the line charts have drawn (the time-series cards render into <canvas> or <svg>)
        tb.locator("canvas, svg.line-chart, .line-chart").first.wait_for(timeout=TB_TIMEOUT_MS)
        frame = next(f for f in page.frames if f.url.startswith(src))
        assert "TensorBoard" in frame.title()

        iframe.scroll_into_view_if_needed()
        page.wait_for_timeout(1500)  # let the chart animation settle for a readable screenshot
        panel.screenshot(path=str(artifacts / "tensorboard_widget.png"))

        # Stop: the kernel stops TensorBoard, the iframe goes, the port closes.
        port = urlsplit(src).port
        panel.get_by_role("button", name="Stop").click()
        status.get_by_text("stopped. Reload starts it again.").wait_for(timeout=TB_TIMEOUT_MS)
        assert panel.locator("iframe").count() == 0
        assert refuses(port)
        # Reload: a new TensorBoard, shown again. The teardown then checks that shutting JupyterLab
        # down (kernel exit -> tfnb's atexit hook) stops this one.
        panel.get_by_role("button", name="Reload").click()
        status.get_by_text("TensorBoard started for").wait_for(timeout=TB_TIMEOUT_MS)
        panel.frame_locator("iframe").get_by_text("loss", exact=True).first.wait_for(timeout=TB_TIMEOUT_MS)
    except BaseException:
        page.screenshot(path=str(artifacts / "tensorboard_widget_failure.png"), full_page=True)
        print("JupyterLab log tail:\n" + lab.log_tail())
        raise
