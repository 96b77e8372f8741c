"""The house a newcomer can see, enforced: layers that import only downward, no import circle, a core that
never imports the display layer, a task side that never imports the driver side, compat on public names.

Every import statement of every tfnb module is read with ``ast`` (function-local ones included), so a
lazy ``import ipywidgets`` inside a core function fails here just like a top-level one. There is no
list of exceptions: the public front (``tfnb/__init__.py``, ``python -m tfnb``) is not a layer of the
house but its door.
"""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import tfnb

PACKAGE = pathlib.Path(tfnb.__file__).parent
DISPLAY_LIBS = ("IPython", "ipywidgets", "ipykernel", "tfnb.notebook")
FRONT = {"tfnb", "tfnb.__main__"}
# floor of each part, ground first: a module imports only from its own part or a lower floor
FLOORS = [
    ("tfnb.errors", "tfnb._config", "tfnb._deps", "tfnb._private", "tfnb._protocol"),
    ("tfnb.storage", "tfnb._status"),
    ("tfnb._task",),                    # what runs inside a barrier task
    ("tfnb.data",),                     # driver side: data in and out, the model located and loaded
    ("tfnb.monitor",),                  # driver side: monitoring and the run model
    ("tfnb.launcher",),                 # driver side of a run
    ("tfnb.tuning",),                   # sweeps: many runs at once, searched by Optuna
    ("tfnb.notebook",),                 # the display layer
    ("tfnb.compat",),                   # the peers' APIs, on the public surface only
]


def _part(module: str) -> tuple[int, str] | None:
    for floor, parts in enumerate(FLOORS):
        for part in parts:
            if module == part or module.startswith(part + "."):
                return floor, part
    return None


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
                yield base, alias.name, node.lineno


def _target(modules: dict, base: str, name: str | None) -> str:
    """The tfnb module an import reaches: ``from . import x`` reaches module x, ``from .x import y`` module x."""
    return f"{base}.{name}" if name and f"{base}.{name}" in modules else base


def _edges():
    modules = _modules()
    for module, path in modules.items():
        for base, name, line in _imports(module, path):
            yield module, _target(modules, base, name), name, line


def test_every_module_has_a_floor():
    assert [m for m in _modules() if m not in FRONT and _part(m) is None] == []


def test_imports_run_downward_only():
    offending = []
    for module, target, _, line in _edges():
        if module in FRONT or not target.startswith("tfnb") or target in FRONT:
            continue
        mine, theirs = _part(module), _part(target)
        if theirs is None:
            offending.append(f"{module}:{line} imports {target}, which has no floor")
        elif theirs[0] > mine[0] or (theirs[0] == mine[0] and theirs[1] != mine[1] and mine[0] > 1):
            offending.append(f"{module}:{line} imports {target} ({theirs[1]}, floor {theirs[0] + 1}) from floor "
                             f"{mine[0] + 1}")
    assert not offending, "imports must run down the house:\n" + "\n".join(offending)


def test_no_import_circle():
    graph: dict[str, set[str]] = {}
    for module, target, _, _ in _edges():
        if target.startswith("tfnb") and target != module:
            graph.setdefault(module, set()).add(target)
    seen, stack, circles = set(), [], []

    def visit(node):
        if node in stack:
            circles.append(stack[stack.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt)
        stack.pop()

    for node in sorted(graph):
        visit(node)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_core_never_imports_the_display_layer():
    offending = [f"{module}:{line} imports {target}" for module, target, _, line in _edges()
                 if module not in FRONT and not module.startswith(("tfnb.notebook", "tfnb.compat"))
                 and any(target == lib or target.startswith(lib + ".") for lib in DISPLAY_LIBS)]
    assert not offending, "core modules must not import the display layer:\n" + "\n".join(offending)


def test_compat_uses_the_public_surface_only():
    import tfnb.launcher

    public = {"tfnb": set(tfnb.__all__) | {"__version__"}, "tfnb.launcher": set(tfnb.launcher.__all__),
              "tfnb.errors": {n for n in vars(tfnb.errors) if not n.startswith("_")}}
    offending = [f"{module}:{line} imports {target}.{name}" for module, target, name, line in _edges()
                 if module.startswith("tfnb.compat") and target.startswith("tfnb") and not target.startswith("tfnb.compat")
                 and name not in public.get(target, ())]
    assert not offending, "tfnb.compat must use public names and the documented launch hooks:\n" + "\n".join(offending)


def test_importing_the_core_loads_no_display_module():
    core = [m for m in _modules() if m not in FRONT and not m.startswith(("tfnb.notebook", "tfnb.compat"))]
    code = ("import importlib, sys\n"
            f"for m in {core!r}: importlib.import_module(m)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in ('IPython', 'ipywidgets', 'ipykernel') "
            "or m.startswith('tfnb.notebook')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_public_surface_exports_what_the_api_returns_and_keeps_dev_tools_out():
    for name in ("SyncStats", "StageProgress", "StageResult", "EvalResult", "Launched", "Reused", "Failed",
                 "TimedOut", "ConsoleDisplay", "ProgressWidget", "RunEvent", "RunOptions"):
        assert name in tfnb.__all__ and getattr(tfnb, name).__name__ == name
    assert callable(tfnb.tensorboard) and callable(tfnb.tensorboard.stop) and callable(tfnb.tensorboard.instances)
    assert "DbcFormatError" not in tfnb.__all__
    assert not (PACKAGE / "dbc.py").exists() and not (PACKAGE / "demo.py").exists()  # tools/, not the wheel
    from tools.wheel import build_wheel

    name, data = build_wheel()
    import io
    import zipfile

    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert "tfnb/launcher/__init__.py" in names and not [n for n in names if n.startswith("tools/")]
    # the TYPE_CHECKING block names every lazy export, so type checkers see what users get
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    checked = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.If)
               and getattr(node.test, "id", "") == "TYPE_CHECKING"
               for stmt in node.body if isinstance(stmt, ast.ImportFrom) for a in stmt.names}
    assert set(tfnb.__all__) <= checked, set(tfnb.__all__) - checked


