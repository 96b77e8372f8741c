"""``tfnb.sweep``: Optuna's ask-and-tell loop, launching trials as concurrent ``tfnb.run`` calls.

The loop runs on the caller's thread: it asks the study for as many trials as fit the cluster at once,
starts each as a ``tfnb.run`` on a thread of its own (:mod:`.trial`), and as each ends tells the study,
ends its MLflow child run and starts the next in the slots it freed. Spark schedules the barrier jobs; the
sweep only decides how many trials run at once: the cluster's task slots over each trial's tasks, checked
before the first launch with the launcher's own slot check. Every display call happens on this thread.
"""
from __future__ import annotations

import contextlib
import logging
import os
import queue
import re
import threading
import time
from dataclasses import fields
from typing import Any, Callable

from ..errors import ClusterError, ConfigError, WorkerError, below, suggest, summary
from ..launcher import RunOptions, check_cluster, get_spark, pickle_fn
from ..launcher.resources import _is_connect
from .display import check_display, make_sweep_display
from .outcomes import (SweepCancelledError, SweepEvent, SweepEventKind, SweepResult, SweepStoppedError, TrialResult,
                       better)
from .space import concurrent_sampler_note, distributions, make_study, require_optuna, sample
from .trial import Ended, Plan, run_trial, subdir

log = logging.getLogger(__name__)

_TELL = {"complete": "COMPLETE", "pruned": "PRUNED"}  # every other end is Optuna's FAIL
# RunOptions fields the sweep sets itself, per trial
_OWN = frozenset({"args", "display", "model_dir", "log_dir", "mlflow"})


def _check(n_trials: Any, same_error_limit: Any, at_once: Any, metric: Any) -> None:
    for name, value, rule in (("n_trials", n_trials, "trials to run in this call, e.g. n_trials=20"),
                              ("same_error_limit", same_error_limit,
                               "failed trials in a row with the same error that stop the sweep (default 3)"),
                              ("at_once", at_once, "trials at most at once, or None for as many as fit")):
        if value is None and name == "at_once":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value!r} must be an int >= 1: {rule}")
    if not isinstance(metric, str) or not metric:
        raise ConfigError(f"metric={metric!r} must name the objective, e.g. metric='val_accuracy' (what train_fn "
                          "returns in a dict, or ctx.progress_callback() reports each epoch)")


def _options(num_workers: int, args: tuple, kwargs: Any, spark, run_options: dict) -> RunOptions:
    """tfnb.run's options for every trial, resolved and checked once."""
    known = {f.name for f in fields(RunOptions)} - _OWN - {"failure_grace", "warm_idle", "settings"}
    unknown = sorted(set(run_options) - known)
    if unknown:
        raise ConfigError(f"tfnb.sweep got unknown option(s) {', '.join(unknown)}{suggest(unknown, known)}; besides "
                          f"its own it takes tfnb.run's options for every trial, below\n{', '.join(sorted(known))}")
    return RunOptions.resolve(num_workers=num_workers, args=args, kwargs=kwargs, spark=spark, **run_options)


def fit(spark, options: RunOptions, n_trials: int, at_once: int | None) -> int:
    """How many trials run at once: as many as the cluster's task slots hold (tfnb.run's own slot check, for
    1, 2, ... trials' tasks together), at most ``at_once`` and ``n_trials``.

    Raises:
        ClusterError: one trial does not fit, or ``at_once`` trials do not.
    """
    w, ps = options.num_workers, options.num_ps
    ask = dict(use_gpu=options.use_gpu, gpus_per_worker=options.gpus_per_worker,
               cpus_per_worker=options.cpus_per_worker, ps_placement=options.ps_placement)
    try:
        check_cluster(spark, w + ps, num_ps=ps, **ask)
    except ClusterError as e:
        raise ClusterError(f"one trial (num_workers={w}{f', num_ps={ps}' if ps else ''} per trial) does not fit: "
                           f"{summary(e)}{below(e)}") from e
    master = str(spark.conf.get("spark.master", "") or "")
    if _is_connect(spark) and not master.startswith("local") and at_once is None:
        log.info("tfnb.sweep: a Spark Connect client cannot count a cluster's task slots; running one trial at a "
                 "time (pass at_once= to run more)")
        return 1
    fits, want = 1, min(n_trials, at_once or n_trials)
    for k in range(2, want + 1):
        try:
            check_cluster(spark, k * (w + ps), wait=0, num_ps=k * ps, **ask)
        except ClusterError:
            break
        fits = k
    if at_once is not None and fits < want:
        raise ClusterError(f"at_once={at_once} trials of {w + ps} task slot(s) each do not fit: the cluster ({master}) "
                           f"holds {fits} at once; lower at_once, or leave it out to run as many as fit")
    return fits


