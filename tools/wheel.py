"""The tfnb wheel, built byte for byte the same from the same tree: what the DBC archive carries.

A pure-Python wheel is a zip of the package and a ``.dist-info`` folder (PEP 427, core metadata 2.1).
This writes one from ``setup.cfg`` and ``tfnb/`` with sorted entries, a fixed date and fixed modes, so
two builds of one tree give the same bytes on any machine with the same zlib, and the archive that
embeds the wheel stays deterministic. ``python -m build`` (``./dev wheel``) makes the same package for
PyPI; this one skips the build backend (no isolated environment, no download: a build takes ~0.2 s).

Usage::

    python tools/wheel.py [OUT_DIR]        # writes OUT_DIR/tfnb-<version>-py3-none-any.whl (default dist/)
"""
from __future__ import annotations

import base64
import configparser
import hashlib
import io
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_DATE = (1980, 1, 1, 0, 0, 0)


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def _metadata(cfg: configparser.ConfigParser) -> str:
    meta, opts = cfg["metadata"], cfg["options"]
    out = ["Metadata-Version: 2.1", f"Name: {meta['name']}", f"Version: {meta['version']}",
           f"Summary: {meta['description']}", f"License: {meta.get('license', '')}"]
    out += [f"Classifier: {c}" for c in _lines(meta.get("classifiers", ""))]
    out.append(f"Requires-Python: {opts['python_requires']}")
    out += [f"Requires-Dist: {r}" for r in _lines(opts.get("install_requires", ""))]
    extras = cfg["options.extras_require"] if cfg.has_section("options.extras_require") else {}
    for extra in extras:
        out.append(f"Provides-Extra: {extra}")
        out += [f'Requires-Dist: {r}; extra == "{extra}"' for r in _lines(extras[extra])]
    return "\n".join(out) + "\n"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(root: Path = ROOT) -> tuple[str, bytes]:
    """``(file name, bytes)`` of the wheel of ``root``'s ``setup.cfg`` and ``tfnb/`` sources.

    Example:
        >>> name, data = build_wheel()
        >>> name
        'tfnb-0.1.0-py3-none-any.whl'
    """
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(root / "setup.cfg")
    name, version = cfg["metadata"]["name"], cfg["metadata"]["version"]
    info = f"{name}-{version}.dist-info"
    files = {p.relative_to(root).as_posix(): p.read_bytes()
             for p in sorted((root / "tfnb").rglob("*.py")) if "__pycache__" not in p.parts}
    scripts = _lines(cfg.get("options.entry_points", "console_scripts", fallback=""))
    files[f"{info}/METADATA"] = _metadata(cfg).encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: tfnb tools/wheel.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/top_level.txt"] = b"tfnb\n"
    if scripts:
        files[f"{info}/entry_points.txt"] = ("[console_scripts]\n" + "\n".join(scripts) + "\n").encode()
    record = [_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for n, d in files.items():
            entry = zipfile.ZipInfo(n, date_time=_DATE)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.create_system = 3
            entry.external_attr = 0o100644 << 16
            zf.writestr(entry, d, compresslevel=9)
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


def same_wheel(a: bytes, b: bytes) -> bool:
    """Whether two wheels hold the same entries (names and bytes), however each was compressed."""
    def entries(data: bytes) -> list[tuple[str, bytes]]:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            return [(i.filename, zf.read(i)) for i in zf.infolist()]
    return a == b or entries(a) == entries(b)


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "dist")
    out.mkdir(parents=True, exist_ok=True)
    wheel_name, wheel = build_wheel()
    (out / wheel_name).write_bytes(wheel)
    print(out / wheel_name)
