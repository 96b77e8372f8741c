"""The catalogue of bad inputs tfnb refuses: one clear error naming the offending value and the fix, fast.

The cases live in ``tests/test_refuse_<area>.py``, one file per area; this module is what they share.
Every case is a call a user could make, registered with :func:`case` (or, for cases that differ only in
the keyword arguments of one call, as rows of :func:`table`). Each file's ``TestRefusals``
(a :class:`Refusals`) runs the file's cases: it asserts the error type (or, for TensorBoard, the
``Failed`` outcome it returns), that the message's first line names the offending value and the fix in at
most :data:`FIRST_LINE` characters (the detail below it), and records how long the refusal took; the file's
table of times is printed after its cases.

Any file runs alone, in any order, in any pytest-xdist worker: a case with ``spark=True`` uses the test
process's shared local[2] session (conftest.spark_session), and a case that needs a session of another
configuration, or stops one, declares ``own_session=``: conftest.spark_session restarts the shared session with
that configuration in the same JVM for it (a new Python and JVM cost seconds more), and the next case or test
that asks for the shared one gets it back, restarted if the case stopped it.

The catalogue writes docs/refusals.md; from the repository root::

    python tests/refusals.py

(tests/test_refuse_catalogue.py fails while the file differs from what this writes.)
"""
from __future__ import annotations

import functools
import importlib
import inspect
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

TESTS = Path(__file__).resolve().parent
DOC = TESTS.parent / "docs" / "refusals.md"
if __name__ == "__main__":  # run as a script: find tfnb in this checkout
    sys.path.insert(0, str(TESTS.parent))
from tfnb import WorkerError  # noqa: E402
from tfnb.monitor.tensorboard import Failed  # noqa: E402

AREAS = ["launcher", "cluster", "data", "staging", "sync", "evaluator", "tensorboard", "progress", "dbc", "compat",
         "predict", "sweep"]


@dataclass
class Case:
    name: str
    area: str
    given: str          # the bad input, as docs/refusals.md shows it
    raises: type        # error type (or Failed, TensorBoard's outcome)
    needles: tuple      # substrings the message's first line holds: the offending value, then the fix (a
                        # Detail may be anywhere in the message)
    says: str           # the fix, in short, for docs/refusals.md
    fn: Callable
    spark: bool = False
    xfail: str | None = None
    own_session: dict | None = None  # Spark conf of a session of the case's own (which it may stop)


CASES: dict[str, Case] = {}  # by name, from every test_refuse_*.py imported so far


class Detail(str):
    """A needle the message holds below its first line (a cause's own words, a path to look at)."""


def case(area: str, given: str, raises: type, *needles: str, says: str, spark: bool = False,
         xfail: str | None = None, own_session: dict | None = None):
    def register(fn):
        if fn.__name__ in CASES:
            raise ValueError(f"two refusal cases named {fn.__name__!r}: rename one")
        CASES[fn.__name__] = Case(fn.__name__, area, given, raises, needles, says, fn, spark or own_session is not None,
                                  xfail, own_session)
        return fn
    return register


class Env:
    """What a case gets: a scratch folder, environment patching, and a Spark session on demand (the
    shared local[2] one, or the one its ``own_session`` conf describes)."""

    def __init__(self, tmp: Path, monkeypatch, conf: dict | None = None):
        self.tmp = tmp
        self.monkeypatch = monkeypatch
        self.conf = conf or {}

    @property
    def spark(self):
        from conftest import spark_session

        return spark_session("local[2]", **self.conf)

    def setenv(self, name: str, value: str) -> None:
        self.monkeypatch.setenv(name, value)


def table(area: str, raises: type, call: Callable, rows: list[tuple], **options) -> None:
    """A case per row ``(name, kwargs, given, needles, says)``, in row order: ``call(env, **kwargs)``, with
    :func:`case`'s ``options``. For cases that differ only in the keyword arguments of one call."""
    for name, kwargs, given, needles, says in rows:
        fn = functools.partial(call, **kwargs)  # a generator function stays one (inspect sees through partial)
        fn.__name__, fn.__module__ = name, call.__module__
        case(area, given, raises, *needles, says=says, **options)(fn)


def on_stopped_session(env: Env, call: Callable):
    """For a case with ``own_session=``, as ``yield from on_stopped_session(env, call)``: stops the case's
    session (the set-up), then ``call(session)`` is the bad call."""
    session = env.spark
    session.stop()
    yield
    call(session)


def one(ctx):
    return 1


def nothing(args, ctx):
    return None


# ---------------------------------------------------------------- running a file's cases


TIMES: dict[str, float] = {}
MESSAGES: dict[str, str] = {}
# The most a message's first line may hold: what failed and the fix, read at a glance (two rows of a notebook's
# output), with room for the offending value (a path, a session's repr) beside the sentence; the detail goes
# below it. In this catalogue half the first lines are under 115 characters and the longest that read whole
# (a value, the rule, the fix) reach ~190; the ones past 200 carried lists, a cause's own words or a second fix,
# all of which read better below. A case's scratch folder counts as a path of a typical length (USER_PATH), so
# the count does not depend on where pytest puts it (its user's name, popen-gwN/ under pytest-xdist).
FIRST_LINE = 200
USER_PATH = "/dbfs/FileStore/my-project"