# a frame of a Python traceback: file, function, and the source line below it (when the file was readable)
_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line \d+, in (?P<func>\S+)\n(?:    (?P<code>.*)\n)?', re.M)
# frames that are not the user's code: installed packages, the standard library, frozen modules, tfnb itself
_LIBRARY = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python\d[\d.]*[/\\]|^<frozen ")


def _user_frame(traceback: str) -> tuple | None:
    """The innermost frame of the user's own code in a worker's traceback: (file, function, source line)."""
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tfnb's folder here
    frames = [m for m in _FRAME.finditer(traceback or "")
              if not _LIBRARY.search(m["file"]) and not m["file"].startswith(own + os.sep)]
    if not frames:
        return None
    last = frames[-1]
    return os.path.basename(last["file"]), last["func"], (last["code"] or "").strip()


def _error_key(error: BaseException) -> tuple:
    """What makes two trials' errors "the same": what they are, not what they say. The exception's type and the
    innermost frame of the user's code that raised it (its file, function and source line, as error trackers group
    by stack frames), so a bug whose message holds data (``index 13 is out of bounds``) is one error in every
    trial; without such a frame, the type and the first line with its numbers masked."""
    if isinstance(error, WorkerError):
        kind, message, frame = error.exc_type, error.failure.message, _user_frame(error.failure.traceback)
    else:
        kind, message, frame = type(error).__name__, str(error), None
    if frame is not None:
        return kind, frame
    first = (message.strip().splitlines() or [""])[0][:300]
    return kind, re.sub(r"\d+(\.\d+)?", "N", first)


