"""``tfnb.sweep``: Optuna's ask-and-tell loop on the caller's thread, each trial a ``tfnb.run`` on a thread of its own.
Not ``study.optimize(n_jobs=...)``: it joins the running trials before a Ctrl-C reaches the caller (measured: a SIGINT
at 0.5 s reached it at 5.06 s, when both 5 s trials had finished), so Ctrl-C could not cancel them."""
from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import re
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping

from .._deps import require
from .._protocol import EventKind, RunEvent, number
from ..errors import (ClusterError, ConfigError, MissingDependencyError, RunCancelledError, RunTimeoutError,
                      WorkerError, below, suggest, summary)
from ..launcher import LaunchHooks, RunOptions, check_cluster, get_spark, is_connect, pickle_fn
from ..launcher import run as tfnb_run
from ..launcher.options import SETTING_ONLY
from ..monitor.display import check_display, make_display
from ..monitor.tracking import check_option, logging_to
from .outcomes import KEPT, SweepCancelledError, SweepResult, SweepStoppedError, TrialResult, better
from .space import distributions, make_study, sample, warn_clustered
from .tracking import SweepTracker

log = logging.getLogger(__name__)


def _check(n_trials: Any, same_error_limit: Any, at_once: Any, metric: Any) -> None:
    for name, value, rule in (("n_trials", n_trials, "trials to run in this call, e.g. n_trials=20"),
                              ("same_error_limit", same_error_limit,
                               "failed trials in a row with the same error that stop the sweep (default 3)"),
                              ("at_once", at_once, "trials at most at once, or None for as many as fit")):
        fine = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        if not fine and not (name == "at_once" and value is None):
            raise ConfigError(f"{name}={value!r} must be an int >= 1: {rule}")
    if not isinstance(metric, str) or not metric:
        raise ConfigError(f"metric={metric!r} must name the objective, e.g. metric='val_accuracy' (what train_fn "
                          "returns in a dict, or ctx.progress_callback() reports each epoch)")


def _options(num_workers: int, args: tuple, kwargs: Any, spark, run_options: dict) -> RunOptions:
    """tfnb.run's options for every trial, resolved and checked once."""
    known = {f.name for f in fields(RunOptions)} - {"args", "display", "model_dir", "log_dir", "mlflow",  # per trial
                                                    *SETTING_ONLY, "settings"}
    unknown = sorted(set(run_options) - known)
    if unknown:
        raise ConfigError(f"tfnb.sweep got unknown option(s) {', '.join(unknown)}{suggest(unknown, known)}; besides "
                          f"its own it takes tfnb.run's options for every trial, below\n{', '.join(sorted(known))}")
    return RunOptions.resolve(num_workers=num_workers, args=args, kwargs=kwargs, spark=spark, **run_options)


def fit(spark, options: RunOptions, n_trials: int, at_once: int | None) -> int:
    """How many trials run at once: as many as the cluster's task slots hold (tfnb.run's own slot check for 1, 2, ...
    trials' tasks together), at most ``at_once`` and ``n_trials``."""
    w, ps = options.num_workers, options.num_ps
    ask = dict(use_gpu=options.use_gpu, gpus_per_worker=options.gpus_per_worker,
               cpus_per_worker=options.cpus_per_worker, ps_placement=options.ps_placement)
    master = str(spark.conf.get("spark.master", "") or "")
    connect = is_connect(spark) and not master.startswith("local") and at_once is None
    if connect:
        log.info("tfnb.sweep: a Spark Connect client cannot count a cluster's task slots; running one trial at a "
                 "time (pass at_once= to run more)")
    fits, want = 0, 1 if connect else min(n_trials, at_once or n_trials)
    for k in range(1, want + 1):
        try:  # the first check waits for executors still starting; the others only count slots
            check_cluster(spark, k * (w + ps), wait=None if k == 1 else 0, num_ps=k * ps, **ask)
        except ClusterError as e:
            if k > 1:
                break
            raise ClusterError(f"one trial (num_workers={w}{f', num_ps={ps}' if ps else ''} per trial) does not fit: "
                               f"{summary(e)}{below(e)}") from e
        fits = k
    if at_once is not None and fits < want:
        raise ClusterError(f"at_once={at_once} trials of {w + ps} task slot(s) each do not fit: the cluster ({master}) "
                           f"holds {fits} at once; lower at_once, or leave it out to run as many as fit")
    return fits


