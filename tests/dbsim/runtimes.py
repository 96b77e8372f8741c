"""The simulated Databricks runtimes: what each one's Python has before a notebook installs anything.

Each runtime is a cached virtualenv (``components.cached_venv``: built once under a lock, reused after
that) under ``~/.cache/tfnb-runtime-sim`` (``TFNB_RUNTIME_SIM_CACHE`` moves it). A notebook never runs in
the cached virtualenv itself: as Databricks does for notebook-scoped libraries, every Run All gets a
virtualenv of its own over the runtime's (which is read-only inside a simulated cluster), so what its
``%pip`` installs is gone when it ends.

Simulation differences, on purpose:

* **Spark is a pip package here.** On Databricks pyspark is the runtime's own Spark (under
  ``/databricks/spark``), not a distribution pip knows about; here ``pyspark`` is pip-installed into the
  runtime's virtualenv, and the cluster's JVM runs from that package. A notebook's ``%pip install`` of a
  library that names pyspark in its requirements therefore finds pyspark satisfied here, where on
  Databricks pip would pull a second pyspark from PyPI on top of the runtime's.
* **CPU only**, and a virtualenv instead of the runtime's ``/databricks/python3`` (the interpreter is
  this machine's CPython of the same minor version).

Versions:

* ``RUNTIME_A`` (15.4 LTS ML, Spark 3.5.0, Python 3.11): the versions the tfnb brief names for that
  runtime (TensorFlow 2.16.1 + tf-keras 2.16.0, numpy 1.26.4, pandas 1.5.3, pyarrow 14.0.1, boto3 1.34.39,
  fsspec 2023.5.0, ipywidgets 7.7.2, scikit-learn 1.4.2). keras, tensorboard, ipython, matplotlib,
  cloudpickle and tqdm are pinned to versions of that time so pip cannot float them to releases the
  runtime never had (keras would otherwise come as 3.15, which TF 2.16 predates); they were not checked
  against the release notes, which could not be reached from here. ``tensorflow==2.16.1`` is the CPU/GPU
  wheel without CUDA libraries (those come only with its ``[and-cuda]`` extra), as checked with
  ``pip install --dry-run``.
* MLflow: Databricks' "MLflow-Databricks Runtime compatibility matrix" (Runtime release notes, versions and
  compatibility) gives 15.4 LTS ML MLflow 2.13.1, 16.4 LTS ML 2.21.3 and 17.3 LTS ML 3.0.1. Runtime A has
  ``mlflow-skinny==2.13.1`` (the client: tracking, registry, model flavours); runtime B has 17.3 LTS ML's
  ``mlflow-skinny==3.0.1``, so the two cover MLflow 2 and MLflow 3. The ML runtimes' full ``mlflow`` (server, UI)
  adds nothing a notebook uses; that the non-ML 17.3 LTS ships the same MLflow was not checked.
* ``RUNTIME_B`` (17.3 LTS, Spark 4.0, Python 3.12, no TensorFlow): the 17.3 LTS release notes' library
  table could not be found with the search tool; the versions below are plausible for a runtime of
  October 2025 (pyspark 4.0.1 is Spark 4.0's maintenance release on PyPI), not copied from the notes.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
if str(TESTS) not in sys.path:  # components.py sits beside this package
    sys.path.insert(0, str(TESTS))

from components import cached_venv  # noqa: E402

CACHE = Path(os.environ.get("TFNB_RUNTIME_SIM_CACHE", Path.home() / ".cache" / "tfnb-runtime-sim"))
PYENV = Path.home() / ".pyenv" / "versions"


@dataclass(frozen=True)
class Runtime:
    """One simulated Databricks Runtime.

    Attributes:
        name: what Databricks calls it (``"15.4 LTS ML"``).
        version: ``DATABRICKS_RUNTIME_VERSION`` in its notebooks (``"15.4"``).
        python: interpreter the virtualenv is made with (an executable name on PATH or a path).
        requirements: what its Python has preinstalled, as pip pins.
        dbfs_root: whether the workspace has a DBFS root (``/dbfs`` FUSE, ``dbfs:/`` paths); Unity Catalog
            workspaces without one have only ``/Volumes``.
        spark_version: the cluster's runtime key, as Spark conf
            ``spark.databricks.clusterUsageTags.sparkVersion`` shows it (``"15.4.x-cpu-ml-scala2.12"``).
    """

    name: str
    version: str
    python: str
    requirements: tuple[str, ...]
    dbfs_root: bool
    spark_version: str

    def interpreter(self) -> str:
        """The interpreter path, ``python`` looked up on PATH and in pyenv's versions."""
        if os.sep in self.python:
            return self.python
        import shutil

        found = shutil.which(self.python)
        if found:
            return found
        for candidate in sorted(PYENV.glob(f"*/bin/{self.python}"), reverse=True):
            return str(candidate)
        return self.python

    def venv(self) -> Path:
        """The cached virtualenv of this runtime, built if missing (minutes: TensorFlow and pyspark are
        large downloads).

        Raises:
            RuntimeError: the build failed (the message has pip's output).
        """
        return cached_venv(CACHE, list(self.requirements), python=self.interpreter())

    def python_path(self) -> Path:
        """``bin/python`` of the cached virtualenv (built if missing)."""
        return self.venv() / "bin" / "python"


RUNTIME_A = Runtime(
    name="15.4 LTS ML",
    version="15.4",
    python="python3.11",
    requirements=(
        "pyspark==3.5.0",
        "tensorflow==2.16.1",
        "tf-keras==2.16.0",
        "keras==3.3.3",
        "tensorboard==2.16.2",
        "numpy==1.26.4",
        "pandas==1.5.3",
        "pyarrow==14.0.1",
        "boto3==1.34.39",
        "fsspec==2023.5.0",
        "ipywidgets==7.7.2",
        "scikit-learn==1.4.2",
        "ipython==8.15.0",
        "matplotlib==3.7.2",
        "cloudpickle==2.2.1",
        "tqdm==4.65.0",
        "mlflow-skinny==2.13.1",
    ),
    dbfs_root=True,
    spark_version="15.4.x-cpu-ml-scala2.12",
)

RUNTIME_B = Runtime(
    name="17.3 LTS",
    version="17.3",
    python=str(PYENV / "3.12.1" / "bin" / "python3.12"),
    requirements=(
        "pyspark==4.0.1",
        "numpy==2.1.3",
        "pandas==2.2.3",
        "pyarrow==19.0.1",
        "boto3==1.36.2",
        "fsspec==2024.12.0",
        "ipywidgets==7.8.1",
        "scikit-learn==1.6.1",
        "matplotlib==3.10.0",
        "ipython==8.30.0",
        "cloudpickle==3.0.0",
        "mlflow-skinny==3.0.1",
    ),
    dbfs_root=False,
    spark_version="17.3.x-scala2.13",
)

RUNTIMES = {"A": RUNTIME_A, "B": RUNTIME_B}