class _Sweep:
    """One call of ``tfnb.sweep``: the loop and its bookkeeping."""

    def __init__(self, plan: Plan, study, space, n_trials: int, at_once: int, display, same_error_limit: int,
                 begin: dict):
        self.plan, self.study, self.space, self.n_trials, self.at_once = plan, study, space, n_trials, at_once
        self.display, self.same_error_limit, self.begin = display, same_error_limit, begin
        self.q: queue.SimpleQueue = queue.SimpleQueue()  # from the trials' threads: ("event", e) / ("ended", Ended)
        self.running: dict[int, tuple] = {}  # number -> (optuna trial, thread, cancel event)
        self.rows: dict[int, TrialResult] = {}  # every trial of this call, latest row
        self.launched = 0
        self.stopped: str | None = None  # why no further trial starts: interrupted, same error, fatal, space, failed
        self.stopped_why = ""  # the same, as the cancelled trials' rows say it
        self.error: BaseException | None = None  # the error the sweep stops with
        self.streak: list[tuple[int, tuple]] = []  # (trial, error key) of the latest failures in a row
        self.best: TrialResult | None = None  # the study's best complete trial, earlier sweeps of it included
        with contextlib.suppress(Exception):  # none yet (ValueError), or a storage that cannot say
            self.best = TrialResult.from_optuna(study.best_trial)
        self.started = time.time()

    # ------------------------------------------------------------ the loop

    def run(self) -> SweepResult:
        try:
            self.display(SweepEvent(SweepEventKind.BEGIN, data=self.begin))
            while True:
                while self.stopped is None and self.launched < self.n_trials and len(self.running) < self.at_once:
                    self._launch()
                if not self.running:
                    break
                self._handle(self._next())
        except KeyboardInterrupt:
            self._stop("interrupted", None, "the sweep was interrupted")
            self._wait_quietly()
            result = self._finish("interrupted")
            running = sorted(n for n, r in self.rows.items() if r.state == "cancelled")
            raise SweepCancelledError(
                f"tfnb.sweep was interrupted: {self._done_text(result)}; running trials cancelled and their "
                f"processes stopped: {_numbers(running) or 'none'}; {self.n_trials - self.launched} not started. "
                "e.result holds the trials; the study keeps them: pass the same study= to go on", result) from None
        except BaseException as e:  # a bug of the loop itself: no trial may outlive it
            self._stop("failed", e, f"the sweep failed ({type(e).__name__})")
            self._wait_quietly()
            self._finish("stopped")
            raise
        if self.error is not None:
            result = self._finish("stopped")
            if self.stopped != "same error":  # a trial could not start, or the space failed: its own error says why
                raise self.error
            raise SweepStoppedError(self._stopped_text(result), result) from self.error
        return self._finish("finished")

    def _launch(self) -> None:
        try:
            trial, params = sample(self.study, self.space)
        except ConfigError as e:  # the space function raised or returned no dict: every trial would
            self._stop("space", e, "the search space failed")
            return
        number = trial.number
        row = TrialResult(number, params, model_dir=subdir(self.plan.model_dir, number))
        cancel = threading.Event()
        thread = threading.Thread(target=self._trial, args=(trial, row, cancel), name=f"tfnb-trial-{number}",
                                  daemon=True)
        self.running[number] = (trial, thread, cancel)
        self.rows[number] = row
        self.launched += 1
        thread.start()

    def _trial(self, trial, row: TrialResult, cancel: threading.Event) -> None:
        ended = None
        try:
            ended = run_trial(self.plan, trial, row, cancel, lambda event: self.q.put(("event", event)))
        finally:  # the loop waits for this, whatever happened
            self.q.put(("ended", ended or Ended(row.replace(state="failed", error="the trial's thread died"),
                                               RuntimeError("the trial's thread died"), "failed")))

    def _next(self) -> tuple:
        while True:
            try:
                return self.q.get(timeout=0.5)  # a timeout keeps Ctrl-C reaching this thread
            except queue.Empty:
                continue

    def _handle(self, item: tuple) -> None:
        if item[0] == "event":
            event = item[1]
            if event.trial is not None and not self.rows[event.trial.number].done:
                self.rows[event.trial.number] = event.trial
            self.display(event)
            return
        self._ended(item[1])

    def _ended(self, ended: Ended) -> None:
        import optuna

        row, verdict = ended.row, ended.verdict
        trial = self.running.pop(row.number)[0]
        if verdict == "cancelled":
            row = row.replace(error=f"cancelled: {self.stopped_why}")
        attrs = {"tfnb.state": row.state, "tfnb.seconds": round(row.seconds, 3), "tfnb.error": row.error,
                 "tfnb.model_dir": row.model_dir, "tfnb.log_file": row.log_file,
                 "tfnb.mlflow_run_id": row.mlflow_run_id}
        with contextlib.suppress(Exception):  # the study's storage failing must not lose the other trials
            for key, value in attrs.items():
                if value is not None:
                    trial.set_user_attr(key, value)
        state = getattr(optuna.trial.TrialState, _TELL.get(row.state, "FAIL"))
        try:
            self.study.tell(trial, row.value if state == optuna.trial.TrialState.COMPLETE else None, state=state)
        except Exception as e:  # noqa: BLE001 - the row is kept; the study says why it is missing there
            log.warning("tfnb.sweep: the study did not take trial %d (%s: %s)", row.number, type(e).__name__, e)
        self.rows[row.number] = row
        if row.state == "complete" and better(row.value, self.best.value if self.best else None, self.plan.direction):
            self.best = row
        if self.plan.tracker is not None:
            self.plan.tracker.trial_ended(row, self.best, self.plan.metric)
        self.display(SweepEvent(SweepEventKind.TRIAL, trial=row))
        self._judge(row, ended)

    def _judge(self, row: TrialResult, ended: Ended) -> None:
        """Stop the sweep on a trial that could not start, or on the same error ``same_error_limit`` times in a row."""
        if ended.verdict == "fatal" and self.error is None:
            self._stop("fatal", ended.error, f"trial {row.number} could not start")
        elif ended.verdict == "bug" and self.stopped is None:  # the trials that decided it, not those after
            key = _error_key(ended.error)
            self.streak = [s for s in self.streak if s[1] == key] + [(row.number, key)]
            if len(self.streak) >= self.same_error_limit and self.error is None:
                self._stop("same error", ended.error, "trials in a row failed with the same error")
        elif ended.verdict in ("complete", "pruned", "failed"):
            self.streak = []  # "failed": timed out or NaN, which a hyperparameter may well cause
        # "cluster" (the cluster failed a launched trial) says nothing of train_fn: the streak stays as it is

    def _stop(self, why: str, error: BaseException | None, text: str) -> None:
        """No further trial starts; the running ones are cancelled (their ends still arrive in the queue)."""
        if self.stopped is None:
            self.stopped, self.error, self.stopped_why = why, error, text
        for _, _, cancel in self.running.values():
            cancel.set()
        if why == "same error" and self.running:
            log.info("tfnb.sweep: cancelling trials %s", _numbers(sorted(self.running)))

    def _wait_quietly(self) -> None:
        """Until every running trial has ended; a second Ctrl-C must not cut the cancelling short."""
        while self.running:
            try:
                item = self._next()
            except KeyboardInterrupt:
                continue
            try:
                self._handle(item)
            except BaseException:  # noqa: BLE001 - a display failing, or Ctrl-C again: the trials still stop
                pass
            finally:
                if item[0] == "ended":
                    self.running.pop(item[1].row.number, None)

    # ------------------------------------------------------------ the end

    def _result(self, stopped: str | None) -> SweepResult:
        best = self.best
        with contextlib.suppress(Exception):  # no complete trial yet, or a storage problem: this call's best
            frozen = self.study.best_trial
            best = self.rows.get(frozen.number) or TrialResult.from_optuna(frozen)
        return SweepResult(trials=tuple(self.rows[n] for n in sorted(self.rows)), best=best, metric=self.plan.metric,
                           direction=self.plan.direction, study=self.study,
                           mlflow_run_id=getattr(self.plan.tracker, "run_id", None), stopped=stopped,
                           seconds=time.time() - self.started)

    def _finish(self, state: str) -> SweepResult:
        result = self._result(None if state == "finished" else self.stopped_why)
        try:
            if self.plan.tracker is not None:
                self.plan.tracker.finish(result, state)
            self.display(SweepEvent(SweepEventKind.FINISH, result=result))
        finally:
            close = getattr(self.display, "close", None)
            if close is not None:
                close()
        return result

    def _done_text(self, result: SweepResult) -> str:
        finished = [t for t in result.trials if t.state in ("complete", "pruned", "failed")]
        best = result.best
        counts = ", ".join(f"{result.count(s)} {s}" for s in ("complete", "pruned", "failed"))
        text = f"{len(finished)} trials finished ({counts})"
        if best is not None and best.value is not None:
            text += f", best: trial {best.number} {result.metric}={best.value:.4g}"
        return text

    def _stopped_text(self, result: SweepResult) -> str:
        numbers = _numbers(n for n, _ in self.streak)
        cancelled = _numbers(t.number for t in result.trials if t.state == "cancelled")
        head = (f"tfnb.sweep stopped: trials {numbers} failed in a row with the same error, a bug in train_fn rather "
                "than a bad hyperparameter; fix it, then call tfnb.sweep again with the same study= to go on")
        return (f"{head}\nThe error: {summary(self.error, 400)}\n{self._done_text(result)}; "
                f"cancelled: {cancelled or 'none'}; {self.n_trials - self.launched} not started. e.result holds the "
                f"trials.\n\nThe last failed trial's error:\n{self.error}")