# a frame of a Python traceback: file, function, and the source line below it (when the file was readable)
_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line \d+, in (?P<func>\S+)\n(?:    (?P<code>.*)\n)?', re.M)
# frames that are not the user's code: installed packages, the standard library, frozen modules (and tfnb itself)
_LIBRARY = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python\d[\d.]*[/\\]|^<frozen ")


def _error_key(error: BaseException) -> tuple:
    """What makes two trials' errors "the same", as error trackers group them: the exception's type and the innermost
    frame of the user's code; without one, the type and the first line with its numbers masked."""
    if isinstance(error, WorkerError):
        kind, message, traceback = error.exc_type, error.failure.message, error.failure.traceback or ""
    else:
        kind, message, traceback = type(error).__name__, str(error), ""
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tfnb's folder here
    frames = [m for m in _FRAME.finditer(traceback)
              if not _LIBRARY.search(m["file"]) and not m["file"].startswith(own + os.sep)]
    if frames:
        return kind, os.path.basename(frames[-1]["file"]), frames[-1]["func"], (frames[-1]["code"] or "").strip()
    first = (message.strip().splitlines() or [""])[0][:300]
    return kind, re.sub(r"\d+(\.\d+)?", "N", first)


@dataclass
class _Sweep:
    """One call of ``tfnb.sweep``: what its trials share (:class:`Trial` reads it), and the loop."""

    train_fn: Callable
    options: RunOptions  # tfnb.run's, resolved once; each trial adds its own args, dirs and display
    study: Any
    space: Any
    metric: str
    direction: str
    model_dir: str | None
    log_dir: str | None
    tracker: Any  # the MLflow parent run (.tracking.SweepTracker), or None
    display: Any
    n_trials: int
    at_once: int
    same_error_limit: int
    q: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)  # from the trials' threads: RunEvents, ended Trials
    trials: dict[int, Trial] = field(default_factory=dict)  # every trial launched
    running: dict[int, Trial] = field(default_factory=dict)  # those whose end the loop has not handled yet
    stopped: str | None = None  # why no further trial starts, as the cancelled trials' rows say it
    error: BaseException | None = None  # the error the sweep stops with
    streak: list[tuple[int, tuple]] = field(default_factory=list)  # (number, error key) of the latest failures in a row
    started: float = field(default_factory=time.time)

    def run(self, begin: dict) -> SweepResult:
        try:
            self.display(RunEvent(EventKind.BEGIN, "sweep", 0, begin))
            while True:
                while self.stopped is None and len(self.trials) < self.n_trials and len(self.running) < self.at_once:
                    self._launch()
                if not self.running:
                    break
                self._handle(self._next())
        except KeyboardInterrupt:
            self._stop("the sweep was interrupted")
            self._wait_quietly()
            result = self._finish("interrupted")
            raise SweepCancelledError(f"tfnb.sweep was interrupted: {self._told(result)}; the study keeps them: pass "
                                      "the same study= to go on", result) from None
        except BaseException as e:  # a bug of the loop itself: no trial may outlive it
            self._stop(f"the sweep failed ({type(e).__name__})", e)
            self._wait_quietly()
            self._finish("stopped")
            raise
        if self.error is None:
            return self._finish("finished")
        result = self._finish("stopped")
        if len(self.streak) < self.same_error_limit:  # a trial could not start, or the space failed: its error says
            raise self.error
        raise SweepStoppedError(
            f"tfnb.sweep stopped: trials {', '.join(str(n) for n, _ in self.streak)} failed in a row with the same "
            "error, a bug in train_fn rather than a bad hyperparameter; fix it, then call tfnb.sweep again with the "
            f"same study= to go on\nThe error: {summary(self.error, 400)}\n{self._told(result)}.\n\nThe last failed "
            f"trial's error:\n{self.error}", result) from self.error

    def _launch(self) -> None:
        try:
            trial, params = sample(self.study, self.space)
        except ConfigError as e:  # the space function raised or returned no dict: every trial would
            self._stop("the search space failed", e)
            return
        started = self.running[trial.number] = self.trials[trial.number] = Trial(self, trial, params)
        threading.Thread(target=started.run, name=f"tfnb-trial-{trial.number}", daemon=True).start()

    def _next(self) -> RunEvent | Trial:
        while True:
            with contextlib.suppress(queue.Empty):
                return self.q.get(timeout=0.5)  # a timeout keeps Ctrl-C reaching this thread

    def _handle(self, item: RunEvent | Trial) -> None:
        if isinstance(item, RunEvent):
            self.display(item)
        else:
            self._ended(item)

    def _ended(self, ended: Trial) -> None:
        """Tell the study, end the trial's MLflow child run, show it, then judge it."""
        import optuna

        states, row = optuna.trial.TrialState, ended.row
        self.running.pop(row.number, None)
        with contextlib.suppress(Exception):  # the study's storage failing must not lose the other trials
            for key in KEPT:
                if getattr(row, key) is not None:
                    ended.trial.set_user_attr(f"tfnb.{key}", getattr(row, key))
        state = {"complete": states.COMPLETE, "pruned": states.PRUNED}.get(row.state, states.FAIL)
        try:
            self.study.tell(ended.trial, row.value if state == states.COMPLETE else None, state=state)
        except Exception as e:  # noqa: BLE001 - the row is kept; the study says why it is missing there
            log.warning("tfnb.sweep: the study did not take trial %d (%s: %s)", row.number, type(e).__name__, e)
        if self.tracker is not None:
            self.tracker.trial_ended(row, self.metric)
        self.display(RunEvent(EventKind.TRIAL, "trial", row.number, {"trial": row}))
        if ended.verdict == "fatal":
            self._stop(f"trial {row.number} could not start", ended.error)
        elif self.stopped is not None or ended.verdict in ("cancelled", "cluster"):
            return  # "cluster" (the cluster failed a launched trial) says nothing of train_fn: the streak stays
        elif ended.verdict == "bug":
            key = _error_key(ended.error)
            self.streak = [s for s in self.streak if s[1] == key] + [(row.number, key)]
            if len(self.streak) >= self.same_error_limit:
                self._stop("trials in a row failed with the same error", ended.error)
        else:
            self.streak = []  # complete, pruned, or failed: timed out or NaN, which a hyperparameter may well cause

    def _stop(self, why: str, error: BaseException | None = None) -> None:
        """No further trial starts; the running ones are cancelled (their ends still arrive in the queue)."""
        if self.stopped is None:
            self.stopped, self.error = why, error
        if self.running:
            log.info("tfnb.sweep: %s; cancelling trials %s", why, ", ".join(map(str, sorted(self.running))))
        for running in self.running.values():
            running.cancel.set()

    def _wait_quietly(self) -> None:
        """Until every running trial has ended; a second Ctrl-C, or the display failing, must not cut it short."""
        while self.running:
            item = None
            with contextlib.suppress(BaseException):
                item = self._next()
                self._handle(item)
            if isinstance(item, Trial):
                self.running.pop(item.row.number, None)

    def _finish(self, state: str) -> SweepResult:
        """The result; the MLflow parent run ended as ``state`` (finished, stopped, interrupted), the display closed."""
        best = None
        with contextlib.suppress(Exception):  # no complete trial yet (ValueError), or a storage that cannot say
            frozen = self.study.best_trial
            best = self.trials[frozen.number].row if frozen.number in self.trials else TrialResult.from_optuna(frozen)
        result = SweepResult(trials=tuple(self.trials[n].row for n in sorted(self.trials)), best=best,
                             metric=self.metric, direction=self.direction, study=self.study, stopped=self.stopped,
                             mlflow_run_id=getattr(self.tracker, "run_id", None), seconds=time.time() - self.started)
        try:
            if self.tracker is not None:
                self.tracker.finish(result, state)
            self.display(RunEvent(EventKind.FINISH, "sweep", 0, {"result": result}))
        finally:
            getattr(self.display, "close", lambda: None)()
        return result

    def _told(self, result: SweepResult) -> str:
        cancelled = ", ".join(str(t.number) for t in result.trials if t.state == "cancelled")
        return (f"{result.summary()}; running trials cancelled and their processes stopped: {cancelled or 'none'}; "
                f"{self.n_trials - len(self.trials)} not started. e.result holds the trials")


