"""The layers a newcomer can see: the core never imports the notebook layer; compat uses public names only.

Every import statement of every tfnb module is read with ``ast`` (function-local ones included), so
a lazy ``import ipywidgets`` inside a core function fails here just like a top-level one.
"""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import tfnb

PACKAGE = pathlib.Path(tfnb.__file__).parent
NOTEBOOK_LIBS = ("IPython", "ipywidgets", "ipykernel", "tfnb.notebook")
# The only modules outside tfnb/notebook/ that may reach the notebook layer: the package facade (it
# loads the layer when IPython is loaded, and its lazy ProgressWidget export) and tfnb.tensorboard (the
# public TensorBoard call, whose notebook form is the panel).
FRONT = {"tfnb", "tfnb.tensorboard"}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: pathlib.Path):
    """``(imported module, imported name or None, line)`` for every import in the file, however nested."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                if not is_package:
                    anchor = anchor[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                # "from . import notebook" imports a module; "from .x import name" a name of module x
                yield base, alias.name, node.lineno


def _is_notebook(target: str, name: str | None) -> bool:
    full = f"{target}.{name}" if name else target
    return any(t == lib or t.startswith(lib + ".") for t in (target, full) for lib in NOTEBOOK_LIBS) or (
        full in ("tfnb.tensorboard", "tfnb.ProgressWidget"))


def _core(module: str) -> bool:
    return not (module in FRONT or module.startswith("tfnb.notebook"))


def test_the_walk_sees_every_layer_and_nested_imports():
    modules = _modules()
    assert {"tfnb.cluster", "tfnb.context", "tfnb.progress", "tfnb.callbacks", "tfnb._worker",
            "tfnb.notebook", "tfnb.notebook.progress", "tfnb.compat.cluster"} <= set(modules)
    # a function-local import counts: tfnb.tensorboard imports the panel only inside tensorboard()
    found = {(t, n) for t, n, _ in _imports("tfnb.tensorboard", modules["tfnb.tensorboard"])}
    assert ("tfnb.notebook.tensorboard", "show_panel") in found


def test_the_core_never_imports_the_notebook_layer():
    offending = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}{'.' + name if name else ''}"
                 for module, path in _modules().items() if _core(module)
                 for target, name, line in _imports(module, path) if _is_notebook(target, name)]
    assert not offending, "core modules must not import the notebook layer:\n" + "\n".join(offending)


def test_compat_imports_no_private_name_of_the_core():
    offending = []
    for module, path in _modules().items():
        if not module.startswith("tfnb.compat"):
            continue
        core_aliases = set()
        for target, name, line in _imports(module, path):
            if not target.startswith("tfnb") or target.startswith("tfnb.compat"):
                continue
            private = [p for p in target.split(".")[1:] if p.startswith("_")]
            if private or (name and name.startswith("_") and name != "__version__"):
                offending.append(f"{module}:{line} imports {target}{'.' + name if name else ''}")
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):  # `from .. import cluster as launcher` then `launcher._private`
            if isinstance(node, ast.ImportFrom) and node.level == 2 and not node.module:
                core_aliases |= {a.asname or a.name for a in node.names}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in core_aliases and node.attr.startswith("_")):
                offending.append(f"{module}:{node.lineno} uses {node.value.id}.{node.attr}")
            if isinstance(node, ast.Call):  # a private keyword such as run(..., _hooks=...) is private too
                offending += [f"{module}:{node.lineno} passes {k.arg}=" for k in node.keywords
                              if k.arg and k.arg.startswith("_")]
    assert not offending, "tfnb.compat must use the launcher's public surface:\n" + "\n".join(offending)


def test_importing_the_core_loads_no_notebook_module():
    core = [m for m in _modules() if _core(m) and not m.startswith("tfnb.compat") and m not in ("tfnb.__main__",)]
    code = ("import importlib, sys\n"
            f"for m in {core!r}: importlib.import_module(m)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in ('IPython', 'ipywidgets', 'ipykernel') "
            "or m.startswith('tfnb.notebook')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_public_surface_exports_what_the_api_returns_and_keeps_dev_errors_out():
    for name in ("SyncStats", "StageProgress", "StageResult", "EvalResult", "Launched", "Reused", "Failed",
                 "TimedOut", "ConsoleDisplay", "ProgressWidget", "RunEvent"):
        assert name in tfnb.__all__ and getattr(tfnb, name).__name__ == name
    assert callable(tfnb.tensorboard) and callable(tfnb.tensorboard.stop) and callable(tfnb.tensorboard.instances)
    assert "DbcFormatError" not in tfnb.__all__
    from tfnb.errors import DbcFormatError  # still where dev tools look for it

    assert issubclass(DbcFormatError, tfnb.TfnbError)
    # the TYPE_CHECKING block names every lazy export, so type checkers see what users get
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    checked = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.If)
               and getattr(node.test, "id", "") == "TYPE_CHECKING"
               for stmt in node.body if isinstance(stmt, ast.ImportFrom) for a in stmt.names}
    assert set(tfnb.__all__) <= checked, set(tfnb.__all__) - checked