def _numbers(numbers) -> str:
    return ", ".join(map(str, numbers))


def sweep(train_fn: Callable, space: Any, *, n_trials: int, num_workers: int, metric: str = "loss",
          direction: str | None = None, study: Any = None, at_once: int | None = None, args: tuple = (),
          kwargs: dict | None = None, spark=None, model_dir: str | None = None, log_dir: str | None = None,
          mlflow: bool | str | None = None, display: Any = None, same_error_limit: int = 3,
          **run_options: Any) -> SweepResult:
    """Search hyperparameters with Optuna, running ``n_trials`` distributed trainings, many at once.

    Each trial is one ``tfnb.run(train_fn, num_workers=..., ...)`` given its hyperparameters:
    ``train_fn(ctx, params, *args, **kwargs)``. As many trials run at once as the cluster's task slots
    hold (slots // tasks per trial, checked before the first launch; ``at_once`` caps it); as one ends
    or is pruned the next starts in its slots, on the executors' warm standbys. The chief's epoch-end
    metrics (``ctx.progress_callback()``, or ``ctx.report(epoch=..., epoch_end=True, ...)``) reach the
    study as they arrive (``trial.report``), and a trial its pruner stops is cancelled like a stopped
    run: its Spark job and processes end, its slots are free at once.

    A trial whose train_fn raises is recorded as failed and the sweep goes on; ``same_error_limit``
    trials in a row failing with the same error (the same exception type raised from the same line of
    your code, whatever its message says) stop it (SweepStoppedError): that is a bug, not a bad
    hyperparameter. A lost executor is relaunched inside its trial (``max_attempts``); a trial the
    cluster fails after it launched (an elastic trial below ``min_workers``) is recorded as failed and
    the sweep goes on; a trial that cannot start at all stops it with that error. Interrupting the
    cell cancels every running trial and raises SweepCancelledError with what finished.

    Args:
        train_fn: ``train_fn(ctx, params, *args, **kwargs)``; ``params`` is a dict of this trial's
            hyperparameters. The objective is what the chief returns: a number, or a dict holding
            ``metric`` (a list's last item: Keras' ``history.history`` works); else the chief's last
            epoch-end report of ``metric``.
        space: the search space: a dict of name to a list of choices, a ``(low, high)`` range
            (``(low, high, "log")`` for a log scale; ints give integers) or an ``optuna.distributions``
            object; or a function ``space(trial) -> dict`` calling ``trial.suggest_*``.
        n_trials: trials to run in this call (a resumed study goes on counting).
        num_workers: chief + worker tasks of each trial.
        metric: the objective's name, also what is reported each epoch for pruning. Default ``"loss"``.
        direction: ``"minimize"`` or ``"maximize"``; default the study's, else minimize.
        study: an ``optuna.Study`` (its sampler, pruner, storage; ``optuna.load_study`` to resume in a
            later cell, MLflow included). Default: a new in-memory study with Optuna's TPE sampler (with
            ``constant_liar``, so trials that run at once get different suggestions) and median pruner.
        at_once: trials at most at once (default: as many as fit).
        args: extra positional arguments for train_fn after ``params``; ``kwargs``: keyword arguments.
        spark: the SparkSession; default the active one, or a local one.
        model_dir: each trial gets ``<model_dir>/trial-<number>`` as its ``ctx.model_dir``; ``log_dir``
            likewise (TensorBoard then compares the trials).
        mlflow: True, an experiment name, or a dict as ``tfnb.run`` takes it: one MLflow parent run for the
            sweep, a child run per trial (params, per-epoch metrics, state, duration), the best trial tagged and
            its model logged (registered when the dict names ``registered_model_name``)
            (see :mod:`tfnb.tuning.tracking`). Needs ``pip install 'tfnb[mlflow]'``.
        display: a callable receiving every ``SweepEvent``, False for none; default a live panel (a
            table of trials and a chart of the objective) in notebooks, lines on the console elsewhere.
        same_error_limit: failed trials in a row with the same error that stop the sweep (default 3).
        run_options: any other option of ``tfnb.run``, for every trial: ``timeout`` (per trial),
            ``max_attempts``, ``env``, ``preimport``, ``warm``, ``gpus_per_worker``, ``data``...

    Returns:
        A :class:`SweepResult`: ``trials`` (this call's :class:`TrialResult` s), ``best``, ``study``.

    Raises:
        ConfigError: a bad argument or search space (before anything launches).
        ClusterError: one trial (or ``at_once`` trials) does not fit the cluster, or a trial cannot start
            (the executors cannot run its tasks).
        SweepStoppedError: the same error ``same_error_limit`` times in a row; ``.result`` has the trials.
        SweepCancelledError: interrupted (a KeyboardInterrupt); ``.result`` has the trials.
        MissingDependencyError: Optuna (``pip install 'tfnb[sweep]'``) or MLflow is missing.

    Example:
        >>> def train_fn(ctx, params):
        ...     import tensorflow as tf
        ...     model = build_model(params["units"], params["learning_rate"])
        ...     history = model.fit(make_dataset(ctx), epochs=5, validation_data=val,
        ...                         callbacks=[ctx.progress_callback()])
        ...     return history.history
        >>> result = tfnb.sweep(train_fn, {"learning_rate": (1e-4, 1e-1, "log"), "units": [32, 64, 128]},
        ...                     n_trials=20, num_workers=1, metric="val_accuracy", direction="maximize",
        ...                     model_dir="/Volumes/main/default/tfnb/sweep", mlflow="digits-sweep")
        >>> result.best.params
        {'learning_rate': 0.0031, 'units': 128}
    """
    if not callable(train_fn):
        raise ConfigError(f"train_fn must be a function taking (ctx, params), got {type(train_fn).__name__}")
    _check(n_trials, same_error_limit, at_once, metric)
    check_display(display)
    optuna = require_optuna()
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep's display says what Optuna's INFO lines would
    try:
        space = distributions(space)
        study = make_study(study, direction, metric)
        options = _options(num_workers, tuple(args), kwargs, spark, run_options)
        pickle_fn(train_fn, ({},) + options.args, options.kwargs)  # an unpicklable train_fn fails here, once
        if mlflow:
            from ..monitor.tracking import check_option

            check_option(mlflow)
        spark = get_spark(options.spark, options.num_tasks)
        options = RunOptions.resolve(options, spark=spark)
        direction = study.direction.name.lower()
        at_once = fit(spark, options, n_trials, at_once)
        note = concurrent_sampler_note(study, at_once)
        if note:
            log.warning("tfnb.sweep: %s", note)
        shown = make_sweep_display(display, n_trials=n_trials, at_once=at_once, metric=metric, direction=direction)
        tracker = None
        if mlflow:
            from .tracking import SweepTracker

            tracker = SweepTracker(mlflow, study, {
                "metric": metric, "direction": direction, "num_workers": num_workers, "num_ps": options.num_ps,
                "sampler": type(study.sampler).__name__, "pruner": type(study.pruner).__name__})
        plan = Plan(train_fn, options, metric, direction, model_dir, log_dir, tracker)
        begin = {"n_trials": n_trials, "at_once": at_once, "metric": metric, "direction": direction,
                 "slots_per_trial": options.num_tasks, "study": study.study_name,
                 "done_before": sum(t.state.is_finished() for t in study.trials),
                 "mlflow_run_id": getattr(tracker, "run_id", None), "master": str(spark.conf.get("spark.master", ""))}
        return _Sweep(plan, study, space, n_trials, at_once, shown, same_error_limit, begin).run()
    finally:
        optuna.logging.set_verbosity(verbosity)
