"""Databricks DBC archives: build one from the project's notebooks, read one back.

A DBC archive is a zip of ``NotebookV1`` JSON documents, one entry per notebook at
``<folder>/<name>.<language>`` (``tfnb/00_constants.python``), whose ``commands`` are the cells in
``position`` order (a markdown cell is a command starting with ``%md``). :func:`build` writes every
field Databricks' exporter writes, in its order, so that importing the archive (Workspace > Import, or
``databricks workspace import TARGET --file tfnb.dbc --format DBC``) gives the notebooks exactly as
they are in ``notebooks/``: same names (so ``%run ./00_constants`` resolves), order, cells and magics.

Choices a reader of the archive should know about:

* **Like an export**: a root ``manifest.mf``, a ``FolderV1`` entry for the folder, every entry
  deflated, command ``metadata`` ``{}``. No ``environmentMetadata``: the exporter's value would pin
  imported notebooks to an old serverless environment.
* **Byte-identical builds**: fixed entry order, deflate level, date (1980-01-01) and permissions; ids
  (``origId``, ``guid``, ``nuid``) hashed from the notebook path and cell position, never random;
  compact JSON in a fixed field order. zlib builds (zlib-ng) may deflate differently, so
  :func:`is_fresh` compares what the entries hold (names, dates, modes, bytes), not the compressed bytes.
* **Refused, naming the notebook and cell**: outputs (run ``jupyter nbconvert --clear-output --inplace
  notebooks/*.ipynb``: what is committed is what is shipped); what looks like a credential (an AWS
  access key id or session token, a literal assigned to a secret name such as
  ``aws_secret_access_key`` or to tfnb's storage options ``key``/``secret``/``token``, a private key
  block, a Databricks token; the value is never shown); a ``%run`` that is not alone in its cell or
  that names a notebook not in the archive.
* **Cell metadata**: Jupyter's hidden-source / hidden-output flags map to ``hideCommandCode`` /
  ``hideCommandResult``. Tags, kernelspec and cell ids are not carried (exports have ``metadata: {}``;
  Databricks parameters are widgets); :func:`extract` writes fresh kernel metadata and ids.
* **Reading real exports**: data descriptors, ``FolderV1`` entries, ``manifest.mf``, commands that
  start with a blank line, ``%md-sandbox``, quoted ``%run "./NAME"`` and commands without
  ``metadata`` are all read.

Example:
    >>> from tfnb import dbc
    >>> result = dbc.build("notebooks", "dbc/tfnb.dbc")          # doctest: +SKIP
    >>> [nb.name for nb in dbc.read(result.path)]                 # doctest: +SKIP
    ['00_constants', '01_data_ingest', '02_model', '03_train', '04_evaluate', '05_tensorboard']

Command line::

    python -m tools.dbc build notebooks/ -o dbc/tfnb.dbc
    python -m tools.dbc extract dbc/tfnb.dbc -o /tmp/nbs
    python -m tools.dbc check notebooks/ dbc/tfnb.dbc     # exit 1 when the archive is stale
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import io
import json
import logging
import os
import re
import sys
import uuid
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tfnb.storage import atomic_write
from tfnb.errors import ConfigError, DbcFormatError, TfnbError

log = logging.getLogger(__name__)

__all__ = ["Cell", "Notebook", "BuildResult", "build", "build_bytes", "is_fresh", "read", "extract",
           "to_ipynb", "to_source", "main"]

# language (also the entry extension) -> (source-format comment prefix, source-format file suffix)
_LANGUAGES = {"python": ("#", ".py"), "scala": ("//", ".scala"), "sql": ("--", ".sql"), "r": ("#", ".r")}
_FORMATS = ("ipynb", "py")
_MANIFEST = "manifest.mf"       # Databricks exports carry one at the root; it holds no cells
_NOTEBOOK_VERSION = "NotebookV1"
_MAX_ENTRY_BYTES = 256 << 20    # a DBC notebook this large is not one we wrote; refuse, don't inflate

# A quoted literal of 8+ characters without spaces (placeholders such as "<your key>" pass), or the
# unquoted base64-like value of a shell/ini/%env line that is not a name being read.
_SECRET_VALUE = r"""(?:[rbuRBU]{0,2}(?:"[^"\s]{8,}"|'[^'\s]{8,}')|[A-Za-z0-9/+=]{16,}(?![\w.(\[/+=]))"""


def _assigned_literal(names: str) -> re.Pattern:
    """``NAME`` given a literal value: ``NAME = "v"``, ``os.environ["NAME"] = "v"``, ``.setdefault("NAME", "v")``,
    ``.update(NAME="v")``, ``{"NAME": "v"}``, ``export NAME=v``, ``%env NAME=v`` (any case)."""
    return re.compile(rf"""(?:{names})["']?\s*\]?\s*[=:,]\s*{_SECRET_VALUE}""", re.IGNORECASE)


_CREDENTIALS = (
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("an AWS session token", re.compile(r"\b(?:IQoJb3JpZ2lu|FwoGZXIvYXdz)[A-Za-z0-9/+=]{40,}")),
    ("an aws_secret_access_key literal", _assigned_literal("aws_secret_access_key")),
    ("an aws_session_token literal", _assigned_literal("aws_session_token|aws_security_token")),
    ("a databricks_token literal", _assigned_literal("databricks_token")),
    # tfnb's storage options: {"key": ..., "secret": ..., "token": ...} and their keyword forms
    ("a storage secret or token literal",
     re.compile(r"""(?<![\w.])["']?(?:secret|token|secret_key|session_token)["']?\s*[=:]\s*"""
                r"""[rbuRBU]{0,2}(?:"[^"\s]{8,}"|'[^'\s]{8,}')""")),
    ("a storage access key literal",
     re.compile(r"""(?<![\w.])["']?(?:key|access_key)["']?\s*[=:]\s*["'][A-Z0-9]{16,128}["']""")),
    ("a private key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
    ("a Databricks token", re.compile(r"\bdapi[0-9a-f]{32}\b")),
)


_RUN_LINE = re.compile(r"""^%run\s+("[^"]*"|'[^']*'|\S+)""")
# The same %run in each world: IPython runs ``./NAME.ipynb``, Databricks runs ``./NAME``.
# Targets with spaces are quoted: ``%run "./00 setup"``. Groups: 1 ``%run `` and 5 trailing space around
# either 2 an unquoted target or 4 a target in quotes 3.
_RUN_IPYNB = re.compile(r"^(\s*%run\s+)(?:(\./[^/\s\"']+)\.ipynb|([\"'])(\./[^/\"']+)\.ipynb\3)(\s*)$",
                        re.MULTILINE)
_RUN_DATABRICKS = re.compile(r"^(\s*%run\s+)(?:(\./[^/\s.\"']+)|([\"'])(\./[^/.\"']+)\3)(\s*)$", re.MULTILINE)
_MD_LINE = re.compile(r"^%md(?:-sandbox)?(?:[ \t]|$)")


# ---------------------------------------------------------------- typed values


@dataclass(frozen=True)
class Cell:
    """One notebook cell as it travels through a DBC archive: ``cell_type`` ``"code"`` or ``"markdown"``,
    its ``source`` (for markdown without the ``%md`` line), Jupyter ``tags`` (``("parameters",)``), and
    ``hide_code`` / ``hide_result``: Jupyter ``source_hidden`` / ``outputs_hidden``, Databricks
    ``hideCommandCode`` / ``hideCommandResult``."""

    cell_type: str
    source: str
    tags: tuple[str, ...] = ()
    hide_code: bool = False
    hide_result: bool = False


@dataclass(frozen=True)
class Notebook:
    """One notebook of a DBC archive: its ``path``, the archive entry without extension
    (``"tfnb/00_constants"``), its ``name`` (``"00_constants"``), ``language`` (``python``, ``scala``,
    ``sql`` or ``r``) and ``cells`` in run order."""

    path: str
    name: str
    language: str
    cells: tuple[Cell, ...]

    @property
    def folder(self) -> str:
        """The archive folder holding the notebook (``""`` at the root)."""
        return _parent(self.path)


@dataclass(frozen=True)
class BuildResult:
    """What :func:`build` wrote: the archive ``path``, its ``notebooks`` entries in run order
    (``("tfnb/00_constants", ...)``) and the ``sha256`` hex digest of its bytes."""

    path: Path
    notebooks: tuple[str, ...]
    sha256: str


# ---------------------------------------------------------------- build


def build(src_dir: str | os.PathLike, out_path: str | os.PathLike, *,
          folder: str | None = None, wheel: tuple[str, bytes] | None = None) -> BuildResult:
    """Write a DBC archive of every ``*.ipynb`` in ``src_dir``, in file-name order.

    Args:
        src_dir: folder of nbformat-4 notebooks stored without outputs.
        out_path: archive to write (parent folders are created; written atomically).
        folder: the workspace folder the notebooks land in on import; defaults to the
            archive's file name without suffix (``dbc/tfnb.dbc`` -> ``tfnb``).
        wheel: ``(file name, bytes)`` of a wheel to carry: it replaces the line ``TFNB_WHEEL = None``
            of the notebook that has it (``tfnb_install``) with the name, the sha256 of the bytes and the
            bytes in base64, so that importing the archive is all a workspace needs to install it, and the
            install checks what it installs against the hash.

    Returns:
        A :class:`BuildResult` with the archive path, its notebooks and sha256.

    Raises:
        ConfigError: no notebooks, a bad ``folder``, or a notebook that is not nbformat 4 or not Python,
            has outputs, a raw cell, a credential, or a ``%run`` not alone or naming no notebook of the archive;
            a ``wheel`` but no ``TFNB_WHEEL = None`` line to carry it.

    Example:
        >>> build("notebooks", "dbc/tfnb.dbc").notebooks[0]       # doctest: +SKIP
        'tfnb/00_constants'
    """
    out = Path(out_path)
    data, entries = build_bytes(src_dir, folder=out.stem if folder is None else folder, wheel=wheel)
    atomic_write(str(out), data)
    digest = hashlib.sha256(data).hexdigest()
    log.info("wrote %s: %d notebooks, sha256 %s", out, len(entries), digest)
    return BuildResult(path=out, notebooks=tuple(entries), sha256=digest)


def build_bytes(src_dir: str | os.PathLike, *, folder: str = "tfnb",
                wheel: tuple[str, bytes] | None = None) -> tuple[bytes, list[str]]:
    """The archive :func:`build` would write, as bytes, and its notebook entries in run order.

    Example:
        >>> data, entries = build_bytes("notebooks", folder="tfnb")   # doctest: +SKIP
    """
    src = Path(src_dir)
    if not folder or "/" in folder or "\\" in folder or folder.startswith(".") or folder.strip() != folder:
        raise ConfigError(f"folder={folder!r} is not a usable workspace folder name; pass a plain name such as 'tfnb'")
    if not src.is_dir():
        raise ConfigError(f"notebook folder {str(src)!r} does not exist; pass the folder holding the .ipynb files")
    files = sorted((p for p in src.glob("*.ipynb") if not p.name.startswith(".")), key=lambda p: p.name)
    if not files:
        raise ConfigError(f"no .ipynb notebooks in {str(src)!r}; pass the folder holding the .ipynb files")
    notebooks = [_load_ipynb(p, folder) for p in files]
    names = {nb.name for nb in notebooks}
    for path, nb in zip(files, notebooks, strict=True):
        _check_runs(path, nb, names)
    if wheel is not None:
        notebooks = _carry_wheel(notebooks, *wheel)

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:  # each entry says how it is compressed: see _zip_write
        _zip_write(zf, _MANIFEST, {"version": "Manifest", "guid": _uuid("manifest", folder),
                                   "origId": -1, "name": _MANIFEST})
        _zip_write(zf, folder + "/", {"version": "FolderV1", "origId": _orig_id("folder", folder),
                                      "name": folder, "guid": "", "children": []})
        for nb in notebooks:
            _zip_write(zf, f"{nb.path}.{nb.language}", _notebook_json(nb))
    return buf.getvalue(), [nb.path for nb in notebooks]


_WHEEL_SLOT = re.compile(r"^TFNB_WHEEL = None\b.*$", re.MULTILINE)
# as it reads in the JSON: name, sha256, base64
_WHEEL_CARRIED = re.compile(r'TFNB_WHEEL = \(\\"([^"\\]+)\\", \\"[0-9a-f]{64}\\", \\"([A-Za-z0-9+/=]*)\\"\)')


def _carry_wheel(notebooks: list[Notebook], name: str, data: bytes) -> list[Notebook]:
    """The notebooks with the wheel in the one ``TFNB_WHEEL = None`` line they have, as ``(name, sha256 hex,
    base64)``: the install notebook checks the bytes it writes against the hash, and pins pip to it."""
    if not re.fullmatch(r"[\w.+-]+\.whl", name):
        raise ConfigError(f"wheel name {name!r} is not a wheel file name (NAME-VERSION-TAGS.whl)")
    digest = hashlib.sha256(data).hexdigest()
    line = f'TFNB_WHEEL = ("{name}", "{digest}", "{base64.b64encode(data).decode()}")  # put here by the DBC build'
    out, slots = [], 0
    for nb in notebooks:
        cells = []
        for cell in nb.cells:
            if cell.cell_type == "code" and _WHEEL_SLOT.search(cell.source):
                slots += 1
                cell = dataclasses.replace(cell, source=_WHEEL_SLOT.sub(lambda _: line, cell.source, count=1))
            cells.append(cell)
        out.append(dataclasses.replace(nb, cells=tuple(cells)))
    if slots != 1:
        raise ConfigError(f"the notebooks have {slots} lines `TFNB_WHEEL = None` to carry the wheel in; exactly one "
                          "must have it (the tfnb_install notebook's)")
    return out


def _wheel_entries(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return [(i.filename, zf.read(i)) for i in zf.infolist()]


def _contents(data: bytes) -> list[tuple]:
    def same_wheel(m: re.Match) -> str:
        # a carried wheel counts by what it holds: another zlib compresses the same files to other bytes
        held = hashlib.sha256(repr(_wheel_entries(base64.b64decode(m.group(2)))).encode()).hexdigest()
        return f"TFNB_WHEEL = {m.group(1)} holding {held}"

    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return [(i.filename, i.date_time, i.external_attr, i.compress_type,
                 _WHEEL_CARRIED.sub(same_wheel, zf.read(i).decode("utf-8", "replace"))) for i in zf.infolist()]


def is_fresh(src_dir: str | os.PathLike, archive: str | os.PathLike, *, folder: str | None = None,
             wheel: tuple[str, bytes] | None = None) -> bool:
    """Whether ``archive`` holds what a build of ``src_dir`` gives now.

    Example:
        >>> is_fresh("notebooks", "dbc/tfnb.dbc")                 # doctest: +SKIP
        True
    """
    arc = Path(archive)
    data, _ = build_bytes(src_dir, folder=arc.stem if folder is None else folder, wheel=wheel)
    try:
        old = arc.read_bytes()
        return old == data or _contents(old) == _contents(data)
    except (FileNotFoundError, zipfile.BadZipFile):
        return False


def _zip_write(zf: zipfile.ZipFile, name: str, doc: dict[str, Any]) -> None:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3  # unix, whatever OS builds it, so the bytes match everywhere
    info.external_attr = ((0o40755 << 16) | 0x10) if name.endswith("/") else (0o100644 << 16)
    zf.writestr(info, json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def _load_ipynb(path: Path, folder: str) -> Notebook:
    where = f"notebook {path.name}"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{where} is not valid .ipynb JSON ({e}); open and re-save it in Jupyter") from e
    if not isinstance(doc, dict) or doc.get("nbformat") != 4 or not isinstance(doc.get("cells"), list):
        raise ConfigError(f"{where} is not an nbformat 4 notebook; convert it with "
                          f"`jupyter nbconvert --to notebook --nbformat 4`")
    meta = doc.get("metadata") or {}
    language = ((meta.get("kernelspec") or {}).get("language")
                or (meta.get("language_info") or {}).get("name") or "python").lower()
    if language != "python":
        raise ConfigError(f"{where} is a {language!r} notebook; tfnb builds DBC archives of Python notebooks only")
    cells = []
    for i, cell in enumerate(doc["cells"], start=1):
        where_cell = f"{where}, cell {i}"
        kind = cell.get("cell_type")
        if kind not in ("code", "markdown"):
            raise ConfigError(f"{where_cell} is a {kind!r} cell; Databricks has only code and markdown "
                              f"cells: change it to markdown or code")
        if cell.get("outputs"):
            raise ConfigError(f"{where_cell} has outputs; notebooks must be stored without outputs: run "
                              f"`jupyter nbconvert --clear-output --inplace {path}` first")
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        for what, pattern in _CREDENTIALS:
            if pattern.search(source):
                raise ConfigError(f"{where_cell} contains what looks like {what}; credentials must not "
                                  f"reach the DBC archive: read them from the environment or a secret scope")
        cmeta = cell.get("metadata") or {}
        jupyter = cmeta.get("jupyter") or {}
        tags = cmeta.get("tags") or ()
        if not all(isinstance(t, str) for t in tags):
            raise ConfigError(f"{where_cell} has non-text tags {tags!r}; tags must be strings")
        cells.append(Cell(cell_type=kind, source=source, tags=tuple(tags),
                          hide_code=bool(jupyter.get("source_hidden", False)),
                          hide_result=bool(jupyter.get("outputs_hidden", False))))
    return Notebook(path=f"{folder}/{path.stem}", name=path.stem, language="python", cells=tuple(cells))


def _check_runs(path: Path, nb: Notebook, names: set[str]) -> None:
    for i, cell in enumerate(nb.cells, start=1):
        lines = [ln.strip() for ln in cell.source.splitlines() if ln.strip()]
        if cell.cell_type != "code" or not any(_RUN_LINE.match(ln) for ln in lines):
            continue
        where = f"notebook {path.name}, cell {i}"
        if len(lines) > 1:
            raise ConfigError(f"{where} has %run together with other lines; Databricks runs %run only "
                              f"when it is alone in its cell: move the other lines to their own cell")
        target = _RUN_LINE.match(lines[0]).group(1).strip("\"'").removesuffix(".ipynb")
        name = target[2:]
        if target.startswith("./") and "/" not in name and name not in names:
            raise ConfigError(f"{where} runs {target!r} but the archive has no notebook {name!r} "
                              f"(it has {', '.join(sorted(names))}); fix the %run line or add the notebook")


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8")).digest()


def _uuid(*parts: object) -> str:
    return str(uuid.UUID(bytes=_digest(*parts)[:16], version=4))


def _orig_id(*parts: object) -> int:
    # 48 bits plus room for the command offsets: stays an exact integer in JavaScript.
    return int.from_bytes(_digest(*parts)[:6], "big") + 1


def _command_source(cell: Cell) -> str:
    if cell.cell_type == "markdown":
        return "%md\n" + cell.source
    return _RUN_IPYNB.sub(r"\1\3\2\4\3\5", cell.source)  # %run ./NAME.ipynb -> ./NAME


def _notebook_json(nb: Notebook) -> dict[str, Any]:
    base = _orig_id("origId", nb.path)
    commands = [_command_json(nb, cell, pos, base) for pos, cell in enumerate(nb.cells, start=1)]
    # Field order is the order Databricks' exporter writes.
    return {"version": _NOTEBOOK_VERSION, "origId": base, "name": nb.name, "language": nb.language,
            "commands": commands, "dashboards": [], "guid": _uuid("guid", nb.path), "globalVars": {},
            "iPythonMetadata": None, "inputWidgets": {}, "notebookMetadata": {"pythonIndentUnit": 4},
            "reposExportFormat": "SOURCE"}


# Every field of a command as Databricks' exporter writes it, in its order; _command_json fills in the
# per-cell ones. "state" "input": never run, so no results ship. "latestUser" holds what exports write
# there: no real user name goes into the archive.
_COMMAND = {
    "version": "CommandV1", "origId": 0, "guid": "", "subtype": "command", "commandType": "auto",
    "position": 0.0, "command": "", "commandVersion": 0, "state": "input", "results": None,
    "resultDbfsStatus": "INLINED_IN_TREE", "resultDbfsErrorMessage": None, "errorSummary": None,
    "errorTraceType": None, "error": None, "errorDetails": None, "baseErrorDetails": None, "workflows": [],
    "startTime": 0, "submitTime": 0, "finishTime": 0, "collapsed": False, "bindings": {}, "inputWidgets": {},
    "displayType": "table", "width": "auto", "height": "auto", "xColumns": None, "yColumns": None,
    "pivotColumns": None, "pivotAggregation": None, "useConsistentColors": False, "customPlotOptions": {},
    "commentThread": [], "commentsVisible": False, "parentHierarchy": [], "diffInserts": [], "diffDeletes": [],
    "globalVars": {}, "latestUser": "a user", "latestUserId": None, "commandTitle": "",
    "showCommandTitle": False, "hideCommandCode": False, "hideCommandResult": False,
    "isLockedInExamMode": False, "iPythonMetadata": None, "metadata": {}, "streamStates": {},
    "datasetPreviewNameToCmdIdMap": {}, "tableResultIndex": None, "listResultMetadata": [],
    "subcommandOptions": None, "contentSha256Hex": None, "tableResultSettingsMap": None, "nuid": "",
}


def _command_json(nb: Notebook, cell: Cell, position: int, base: int) -> dict[str, Any]:
    return {**_COMMAND, "origId": base + position, "guid": _uuid("guid", nb.path, position),
            "position": float(position), "command": _command_source(cell), "hideCommandCode": cell.hide_code,
            "hideCommandResult": cell.hide_result, "nuid": _uuid("nuid", nb.path, position)}


# ---------------------------------------------------------------- read


def read(archive: str | os.PathLike) -> list[Notebook]:
    """The notebooks of a DBC archive, sorted by archive path.

    Args:
        archive: a ``.dbc`` file (ours or one exported by Databricks).

    Returns:
        One :class:`Notebook` per notebook entry, cells in ``position`` order.

    Raises:
        ConfigError: the file does not exist.
        DbcFormatError: not a zip, no notebooks, an entry that is not NotebookV1 JSON, a
            missing field (named with its entry), or an unknown language.

    Example:
        >>> [c.cell_type for c in read("dbc/tfnb.dbc")[0].cells]     # doctest: +SKIP
        ['markdown', 'code']
    """
    arc = Path(archive)
    if not arc.is_file():
        raise ConfigError(f"DBC archive {str(arc)!r} does not exist; build it with `./dev dbc` in the tfnb "
                          f"checkout\nOr: python -m tools.dbc build notebooks/ -o {arc}")
    try:
        zf = zipfile.ZipFile(arc)
    except zipfile.BadZipFile as e:
        raise DbcFormatError(f"{arc} is not a DBC archive: not a zip file ({e}); "
                             f"export it again from Databricks or rebuild it with `./dev dbc`") from e
    notebooks = []
    with zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            name = info.filename
            entry = PurePosixPath(name)
            if info.is_dir() or entry.name.lower() == _MANIFEST:
                continue
            if entry.is_absolute() or ".." in entry.parts or "\\" in name:
                raise DbcFormatError(f"{arc}: entry {name!r} points outside the archive folder; refusing to read it")
            if info.file_size > _MAX_ENTRY_BYTES:
                raise DbcFormatError(f"{arc}: entry {name!r} is {info.file_size} bytes, more than the "
                                     f"{_MAX_ENTRY_BYTES} a notebook may have")
            try:
                raw = zf.read(info)
            except (zipfile.BadZipFile, OSError, RuntimeError, NotImplementedError) as e:
                raise DbcFormatError(f"{arc}: entry {name!r} cannot be read ({e})") from e
            notebooks.append(_parse_notebook(arc, name, raw))
    if not notebooks:
        raise DbcFormatError(f"{arc} is an empty DBC archive: it holds no notebooks")
    return notebooks


def _parent(path: str) -> str:
    parent = str(PurePosixPath(path).parent)
    return "" if parent == "." else parent


def _parse_notebook(arc: Path, entry: str, raw: bytes) -> Notebook:
    where = f"{arc}: entry {entry!r}"
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DbcFormatError(f"{where} is not notebook JSON ({e})") from e
    if not isinstance(doc, dict):
        raise DbcFormatError(f"{where} is not a notebook object (JSON {type(doc).__name__})")
    for field in ("version", "name", "language", "commands"):
        if field not in doc:
            raise DbcFormatError(f"{where} lacks the required field {field!r}")
    if doc["version"] != _NOTEBOOK_VERSION:
        raise DbcFormatError(f"{where} has version {doc['version']!r}; only {_NOTEBOOK_VERSION!r} is understood")
    language = doc["language"]
    if not isinstance(language, str) or language.lower() not in _LANGUAGES:
        raise DbcFormatError(f"{where} has unknown language {language!r}; "
                             f"expected one of {', '.join(sorted(_LANGUAGES))}")
    if not isinstance(doc["name"], str) or not doc["name"] or "/" in doc["name"]:
        raise DbcFormatError(f"{where} has an unusable name {doc['name']!r}")
    commands = doc["commands"]
    if not isinstance(commands, list):
        raise DbcFormatError(f"{where}: field 'commands' is {type(commands).__name__}, not a list")
    parsed = []
    for i, cmd in enumerate(commands):
        if not isinstance(cmd, dict):
            raise DbcFormatError(f"{where}: command {i} is not an object")
        for field in ("command", "position"):
            if field not in cmd:
                raise DbcFormatError(f"{where}: command {i} lacks the required field {field!r}")
        if not isinstance(cmd["command"], str):
            raise DbcFormatError(f"{where}: command {i} field 'command' is not text")
        if isinstance(cmd["position"], bool) or not isinstance(cmd["position"], int | float):
            raise DbcFormatError(f"{where}: command {i} field 'position' is not a number")
        if cmd.get("subtype", "command") != "command":
            continue
        parsed.append((cmd["position"], i, _cell_of(cmd)))
    parsed.sort(key=lambda t: (t[0], t[1]))
    folder = _parent(entry)
    path = f"{folder}/{doc['name']}" if folder else doc["name"]
    return Notebook(path=path, name=doc["name"], language=language.lower(), cells=tuple(c for _, _, c in parsed))


def _cell_of(cmd: dict[str, Any]) -> Cell:
    text = cmd["command"]
    first, sep, rest = text.lstrip("\n").partition("\n")  # exports often start a command with a blank line
    meta = cmd.get("metadata") if isinstance(cmd.get("metadata"), dict) else {}
    tags = meta.get("tags") if isinstance(meta.get("tags"), list) else []
    common = dict(tags=tuple(str(t) for t in tags), hide_code=bool(cmd.get("hideCommandCode", False)),
                  hide_result=bool(cmd.get("hideCommandResult", False)))
    if _MD_LINE.match(first):
        inline = "".join(first.split(None, 1)[1:])
        return Cell(cell_type="markdown", source=inline + (sep if inline else "") + rest, **common)
    return Cell(cell_type="code", source=text, **common)


# ---------------------------------------------------------------- extract


def extract(archive: str | os.PathLike, out_dir: str | os.PathLike, *,
            formats: Sequence[str] = _FORMATS) -> list[Path]:
    """Write every notebook of a DBC archive as ``.ipynb`` and/or Databricks source files.

    Files go to ``out_dir/<archive folder>/<name>.ipynb`` and ``<name>.py`` (``.scala``,
    ``.sql``, ``.r`` for other languages). Existing files are overwritten.

    Args:
        archive: the ``.dbc`` file.
        out_dir: where to write; created if missing.
        formats: any of ``"ipynb"`` (nbformat 4.5) and ``"py"`` (Databricks source format).

    Returns:
        The written paths, notebook by notebook.

    Raises:
        ConfigError: an unknown format or a missing archive.
        DbcFormatError: as :func:`read`.

    Example:
        >>> extract("dbc/tfnb.dbc", "/tmp/nbs", formats=("ipynb",))   # doctest: +SKIP
        [PosixPath('/tmp/nbs/tfnb/00_constants.ipynb'), ...]
    """
    formats = tuple(formats)
    if not formats or not set(formats) <= set(_FORMATS):
        raise ConfigError(f"formats={formats!r}: each must be one of {', '.join(_FORMATS)}")
    notebooks = read(archive)
    out = Path(out_dir)
    written = []
    for nb in notebooks:
        base = out.joinpath(*PurePosixPath(nb.path).parts)
        base.parent.mkdir(parents=True, exist_ok=True)
        for fmt, suffix, render in (("ipynb", ".ipynb", to_ipynb), ("py", _LANGUAGES[nb.language][1], to_source)):
            if fmt in formats:
                target = base.with_name(base.name + suffix)
                target.write_text(render(nb), encoding="utf-8")
                written.append(target)
    return written


def to_ipynb(nb: Notebook) -> str:
    """The notebook as nbformat 4.5 JSON text (formatted like Jupyter saves it).

    Example:
        >>> text = to_ipynb(read("dbc/tfnb.dbc")[0])               # doctest: +SKIP
    """
    cells = []
    for pos, cell in enumerate(nb.cells, start=1):
        meta: dict[str, Any] = {}
        jupyter = {k: True for k, on in (("source_hidden", cell.hide_code),
                                         ("outputs_hidden", cell.hide_result)) if on}
        if jupyter:
            meta["jupyter"] = jupyter
        if cell.tags:
            meta["tags"] = list(cell.tags)
        out = {"cell_type": cell.cell_type, "id": _uuid("cell", nb.path, pos)[:8] + f"-{pos}",
               "metadata": meta, "source": cell.source.splitlines(keepends=True)}
        if cell.cell_type == "code":
            source = _RUN_DATABRICKS.sub(r"\1\3\2\4.ipynb\3\5", cell.source)  # %run ./NAME -> ./NAME.ipynb
            out.update(execution_count=None, outputs=[], source=source.splitlines(keepends=True))
        cells.append(out)
    metadata: dict[str, Any] = {"language_info": {"name": nb.language}}
    if nb.language == "python":
        metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    doc = {"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def to_source(nb: Notebook) -> str:
    """The notebook in Databricks source format (what Workspace > Export > Source writes).

    Magic cells (``%md``, ``%run``, ``%pip``, ``%sh`` ...) become ``# MAGIC`` lines; cells
    are separated by ``# COMMAND ----------``.

    Example:
        >>> print(to_source(read("dbc/tfnb.dbc")[0]))              # doctest: +SKIP
        # Databricks notebook source
        # MAGIC %md
        ...
    """
    comment = _LANGUAGES[nb.language][0]
    parts = []
    for cell in nb.cells:
        text = _command_source(cell)
        if text.lstrip("\n").startswith("%"):
            text = "\n".join(f"{comment} MAGIC {ln}" if ln else f"{comment} MAGIC" for ln in text.split("\n"))
        parts.append(text)
    body = f"\n\n{comment} COMMAND ----------\n\n".join(parts)
    return f"{comment} Databricks notebook source\n{body}\n"


# ---------------------------------------------------------------- command line


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m tools.dbc build|extract|check``; returns the exit code (0 ok, 1 stale, 2 error).

    Example:
        >>> main(["build", "notebooks", "-o", "dbc/tfnb.dbc"])     # doctest: +SKIP
        0
    """
    parser = argparse.ArgumentParser(prog="python -m tools.dbc",
                                     description="Build and read Databricks DBC archives of notebooks.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("build", help="write a DBC archive of a folder of .ipynb notebooks")
    p.add_argument("src", help="folder of .ipynb notebooks (stored without outputs)")
    p.add_argument("-o", "--output", required=True, help="archive to write, e.g. dbc/tfnb.dbc")
    p.add_argument("--folder", help="workspace folder name in the archive (default: output file stem)")
    p.add_argument("--wheel", help="a wheel for the notebook with the line TFNB_WHEEL = None to carry")
    p = sub.add_parser("extract", help="write the notebooks of a DBC archive as .ipynb and source .py")
    p.add_argument("archive")
    p.add_argument("-o", "--output", required=True, help="folder to write into")
    p.add_argument("--format", action="append", choices=_FORMATS, dest="formats",
                   help="ipynb and/or py (repeatable; default both)")
    p = sub.add_parser("check", help="exit 1 unless ARCHIVE equals a fresh build of SRC")
    p.add_argument("src")
    p.add_argument("archive")
    p.add_argument("--folder")
    p.add_argument("--wheel")
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        wheel = (Path(args.wheel).name, Path(args.wheel).read_bytes()) if getattr(args, "wheel", None) else None
        if args.cmd == "build":
            res = build(args.src, args.output, folder=args.folder, wheel=wheel)
            print(f"wrote {res.path}: {len(res.notebooks)} notebooks, sha256 {res.sha256}")
        elif args.cmd == "extract":
            for path in extract(args.archive, args.output, formats=tuple(args.formats or _FORMATS)):
                print(path)
        else:
            if not is_fresh(args.src, args.archive, folder=args.folder, wheel=wheel):
                print(f"{args.archive} is stale: rebuild with "
                      f"`python -m tools.dbc build {args.src} -o {args.archive}`", file=sys.stderr)
                return 1
            print(f"{args.archive} is up to date")
    except (TfnbError, OSError) as e:
        print(f"tools.dbc: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