def subdir(base: str | None, number: int) -> str | None:
    """A trial's own folder under ``base`` (a path or a URL)."""
    return None if not base else f"{str(base).rstrip('/')}/trial-{number}"


class Trial:
    """One trial and its ``tfnb.run``'s display (on the trial's thread; never raises), which hands rows and log lines
    to the sweep's queue, then the trial itself when it ends. ``verdict``: complete, pruned, cancelled, bug (counts
    towards the same-error rule), fatal (no trial can start), cluster (failed by the cluster after launch) or failed."""

    def __init__(self, sweep, trial, params: dict):
        self.sweep, self.trial = sweep, trial  # sweep: the loop's _Sweep, with what every trial shares
        self.row = TrialResult(trial.number, params, model_dir=subdir(sweep.model_dir, trial.number))
        self.cancel = threading.Event()
        self.verdict, self.error = None, None  # how it ended
        self.launched, self.optuna_ok = False, True  # launched: the run sent an event, so it is past tfnb.run's checks

    def run(self) -> None:
        """The trial's thread: its ``tfnb.run`` to the end, then the trial to the sweep's queue."""
        s = self.sweep
        try:
            # its MLflow child run, made here so the sweep's loop never waits on it
            child = s.tracker.child(self.row.number, self.row.params) if s.tracker is not None else None
            self.row = self.row.replace(mlflow_run_id=child)
            self._post(EventKind.TRIAL)
            with logging_to(child, log_model=False) if child else contextlib.nullcontext():
                returned = tfnb_run(s.train_fn, s.options, hooks=LaunchHooks(cancel=self.cancel), display=self,
                                    args=(dict(self.row.params), *s.options.args), model_dir=self.row.model_dir,
                                    log_dir=subdir(s.log_dir, self.row.number),
                                    mlflow=s.tracker.mlflow_option if child else None)
            value, why = objective(returned, s.metric, self.row.value)
            self.row = self.row.replace(returned=returned)
            if why is None:
                self._end("complete", None, value)
            else:  # diverged (NaN): a hyperparameter's doing; no objective at all: train_fn's, in every trial alike
                self._end("failed" if value is not None else "bug", ValueError(why))
        except RunCancelledError as e:
            self._end("pruned" if self.row.state == "pruning" else "cancelled", e)
        except (ConfigError, MissingDependencyError) as e:  # tfnb.run refused the options or the environment
            self._end("fatal", e)
        except ClusterError as e:
            # Refused before it launched (slots, GPUs, a profile), or executors where no task can start (the launcher
            # marks those every_launch): every trial would meet it. Once launched, the cluster failing it is its own.
            self._end("fatal" if not self.launched or getattr(e, "every_launch", False) else "cluster", e)
        except RunTimeoutError as e:
            self._end("failed", e)
        except Exception as e:  # noqa: BLE001 - WorkerError (train_fn raised), or whatever else went wrong
            self._end("bug", e)
        finally:  # the loop waits for this, whatever happened
            if self.verdict is None:
                self._end("failed", RuntimeError("the trial's thread died"))
            s.q.put(self)

    def _end(self, verdict: str, error: BaseException | None, value: float | None = None) -> None:
        """The row's final state; ``value``: a complete trial's objective."""
        row, text = self.row, error and summary(error)
        if verdict == "cancelled":  # only the sweep stopping cancels a trial its pruner did not stop
            text = f"cancelled: {self.sweep.stopped}"
        elif verdict == "pruned":
            value = row.value
            text = "pruned" if value is None else f"pruned at epoch {row.epoch}: {self.sweep.metric}={value:.4g}"
        self.verdict, self.error = verdict, error
        self.row = row.replace(state=verdict if verdict in ("complete", "pruned", "cancelled") else "failed",
                               value=value, error=text, seconds=time.time() - row.started)

    def _post(self, kind: EventKind, **more) -> None:
        self.sweep.q.put(RunEvent(kind, "trial", self.row.number, {"trial": self.row, **more}))

    def __call__(self, event) -> None:
        self.batch((event,))

    def batch(self, events) -> None:
        try:
            self.launched = True
            lines, changed = [], False
            for event in events:
                kind, data = event.kind, event.data or {}
                if kind == EventKind.LOG:
                    if not data.get("partial"):  # carriage-return bars: their last state arrives as a line
                        lines.append(f"[{event.label}] {data.get('line', '')}")
                elif kind == EventKind.PROGRESS and event.job_name == "chief":
                    changed = self._progress(data) or changed
                elif kind == EventKind.STATE and data.get("log_file"):
                    self.row, changed = self.row.replace(log_file=data["log_file"]), True
                elif kind == EventKind.STATE and data.get("state") == "training" and self.row.state == "starting":
                    self.row, changed = self.row.replace(state="running"), True
                elif kind == EventKind.ATTEMPT:
                    lines.append(f"[tfnb] relaunching (attempt {data.get('attempt')}/{data.get('max_attempts')}) "
                                 f"after: {data.get('reason')}")
                elif kind == EventKind.FAILED:
                    lines.append(f"[{event.label}] FAILED {data.get('exc_type')}: {data.get('message')}")
            if lines:
                self._post(EventKind.LINES, lines=tuple(lines))
            if changed:
                self.row = self.row.replace(seconds=time.time() - self.row.started)
                self._post(EventKind.TRIAL)
        except Exception as e:  # noqa: BLE001 - a display error must not end the training
            log.warning("tfnb.sweep: trial %d's display failed (%s: %s)", self.row.number, type(e).__name__, e)

    def _progress(self, data: Mapping) -> bool:
        """Record an epoch-end report of the metric and hand it to Optuna; True when the row changed."""
        if data.get("epochs") and data["epochs"] != self.row.epochs:
            self.row = self.row.replace(epochs=data["epochs"])
        value, epoch = number(data.get(self.sweep.metric)), data.get("epoch")
        if not data.get("epoch_end") or value is None or not isinstance(epoch, int) or epoch in dict(self.row.curve):
            return False  # a relaunch reports the epochs it redoes again: Optuna keeps the first
        best = value if better(value, self.row.best, self.sweep.direction) else self.row.best
        self.row = self.row.replace(epoch=epoch, best=best, value=value, curve=self.row.curve + ((epoch, value),),
                                    state="running" if self.row.state == "starting" else self.row.state)
        if self.optuna_ok and self.row.state != "pruning":
            try:
                self.trial.report(value, epoch)
                if self.trial.should_prune():
                    self.row = self.row.replace(state="pruning")
                    self.cancel.set()  # tfnb.run stops the job and its processes, then raises RunCancelledError
            except Exception as e:  # noqa: BLE001 - the study's storage failing must not end the training
                self.optuna_ok = False
                log.warning("tfnb.sweep: trial %d cannot report to the study (%s: %s); it runs on unpruned",
                            self.row.number, type(e).__name__, e)
        return True