def test_every_folder_of_the_package_ships():
    # setup.cfg's find: takes regular packages only: a folder without __init__.py would be left out of the wheel
    folders = {p.parent for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    assert [str(f.relative_to(PACKAGE.parent)) for f in sorted(folders) if not (f / "__init__.py").is_file()] == []


def _kind_literals(tree: ast.AST):
    """``(line, value)`` of each string literal written where a message or event kind goes: a ``"kind"`` or
    ``"event"`` entry of a dict, a comparison with ``kind`` / ``.kind`` / ``msg.get("kind")`` /
    ``msg["kind"]``, a default of ``msg.get("kind", ...)``, or the first argument of a sender."""
    from tfnb._protocol import FINISHED, EventKind, Msg

    kinds = {k.value for k in Msg} | {k.value for k in EventKind} | {FINISHED}
    keys, senders = ("kind", "event"), {"send", "send_apart", "post", "emit", "RunEvent"}

    def literal(node):
        return isinstance(node, ast.Constant) and node.value in kinds

    def kindish(node):
        return (isinstance(node, ast.Name) and node.id == "kind" or isinstance(node, ast.Attribute) and node.attr == "kind"
                or isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in keys
                or isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop")
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in keys)

    for node in ast.walk(tree):
        found = []
        if isinstance(node, ast.Dict):
            found = [v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value in keys]
        elif isinstance(node, ast.Compare) and any(kindish(n) for n in [node.left, *node.comparators]):
            for n in [node.left, *node.comparators]:
                found += n.elts if isinstance(n, (ast.Tuple, ast.List, ast.Set)) else [n]
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in senders or kindish(node):
                found = node.args[1:] if kindish(node) else node.args[:1]
            found += [k.value for k in node.keywords if k.arg in keys]
        elif isinstance(node, ast.Assign) and any(kindish(t) for t in node.targets):
            found = [node.value]
        yield from ((n.lineno, n.value) for n in found if literal(n))


def test_message_and_event_kinds_come_from_the_protocol_module():
    offending = [f"{path.relative_to(PACKAGE.parent)}:{line} writes the kind {value!r} as a string"
                 for module, path in _modules().items() if module != "tfnb._protocol"
                 for line, value in _kind_literals(ast.parse(path.read_text(), str(path)))]
    assert not offending, "use tfnb._protocol.Msg / EventKind for kinds:\n" + "\n".join(offending)


def test_the_kind_scan_sees_every_way_of_writing_a_kind():
    code = '''
chan.send("state", state="done")
x = {"kind": "stop"}
if msg.get("kind") == "log": pass
if kind in ("batch", "feed"): pass
if event.kind == "progress": pass
y = msg.get("event", "progress")
emit("finished")
RunEvent("attempt", "driver", 0)
z = {"kind": Msg.STOP, "state": "failed"}
if kind == "VectorUDT" or msg.get("state") == "failed": pass
'''
    assert [v for _, v in sorted(_kind_literals(ast.parse(code)))] == [
        "state", "stop", "log", "batch", "feed", "progress", "progress", "finished", "attempt"]
