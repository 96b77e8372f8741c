"""Lazy imports of heavy or optional packages, with an install hint when missing."""
from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependencyError

# module -> what to pip install
_HINTS = {
    "tensorflow": "tensorflow-cpu (or tensorflow) and tf-keras",
    "tf_keras": "tf-keras",
    "pyspark": "pyspark",
    "boto3": "boto3",
    "fsspec": "fsspec",
    "ipywidgets": "ipywidgets",
    "IPython": "ipython",
    "tensorboard": "tensorboard",
    "pyarrow": "pyarrow",
    "tqdm": "tqdm",
    "cloudpickle": "cloudpickle",
}


def require(module: str, purpose: str = "") -> ModuleType:
    """Import ``module`` or raise MissingDependencyError naming the package to install.

    Args:
        module: dotted module name, e.g. ``"boto3"``.
        purpose: what the caller wanted it for, shown in the message.

    Returns:
        The imported module.

    Raises:
        MissingDependencyError: when the import fails.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        pkg = _HINTS.get(top, top)
        why = f" for {purpose}" if purpose else ""
        raise MissingDependencyError(
            f"{module} is needed{why} but is not installed; pip install {pkg}"
        ) from e