def objective(returned: Any, metric: str, reported: float | None) -> tuple[float | None, str | None]:
    """(the trial's objective, why it cannot be used): a number train_fn returned, ``returned[metric]`` (a list's last
    item), else the chief's last epoch-end report of it; NaN or None with the reason when it diverged or is missing."""
    value = returned.get(metric) if isinstance(returned, Mapping) else returned
    if isinstance(value, (list, tuple)) and value:
        value = value[-1]
    found = reported if number(value) is None else number(value)
    if found is None:
        what = (f"a dict without {metric!r} (keys: {', '.join(map(str, list(returned)[:8]))})"
                if isinstance(returned, Mapping) else type(returned).__name__)
        return None, (f"train_fn returned {what} and the chief reported no {metric!r} at an epoch end; return a "
                      f"number or a dict holding {metric!r} (model.evaluate(..., return_dict=True)), or pass metric= "
                      "one of the metrics ctx.progress_callback() reports")
    if math.isnan(found):
        return found, f"the objective {metric!r} is NaN (diverged)"
    return found, None


def sweep(train_fn: Callable, space: Any, *, n_trials: int, num_workers: int, metric: str = "loss",
          direction: str | None = None, study: Any = None, at_once: int | None = None, args: tuple = (),
          kwargs: dict | None = None, spark=None, model_dir: str | None = None, log_dir: str | None = None,
          mlflow: bool | str | None = None, display: Any = None, same_error_limit: int = 3,
          **run_options: Any) -> SweepResult:
    """Search hyperparameters with Optuna, running ``n_trials`` distributed trainings, as many at once as fit.

    Each trial is one ``tfnb.run`` given its hyperparameters; the chief's epoch-end metrics reach the study as they
    arrive, and a trial its pruner stops is cancelled like a stopped run. Packing, pruning, failures and resuming:
    docs/sweeps.md.

    Args:
        train_fn: ``train_fn(ctx, params, *args, **kwargs)``; ``params`` is a dict of this trial's hyperparameters.
            The objective is what the chief returns: a number, or a dict holding ``metric`` (a list's last item);
            else the chief's last epoch-end report of ``metric``.
        space: a dict of name to a list of choices, a ``(low, high)`` or ``(low, high, "log")`` range or an
            ``optuna.distributions`` object; or a function ``space(trial) -> dict``.
        n_trials: trials to run in this call (a resumed study goes on counting).
        num_workers: chief + worker tasks of each trial.
        metric: the objective's name, also what is reported each epoch for pruning. Default ``"loss"``.
        direction: ``"minimize"`` or ``"maximize"``; default the study's, else minimize.
        study: an ``optuna.Study`` (``optuna.load_study`` to resume); default a new in-memory study (TPE sampler
            with ``constant_liar``, median pruner).
        at_once: trials at most at once (default: as many as fit).
        args: extra positional arguments for train_fn after ``params``; ``kwargs``: keyword arguments.
        spark: the SparkSession; default the active one, or a local one.
        model_dir: each trial gets ``<model_dir>/trial-<number>`` as its ``ctx.model_dir``; ``log_dir`` likewise.
        mlflow: as ``tfnb.run`` takes it: a parent run for the sweep, a child run per trial, the best one's model.
        display: a callable receiving every :class:`tfnb.RunEvent` of the sweep, False for none; default a live panel
            in notebooks, lines on the console elsewhere.
        same_error_limit: failed trials in a row with the same error that stop the sweep (default 3).
        run_options: any other option of ``tfnb.run``, for every trial (``timeout`` is per trial).

    Returns:
        A :class:`SweepResult`: ``trials`` (this call's :class:`TrialResult` s), ``best``, ``study``.

    Raises:
        ConfigError: a bad argument or search space (before anything launches).
        ClusterError: one trial (or ``at_once`` trials) does not fit the cluster, or a trial cannot start.
        SweepStoppedError: the same error ``same_error_limit`` times in a row; ``.result`` has the trials.
        SweepCancelledError: interrupted (a KeyboardInterrupt); ``.result`` has the trials.
        MissingDependencyError: Optuna (``pip install 'tfnb[sweep]'``) or MLflow is missing.

    Example:
        >>> result = tfnb.sweep(train_fn, {"learning_rate": (1e-4, 1e-1, "log"), "units": [32, 64, 128]},
        ...                     n_trials=20, num_workers=1, metric="val_accuracy", direction="maximize")
        >>> result.best.params
        {'learning_rate': 0.0031, 'units': 128}
    """
    if not callable(train_fn):
        raise ConfigError(f"train_fn must be a function taking (ctx, params), got {type(train_fn).__name__}")
    _check(n_trials, same_error_limit, at_once, metric)
    check_display(display, "sweep")
    optuna = require("optuna", "tfnb.sweep")
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep's display says what Optuna's INFO lines would
    try:
        space = distributions(space)
        study = make_study(study, direction, metric)
        options = _options(num_workers, tuple(args), kwargs, spark, run_options)
        pickle_fn(train_fn, ({},) + options.args, options.kwargs)  # an unpicklable train_fn fails here, once
        if mlflow:
            check_option(mlflow)
        spark = get_spark(options.spark, options.num_tasks)
        options = RunOptions.resolve(options, spark=spark)
        direction = study.direction.name.lower()
        at_once = fit(spark, options, n_trials, at_once)
        warn_clustered(study, at_once)
        shown = make_display(display, kind="sweep", n_trials=n_trials, at_once=at_once, metric=metric,
                             direction=direction)
        tracker = SweepTracker(mlflow, study, {
            "metric": metric, "direction": direction, "num_workers": num_workers, "num_ps": options.num_ps,
            "sampler": type(study.sampler).__name__, "pruner": type(study.pruner).__name__}) if mlflow else None
        begin = {"n_trials": n_trials, "at_once": at_once, "metric": metric, "direction": direction,
                 "slots_per_trial": options.num_tasks, "study": study.study_name,
                 "done_before": sum(t.state.is_finished() for t in study.trials),
                 "mlflow_run_id": getattr(tracker, "run_id", None), "master": str(spark.conf.get("spark.master", ""))}
        return _Sweep(train_fn=train_fn, options=options, study=study, space=space, metric=metric, direction=direction,
                      model_dir=model_dir, log_dir=log_dir, tracker=tracker, display=shown, n_trials=n_trials,
                      at_once=at_once, same_error_limit=same_error_limit).run(begin)
    finally:
        optuna.logging.set_verbosity(verbosity)
