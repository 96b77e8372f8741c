"""The cached environments the suite runs things in, built once and reused: the two simulated Databricks
runtimes (tests/dbsim/runtimes.py) and the MLflow tracking server's virtualenv.

``python tests/environments.py`` builds whichever are missing and says how long that took. ``./dev test``
runs it before the whole suite, so a first run's minutes of downloads and installs are reported apart from
the tests' own time; a test that finds one missing still builds it (under the same lock).
"""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from components import cached_venv  # noqa: E402

MLFLOW_SERVER = ["mlflow==3.17.2"]  # its own venv: full mlflow pins a pyarrow older than the test venv's
MLFLOW_CACHE = Path(os.environ.get("TFNB_MLFLOW_SERVER_CACHE", Path.home() / ".cache" / "tfnb-mlflow-server"))


def mlflow_server_venv() -> Path:
    """The MLflow server's virtualenv (built if missing)."""
    return cached_venv(MLFLOW_CACHE, MLFLOW_SERVER)


def main() -> int:
    from dbsim.runtimes import RUNTIME_A, RUNTIME_B

    builds = {"Databricks runtime A": RUNTIME_A.venv, "Databricks runtime B": RUNTIME_B.venv,
              "MLflow server": mlflow_server_venv}
    start = time.monotonic()
    with ThreadPoolExecutor(len(builds)) as pool:  # downloads and unpacking: side by side
        futures = {name: pool.submit(build) for name, build in builds.items()}
    for name, future in futures.items():
        if error := future.exception():
            print(f"tests/environments.py: {name} could not be built (the tests that need it will say so): {error}",
                  file=sys.stderr)
    print(f"cached environments ready in {time.monotonic() - start:.0f} s (not counted in the tests' time)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
