"""Refusals of the DBC tools (tools/dbc.py): folders, notebooks, archives."""
from __future__ import annotations

import json
from pathlib import Path

from tfnb import ConfigError
from tfnb.errors import DbcFormatError

from refusals import Refusals, case


def _notebook(path: Path, cells: list[dict], language: str = "python") -> None:
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "cells": cells,
                                "metadata": {"kernelspec": {"language": language, "name": language}}}))


def _code(source: str, outputs: list | None = None) -> dict:
    return {"cell_type": "code", "source": source, "metadata": {}, "outputs": outputs or [],
            "execution_count": None}


@case("dbc", "`dbc.build(<missing folder>, ...)`", ConfigError, "does not exist", "pass the folder",
      says="pass the folder holding the .ipynb files")
def dbc_missing_folder(env):
    from tools import dbc

    dbc.build(env.tmp / "nope", env.tmp / "out.dbc")


@case("dbc", "a folder without notebooks", ConfigError, "no .ipynb notebooks", "pass the folder holding",
      says="pass the folder holding the .ipynb files")
def dbc_empty_folder(env):
    from tools import dbc

    dbc.build(env.tmp, env.tmp / "out.dbc")


@case("dbc", "a notebook saved with outputs", ConfigError, "has outputs", "jupyter nbconvert --clear-output",
      says="clear outputs (jupyter nbconvert --clear-output)")
def dbc_outputs(env):
    from tools import dbc

    _notebook(env.tmp / "a.ipynb", [_code("print(1)", [{"output_type": "stream", "name": "stdout", "text": "1"}])])
    dbc.build(env.tmp, env.tmp / "out.dbc")


@case("dbc", "a notebook holding an AWS key", ConfigError, "looks like", "secret scope",
      says="read credentials from the environment or a secret scope")
def dbc_credential(env):
    from tools import dbc

    _notebook(env.tmp / "a.ipynb", [_code('KEY = "AKIA' + "ABCDEFGHIJKLMNOP" + '"')])
    dbc.build(env.tmp, env.tmp / "out.dbc")


@case("dbc", "`%run ./missing`", ConfigError, "'./missing'", "fix the %run line or add the notebook",
      says="fix the %run line or add the notebook")
def dbc_run_missing(env):
    from tools import dbc

    _notebook(env.tmp / "a.ipynb", [_code("%run ./missing")])
    dbc.build(env.tmp, env.tmp / "out.dbc")


@case("dbc", "`folder='a/b'`", ConfigError, "folder='a/b'", "'tfnb'", says="a plain name such as 'tfnb'")
def dbc_bad_folder(env):
    from tools import dbc

    _notebook(env.tmp / "a.ipynb", [_code("x = 1")])
    dbc.build(env.tmp, env.tmp / "out.dbc", folder="a/b")


@case("dbc", "an `.ipynb` that is not JSON", ConfigError, "a.ipynb is not valid .ipynb JSON", "re-save it in Jupyter",
      says="open and re-save it in Jupyter")
def dbc_not_json(env):
    from tools import dbc

    (env.tmp / "a.ipynb").write_text("{")
    dbc.build(env.tmp, env.tmp / "out.dbc")


@case("dbc", "`dbc.read(<missing archive>)`", ConfigError, "does not exist", "./dev dbc",
      says="build it (./dev dbc)")
def dbc_read_missing(env):
    from tools import dbc

    dbc.read(env.tmp / "nope.dbc")


@case("dbc", "a `.dbc` that is not a zip", DbcFormatError, "not a zip file", "export it again",
      says="export it again, or rebuild it with ./dev dbc")
def dbc_not_zip(env):
    from tools import dbc

    (env.tmp / "x.dbc").write_text("hello")
    dbc.read(env.tmp / "x.dbc")


@case("dbc", "`dbc.extract(..., formats=('pdf',))`", ConfigError, "formats=('pdf',)", "ipynb",
      says="formats from ('ipynb', 'py')")
def dbc_extract_format(env):
    from tools import dbc

    dbc.extract(env.tmp / "x.dbc", env.tmp / "out", formats=("pdf",))


class TestRefusals(Refusals):
    """The cases above."""
