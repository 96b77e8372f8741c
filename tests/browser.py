"""Browser-test fixtures: JupyterLab on loopback with a token, driven by Debian chromium via Playwright.

A widget test executes a notebook through the real JupyterLab front end (so ipywidgets render as a
user sees them) and inspects or screenshots the result. Use from a test module::

    import pytest
    from browser import chromium_page, jupyter_lab, run_all_cells  # noqa: F401  (fixtures)

    pytestmark = [pytest.mark.browser, pytest.mark.slow]

    def test_panel(jupyter_lab, chromium_page, artifacts):
        nb = jupyter_lab.write_notebook("demo.ipynb", ["import ipywidgets", "ipywidgets.Button(description='hi')"])
        run_all_cells(chromium_page, jupyter_lab.notebook_url(nb))
        chromium_page.get_by_role("button", name="hi").wait_for()
        chromium_page.screenshot(path=artifacts / "demo.png")

``start_run_all`` + ``wait_for_cells`` split ``run_all_cells`` for tests that act while cells run.
The ``jupyter_lab`` fixture passes this process's environment to the server and its kernels; for
another environment use ``running_jupyter_lab(workdir, env=...)`` in a fixture of your own.

Everything runs under the test's ``tmp_path``: the notebook root, Jupyter's config/data/runtime
dirs (so the user's ~/.jupyter is untouched), the IPython dir and the chromium profile. Teardown
stops chromium, shuts JupyterLab down through its API (which shuts the kernels down, so their
atexit hooks run), and fails the test if any process whose command line mentions that directory
is still alive (then kills those, by pid, so nothing leaks into later tests).

Tests are skipped, with the reason, when chromium (``/usr/bin/chromium``, or ``$TFNB_CHROMIUM``),
Playwright or JupyterLab is missing, and fail instead when CI is set (components.need);
``./dev test`` installs chromium.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from components import free_port, need

CHROMIUM = os.environ.get("TFNB_CHROMIUM", "/usr/bin/chromium")
# Flags that make Debian's chromium run in a container without a display or network (FACTS.md).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]
LAB_START_TIMEOUT = 120.0   # seconds; JupyterLab imports a lot, and the machine is shared
CELL_TIMEOUT = 300.0        # seconds for "run all cells" to finish
_HTTP_POLL = 0.25           # seconds between readiness probes of the starting server
# where JupyterLab renders stderr and exceptions (a traceback's text contains "Traceback")
_STDERR_OUTPUT = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"


def require_chromium() -> None:
    """Skip the calling test (fail it under CI, see components.need) unless chromium and Playwright are there."""
    need("Debian chromium", os.access(CHROMIUM, os.X_OK),
         f"{CHROMIUM} not found: apt-get install chromium (./dev test does), or set TFNB_CHROMIUM")
    _need_modules(("playwright.sync_api", "playwright"))


def require_browser_stack() -> None:
    """:func:`require_chromium`, and JupyterLab with a kernel to run notebooks in."""
    require_chromium()
    _need_modules(("jupyterlab", "jupyterlab"), ("nbformat", "nbformat"), ("ipykernel", "ipykernel"))


def _need_modules(*modules: tuple[str, str]) -> None:
    for module, package in modules:
        try:
            __import__(module)
            found = True
        except ImportError:
            found = False
        need(f"the {module} module", found, f"pip install {package}")


def processes_with(text: str) -> list[str]:
    """``"pid: command line"`` of live (non-zombie) processes whose command line contains ``text``."""
    out = []
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            state = (d / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmd and state != b"Z":
            out.append(f"{d.name}: {cmd}")
    return out


def kill_processes_with(text: str, wait: float = 15.0) -> list[str]:
    """Give processes mentioning ``text`` ``wait`` seconds to exit, SIGKILL the rest by pid; returns those."""
    deadline = time.monotonic() + wait
    left = processes_with(text)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)  # processes of other parents: no exit event to wait on
        left = processes_with(text)
    for entry in left:
        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
            os.kill(int(entry.split(":", 1)[0]), signal.SIGKILL)
    return left


@contextlib.contextmanager
def _leaves_no_processes(text: str, what: str) -> Iterator[None]:
    """Around a fixture's life: afterwards nothing mentioning ``text`` may run (fails only if the body passed)."""
    try:
        yield
    except BaseException:
        kill_processes_with(text)
        raise
    left = kill_processes_with(text)
    assert not left, f"{what} left processes running: {left}"


