"""The suite's own rule: under CI a missing real component fails the run; elsewhere it is a listed skip.

Runs pytest on a small probe file with this folder's conftest.py as a plugin, once as CI and once not.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

_PROBE = textwrap.dedent('''
    import pytest
    from components import need

    nothing = pytest.importorskip("tfnb_no_such_module")
''')
_PROBE_TESTS = textwrap.dedent('''
    import pytest
    from components import need

    @pytest.fixture
    def server():
        pytest.skip("/usr/bin/no-such-server not found: apt-get install it")

    def test_needs_a_component():
        need("a real component", False, "install it")

    def test_fixture_skips(server):
        pass

    @pytest.mark.browser
    def test_browser():
        pass

    def test_skip_for_another_reason():
        pytest.skip("gcsfs is installed")
''')


def run_probe(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "test_probe_import.py").write_text(_PROBE)
    (tmp_path / "test_probe.py").write_text(_PROBE_TESTS)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]),
               TFNB_CHROMIUM=str(tmp_path / "no-chromium"))
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-ra",
                           "-o", "markers=browser", "--rootdir", str(tmp_path), "--continue-on-collection-errors",
                           str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ci", [None, "false"])
def test_outside_ci_missing_components_are_listed_skips(tmp_path, ci):
    out = run_probe(tmp_path, ci).stdout
    assert out.count("SKIPPED") == 5, out
    assert "needs a real component: install it" in out and "no-such-server not found" in out
    assert "needs Debian chromium" in out and "could not import 'tfnb_no_such_module'" in out
    assert "5 skipped" in out and "failed" not in out and "error" not in out


def test_in_ci_missing_components_fail(tmp_path):
    done = run_probe(tmp_path, "true")
    out = done.stdout
    assert done.returncode != 0
    assert "FAILED test_probe.py::test_needs_a_component" in out
    assert "ERROR test_probe.py::test_fixture_skips" in out
    assert "ERROR test_probe.py::test_browser" in out
    assert "ERROR test_probe_import.py" in out
    # a skip that is not about a missing component stays a skip
    assert "SKIPPED [1] test_probe.py" in out and "gcsfs is installed" in out
    assert "1 failed, 1 skipped, 3 errors" in out