def _message(outcome) -> str:
    if isinstance(outcome, Failed):
        return f"{outcome.error}; {outcome.fix}"
    return str(outcome)


class Refusals:
    """Runs the cases of the test file that subclasses it (``class TestRefusals(Refusals)``)."""

    def pytest_generate_tests(self, metafunc):
        cases = [c for c in CASES.values() if c.fn.__module__ == metafunc.module.__name__]
        metafunc.parametrize("c", [pytest.param(c, id=c.name, marks=[pytest.mark.xfail(strict=True, reason=c.xfail)]
                                                if c.xfail else []) for c in cases])

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def time_table(cls, request):
        yield
        module = request.module.__name__
        times = {c.name: TIMES[c.name] for c in CASES.values() if c.fn.__module__ == module and c.name in TIMES}
        if not times:
            return
        lines = ["", f"refusal times, {module} ({len(times)} cases, {sum(times.values()):.2f} s in all)",
                 f"{'area':<12} {'case':<34} {'error':<15} {'seconds':>8}"]
        for name, seconds in times.items():
            c = CASES[name]
            lines.append(f"{c.area:<12} {name:<34} {c.raises.__name__:<15} {seconds:>8.3f}")
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled():
            print("\n".join(lines), flush=True)
        from conftest import ARTIFACTS

        ARTIFACTS.mkdir(exist_ok=True)  # every message in full, for reading them side by side
        (ARTIFACTS / f"refusals-{module.removeprefix('test_refuse_')}.txt").write_text("".join(
            f"{name} ({seconds:.3f} s): {MESSAGES[name]}\n\n" for name, seconds in times.items() if name in MESSAGES))

    def test_refusal(self, c: Case, tmp_path, monkeypatch, capsys):
        for var in ("TFNB_TIMEOUT", "TFNB_MAX_ATTEMPTS", "TFNB_SYNC_INTERVAL", "TFNB_DISPLAY", "TFNB_EVAL_INTERVAL",
                    "TFNB_TENSORBOARD_TIMEOUT"):
            monkeypatch.delenv(var, raising=False)
        env = Env(tmp_path, monkeypatch, c.own_session)
        if c.spark and c.own_session is None:
            env.spark  # start (or reuse) the session outside the timed call
        call = lambda: c.fn(env)  # noqa: E731
        if inspect.isgeneratorfunction(c.fn):
            steps = c.fn(env)
            next(steps)  # the set-up before the bad call is not timed
            call = lambda: next(steps, None)  # noqa: E731
        start = time.perf_counter()
        if c.raises is Failed:
            outcome = call()
            TIMES[c.name] = time.perf_counter() - start
            assert isinstance(outcome, Failed), outcome
            assert c.needles[0] in capsys.readouterr().err  # what the user sees printed
        else:
            with pytest.raises(Exception) as info:
                call()
            TIMES[c.name] = time.perf_counter() - start
            outcome = info.value
            assert isinstance(outcome, c.raises), f"{type(outcome).__name__}: {outcome}"
            # a refusal inside train_fn (tfnb's own, in the train_fn process) comes as a WorkerError: only where
            # the case says so, and never relaunched
            assert c.raises is WorkerError or not isinstance(outcome, (WorkerError, AttributeError)), outcome
            assert not isinstance(outcome, WorkerError) or len(outcome.attempts) == 1, outcome.attempts
        text = _message(outcome)
        MESSAGES[c.name] = text
        first = text.split("\n", 1)[0]
        for needle in c.needles:
            assert needle in (text if isinstance(needle, Detail) else first), \
                f"{needle!r} not in the {'message' if isinstance(needle, Detail) else 'first line'}: {text}"
        size = len(first.replace(str(tmp_path), USER_PATH))
        assert size <= FIRST_LINE, \
            f"the first line has {size} characters (at most {FIRST_LINE}); move the detail below it: {first}"


# ---------------------------------------------------------------- docs/refusals.md


def catalogue() -> list[Case]:
    """Every case, from every tests/test_refuse_*.py (imported here if pytest has not yet)."""
    for path in sorted(TESTS.glob("test_refuse_*.py")):
        importlib.import_module(path.stem)
    return list(CASES.values())


def document() -> str:
    """docs/refusals.md: the catalogue as tables, one per area."""
    cases = catalogue()
    out = ["# Errors and their fixes", "", textwrap.fill(
           "When a call cannot work, tfnb stops with one error before anything is launched (where the driver can "
           "tell), and its first line names the value at fault and how to fix it (at most "
           f"{FIRST_LINE} characters; details follow on the next lines). The tables below list each such input, the "
           "error it gets and what the error says to do; each row is checked by a test (`tests/test_refuse_<area>.py`). "
           "An error raised by your train_fn arrives as `WorkerError`, with the worker's traceback. This page is "
           "written by `python tests/refusals.py`; edit the tests, not the page.", 110)]
    for area in AREAS:
        rows = [c for c in cases if c.area == area]
        out += ["", f"## {area}", "", "| Input | Error | What it says to do |", "|---|---|---|"]
        for c in rows:
            error = "returns `Failed`" if c.raises is Failed else f"`{c.raises.__name__}`"
            out.append(f"| {c.given} | {error} | {c.says} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    import refusals  # the module the test files register with (this script runs as __main__)

    refusals.DOC.write_text(refusals.document())
    print(f"wrote {refusals.DOC} ({len(refusals.CASES)} cases)")