class JupyterLab:
    """A JupyterLab server on 127.0.0.1 with a random token, rooted in ``root``.

    Attributes:
        root: the notebook directory (the server's root_dir).
        port: the server's port.
        token: the access token (needed by every HTTP request, browser or API).
        log_path: the server's stdout/stderr (kernel tracebacks land here too).
    """

    def __init__(self, workdir: Path, *, env: dict | None = None):
        self.workdir = Path(workdir)
        self.root = self.workdir / "lab"
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.log_path = self.workdir / "jupyterlab.log"
        self._env = env
        self._proc: subprocess.Popen | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout: float = LAB_START_TIMEOUT) -> "JupyterLab":
        config = self.workdir / "jupyter-config"
        (config / "labconfig").mkdir(parents=True, exist_ok=True)
        # The "get Jupyter news?" toast would cover part of the page in screenshots.
        (config / "labconfig" / "page_config.json").write_text(json.dumps(
            {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
        env = dict(os.environ if self._env is None else self._env)
        env.update(JUPYTER_CONFIG_DIR=str(config), JUPYTER_DATA_DIR=str(self.workdir / "jupyter-data"),
                   JUPYTER_RUNTIME_DIR=str(self.workdir / "jupyter-runtime"),
                   IPYTHONDIR=str(self.workdir / "ipython"), JUPYTER_PLATFORM_DIRS="1")
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
               f"--LabApp.workspaces_dir={self.workdir / 'lab-workspaces'}",
               f"--LabApp.user_settings_dir={self.workdir / 'lab-settings'}",
               # nothing that reaches the internet (PyPI extension listing, news feed)
               "--LabApp.extension_manager=readonly", "--LabApp.news_url=None",
               "--ServerApp.terminals_enabled=False"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")  # CI containers run as root
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          env=env, cwd=self.root, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self._proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                if "started" in self.api("api/status"):
                    return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"JupyterLab did not answer within {timeout:g} s:\n{self.log_tail()}")
            time.sleep(_HTTP_POLL)  # nothing to wait on but the server's HTTP port

    def stop(self, timeout: float = 60.0) -> None:
        """Shut down through the API (kernels get a clean shutdown request), then signal if needed."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(OSError, ValueError):
            self.api("api/shutdown", method="POST")
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)

    # ------------------------------------------------------------ helpers

    def url(self, path: str = "lab") -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}?token={self.token}"

    def notebook_url(self, notebook: Path | str) -> str:
        rel = Path(notebook).resolve().relative_to(self.root.resolve()) if Path(notebook).is_absolute() \
            else Path(notebook)
        return self.url(f"lab/tree/{rel.as_posix()}")

    def api(self, path: str, method: str = "GET"):
        """JSON from the server's REST API (token in the Authorization header)."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"},
                                     data=b"" if method != "GET" else None)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def write_notebook(self, name: str, cells: list[str]) -> Path:
        """Write a Python 3 notebook of code cells under the root; returns its path."""
        import nbformat

        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
        path = self.root / name
        nbformat.write(nb, str(path))
        return path

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"


@contextlib.contextmanager
def running_jupyter_lab(workdir: Path, *, env: dict | None = None) -> Iterator[JupyterLab]:
    """A started :class:`JupyterLab`; on exit it is shut down and must leave no process behind."""
    lab = JupyterLab(workdir, env=env)
    with _leaves_no_processes(str(lab.workdir), "JupyterLab (server, kernels and what they started)"):
        lab.start()
        try:
            yield lab
        finally:
            lab.stop()


@contextlib.contextmanager
def running_chromium(workdir: Path, *, width: int = 1400, height: int = 1200) -> Iterator["object"]:
    """A Playwright ``Page`` in Debian chromium with its profile under ``workdir``; closed on exit."""
    from playwright.sync_api import sync_playwright

    workdir = Path(workdir)
    profile = workdir / "chromium-profile"
    # XDG dirs under workdir: chromium's crash handler (which outlives the browser briefly and
    # does not carry the profile path) then names workdir in its command line too, and nothing
    # is written to the user's ~/.config or ~/.cache.
    env = dict(os.environ, XDG_CONFIG_HOME=str(workdir / "xdg-config"), XDG_CACHE_HOME=str(workdir / "xdg-cache"))
    with _leaves_no_processes(str(workdir), "chromium"), sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, env=env,
            args=[a for a in CHROMIUM_ARGS if a != "--headless"],
            viewport={"width": width, "height": height})
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


def start_run_all(page, notebook_url: str, *, timeout: float = CELL_TIMEOUT) -> None:
    """Open a notebook in JupyterLab, wait until its kernel is idle, and click Run > Run All Cells.

    Returns as soon as the cells are queued (for tests that act while cells run).
    """
    ms = timeout * 1000
    page.goto(notebook_url)
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=ms)
    # Idle *with a kernel*: before the session exists the status bar reads "No Kernel | Initializing"
    # (and the toolbar's execution indicator already says idle); a Run All sent then makes
    # JupyterLab ask for a kernel in a dialog and drop the queued cells.
    page.wait_for_function(
        r"""() => [...document.querySelectorAll('.jp-StatusBar-Widget')].some(
                w => /\|\s*Idle/.test(w.textContent) && !/No Kernel/.test(w.textContent))""", timeout=ms)
    select = page.locator(".jp-Dialog").get_by_role("button", name="Select", exact=True)
    if select.count():
        select.click()
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()


def wait_for_cells(page, *, timeout: float = CELL_TIMEOUT) -> None:
    """Wait until every code cell of the open notebook has run; fail with the traceback if one raised."""
    # Done when no cell is running ("[*]:") and either every code cell's prompt reads "[n]:" or a
    # cell raised (JupyterLab then leaves the cells after it unrun, "[ ]:").
    page.wait_for_function(
        r"""() => {
            const panel = '.jp-NotebookPanel:not(.lm-mod-hidden) ';
            const prompts = [...document.querySelectorAll(panel + '.jp-CodeCell .jp-InputPrompt')];
            if (prompts.length === 0 || prompts.some(p => p.textContent.includes('*'))) return false;
            if (prompts.every(p => /\[\d+\]/.test(p.textContent))) return true;
            return [...document.querySelectorAll(panel + _STDERR)].some(o => o.textContent.includes('Traceback'));
        }""".replace("_STDERR", repr(_STDERR_OUTPUT)), timeout=timeout * 1000)
    tracebacks = [t for t in page.locator(_STDERR_OUTPUT).all_inner_texts() if "Traceback" in t]
    assert not tracebacks, "a notebook cell failed:\n" + "\n".join(tracebacks)


def run_all_cells(page, notebook_url: str, *, timeout: float = CELL_TIMEOUT) -> None:
    """:func:`start_run_all` then :func:`wait_for_cells`.

    Raises:
        AssertionError: a cell raised (its traceback is in the message).
    """
    start_run_all(page, notebook_url, timeout=timeout)
    wait_for_cells(page, timeout=timeout)


@pytest.fixture
def jupyter_lab(tmp_path) -> Iterator[JupyterLab]:
    """A JupyterLab on 127.0.0.1 (random token) rooted in ``tmp_path/lab``; kernels see this env."""
    require_browser_stack()
    with running_jupyter_lab(tmp_path / "jl") as lab:
        yield lab


@pytest.fixture
def chromium_page(tmp_path):
    """A Playwright page in headless Debian chromium (1400x1200)."""
    require_browser_stack()
    with running_chromium(tmp_path / "browser") as page:
        yield page
