"""Driver-side evaluator: evaluate each new complete checkpoint (:mod:`.checkpoints`) exactly once (:mod:`.eval_model`)
until ``model_dir/tfnb_status.json`` holds a final state (docs/monitoring.md)."""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .._config import setting
from .._status import FINAL_STATES, read_status
from ..storage import open_store
from ..errors import ConfigError, EvaluatorError, StorageError
from .checkpoints import Candidate, Checkpoints, Torn
from .eval_model import EvalModel, _Fatal, _fatal_on_error, _Mismatch
from .._config import check_seconds
from .sync import Background, location
from .tracking import EvalTracker, check_option

log = logging.getLogger(__name__)

STEP_RULES = ("epoch", "name", "iterations")
EXPORT_FORMATS = ("savedmodel", "keras")
_STATUS_ATTEMPTS = 5   # polls in a row that fail to read the status file before the evaluator stops


@dataclass(frozen=True)
class EvalResult:
    """One evaluated checkpoint.

    Attributes:
        step: training step/epoch the metrics were written at (see ``step=``).
        checkpoint: the checkpoint prefix (without ``.index``) or its ``.weights.h5``/``.keras`` file.
        metrics: metric name -> value, as ``model.evaluate(return_dict=True)`` names them.
        seconds: time spent restoring and evaluating.
        started_at: ``time.time()`` the evaluation started.
        found_at: ``time.time()`` the evaluator first saw the checkpoint complete.
        best: True when this checkpoint was the best so far (and was exported).
    """

    step: int
    checkpoint: str
    metrics: Mapping[str, float]
    seconds: float
    started_at: float
    found_at: float
    best: bool = False


@dataclass(frozen=True)
class SkippedCheckpoint:
    """A checkpoint the evaluator gave up on (corrupt, deleted, incomplete at the end of training)."""

    checkpoint: str
    reason: str
    at: float


class Evaluator(Background):
    """Evaluates every new checkpoint in ``checkpoint_dir`` and logs the metrics for TensorBoard
    (docs/monitoring.md, "Evaluating checkpoints while training").

    Args:
        model_fn: ``model_fn()`` -> a Keras model (``tf.keras``, i.e. tf-keras as in ``tfnb.run``, or Keras 3)
            with the training architecture, compiled with the loss/metrics to evaluate (or pass ``metrics=``).
            Called in the evaluator's thread (twice for a tf-keras model reading ``.weights.h5``/``.keras``).
        dataset_fn: ``dataset_fn()`` -> the finite validation data: a ``tf.data.Dataset`` of (x, y) batches
            or an ``(x, y)`` tuple of arrays. Called once.
        checkpoint_dir: where training writes checkpoints (local path, ``/dbfs/...``, ``s3://...``, URL).
        log_dir: TensorBoard directory (path or URL); scalars go to ``log_dir/eval``.
        metrics: Keras metrics to compile the model with, keeping its loss; None: what ``model_fn`` compiled.
        interval: seconds between polls (default 10; env TFNB_EVAL_INTERVAL).
        model_dir: where ``tfnb_status.json`` tells that training ended (default ``checkpoint_dir``).
        best_metric: metric that picks the best checkpoint (default "loss"); None: no best tracking.
        mode: "min", "max" or "auto" (min for names with "loss" or "error", else max).
        export_dir: where the best model goes (default ``log_dir``): ``best`` (SavedModel) or ``best.keras``,
            and ``best.json`` naming its step and metrics.
        export_format: "savedmodel", "keras", or None to track the best without exporting.
        step: the step metrics are written at: "epoch" (the number in the checkpoint's name minus one, as Keras'
            TensorBoard callback counts), "name" (that number), "iterations" (the step saved in the checkpoint)
            or ``fn(checkpoint) -> int``.
        tag_prefix: prefix of the scalar names (default "epoch_", as Keras' TensorBoard callback).
        timeout: seconds before it stops even if training goes on (default none; env TFNB_EVAL_TIMEOUT); else it
            stops once ``tfnb_status.json`` says training ended (an earlier run's final state too: start it on a
            fresh ``model_dir`` or once ``tfnb.run`` started) and the last checkpoint is done.
        max_retries: failed loads of an unchanged checkpoint before it counts as corrupt (default 3).
        storage_options: options for remote directories (see :class:`tfnb.EventSync`).
        mlflow: True or an experiment name: log ``eval_<metric>`` per checkpoint and the best model to MLflow,
            in the run ``tfnb.run(mlflow=...)`` uses.

    Raises:
        ConfigError: a bad argument (message names the fix).

    Example:
        >>> ev = tfnb.Evaluator(model_fn, lambda: val_ds, "/dbfs/runs/1/model", "/tmp/tb/run1",
        ...                     best_metric="accuracy").start()
        >>> ev.join(); ev.best.metrics, ev.history_frame()
    """

    def __init__(self, model_fn: Callable[[], Any], dataset_fn: Callable[[], Any],
                 checkpoint_dir: str | os.PathLike, log_dir: str | os.PathLike, *,
                 metrics: Sequence[Any] | None = None, interval: float | None = None,
                 model_dir: str | os.PathLike | None = None, best_metric: str | None = "loss",
                 mode: str = "auto", export_dir: str | os.PathLike | None = None,
                 export_format: str | None = "savedmodel", step: str | Callable[[str], int] = "epoch",
                 tag_prefix: str = "epoch_", timeout: float | None = None, max_retries: int = 3,
                 storage_options: Mapping[str, Any] | None = None, mlflow: bool | str | None = None):
        for bad, message in (
            (not callable(model_fn), f"model_fn must be a function returning a Keras model, got {model_fn!r}"),
            (not callable(dataset_fn), f"dataset_fn must be a function returning the validation data, got "
                                       f"{dataset_fn!r}; wrap a dataset as dataset_fn=lambda: val_ds"),
            (mode not in ("auto", "min", "max"), f"mode={mode!r} must be 'min', 'max' or 'auto'"),
            (export_format not in EXPORT_FORMATS + (None,),
             f"export_format={export_format!r} must be one of {EXPORT_FORMATS} or None"),
            (not (callable(step) or step in STEP_RULES),
             f"step={step!r} must be one of {STEP_RULES} or a function(checkpoint) -> int"),
            (not isinstance(max_retries, int) or max_retries < 1, f"max_retries={max_retries!r} must be an int >= 1"),
            (metrics is not None and (isinstance(metrics, (str, bytes)) or not isinstance(metrics, Sequence)),
             f"metrics={metrics!r} must be a list, e.g. metrics=['accuracy']"),
            (best_metric is not None and not isinstance(best_metric, str),
             f"best_metric={best_metric!r} must be a metric name such as 'loss', or None")):
            if bad:
                raise ConfigError(message)
        self.model_fn, self.dataset_fn = model_fn, dataset_fn
        self.checkpoint_dir = location("checkpoint_dir", checkpoint_dir, "the model_dir given to tfnb.run")
        self.log_dir = location("log_dir", log_dir, "the model_dir given to tfnb.run")
        self.model_dir = os.fspath(model_dir) if model_dir is not None else self.checkpoint_dir
        self.export_dir = os.fspath(export_dir) if export_dir is not None else self.log_dir
        self.metrics = list(metrics) if metrics is not None else None
        self.interval = check_seconds("interval", setting("eval_interval", interval, 10.0, float),
                                      "a number of seconds > 0, e.g. interval=10")
        self.timeout = check_seconds("timeout", setting("eval_timeout", timeout, None, float),
                                     "seconds > 0, or None to wait for training to end", optional=True)
        self.best_metric, self.export_format, self.step_rule = best_metric, export_format, step
        self.mode = mode if mode != "auto" else (
            "min" if best_metric and ("loss" in best_metric or "error" in best_metric) else "max")
        self.tag_prefix, self.max_retries = tag_prefix, max_retries
        self._options = dict(storage_options or {})
        self._ckpt_store = open_store(self.checkpoint_dir, self._options, purpose="reading checkpoints from")
        self._status_store = open_store(self.model_dir, self._options, purpose="reading the run status in")
        self._status_failures = 0
        self._mlflow = EvalTracker(mlflow, self._status_store) if check_option(mlflow) else None
        self._history: list[EvalResult] = []
        self._skipped: list[SkippedCheckpoint] = []
        self._checkpoints = Checkpoints(self._ckpt_store, max_retries)
        self._tf = EvalModel(model_fn, dataset_fn, self.metrics, tag_prefix)
        self._best: EvalResult | None = None
        self._error: EvaluatorError | None = None
        self._stop = threading.Event()
        self.state = "new"

    @property
    def history(self) -> tuple[EvalResult, ...]:
        """Evaluated checkpoints, in evaluation order."""
        return tuple(self._history)

    @property
    def skipped(self) -> tuple[SkippedCheckpoint, ...]:
        """Checkpoints given up on (corrupt, deleted before evaluation, never completed)."""
        return tuple(self._skipped)

    @property
    def best(self) -> EvalResult | None:
        """The best result by ``best_metric`` so far (None before the first, or without best_metric)."""
        return self._best

    @property
    def error(self) -> BaseException | None:
        """The error that ended the loop, if any (also raised by stop/join/run)."""
        return self._error

    def history_frame(self):
        """History as a pandas DataFrame: one row per checkpoint, a column per metric."""
        import pandas as pd

        rows = [{"step": r.step, **dict(r.metrics), "checkpoint": r.checkpoint, "seconds": r.seconds,
                 "started_at": pd.Timestamp(r.started_at, unit="s"), "best": r.best} for r in self._history]
        return pd.DataFrame(rows, columns=None if rows else ["step", "checkpoint", "seconds", "started_at", "best"])

    def plot(self, training: Mapping[str, Sequence[float]] | None = None, metrics: Sequence[str] | None = None):
        """Evaluation metrics by epoch against the training curve: a matplotlib Figure.

        Args:
            training: metric name -> one value per epoch (Keras ``History.history``). Default: the ``train``
                scalars Keras' TensorBoard callback wrote under a local ``log_dir``, if any. Drawn for
                ``step="epoch"`` only.
            metrics: the metrics to draw (default: every evaluated one).

        Returns:
            A ``matplotlib.figure.Figure``, one panel per metric; a notebook shows it as an image.

        Raises:
            ConfigError: matplotlib is not installed (``pip install matplotlib``).
        """
        from .charts import INSTALL_HINT, matplotlib_missing, metrics_figure

        if matplotlib_missing():
            raise ConfigError(f"Evaluator.plot() draws with matplotlib, which is not installed: {INSTALL_HINT}")
        by_epoch = self.step_rule == "epoch"
        names = list(metrics) if metrics is not None else list(dict.fromkeys(
            k for r in self._history for k in r.metrics))
        # step="epoch" stores the 0-based epoch (Keras' TensorBoard convention); the chart counts from 1
        evaluated = {n: [(r.step + 1 if by_epoch else r.step, float(r.metrics[n]))
                         for r in self._history if n in r.metrics] for n in names}
        trained = {} if not by_epoch else self._training_scalars() if training is None else {
            n: [(i + 1, float(v)) for i, v in enumerate(training.get(n) or ())] for n in names}
        return metrics_figure(evaluated, trained, unit="epoch" if by_epoch else "step",
                              title=f"evaluation of {len(self._history)} checkpoints vs training")

    def _training_scalars(self) -> dict:
        """metric -> [(epoch, value)] from the ``train`` scalars of Keras' TensorBoard callback, if any."""
        folder = os.path.join(self.log_dir, "train")
        if "://" in self.log_dir or not os.path.isdir(folder):
            return {}
        try:
            from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator
            from tensorboard.util.tensor_util import make_ndarray
        except ImportError:
            return {}
        acc = EventAccumulator(folder, size_guidance={TENSORS: 0})
        acc.Reload()
        return {tag[len(self.tag_prefix):]: [(e.step + 1, float(make_ndarray(e.tensor_proto)))
                                             for e in acc.Tensors(tag)]
                for tag in acc.Tags().get(TENSORS, []) if tag.startswith(self.tag_prefix)}

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the background evaluator to finish.

        Args:
            timeout: seconds to wait at most (None: until it ends).

        Returns:
            True when it has ended, False when ``timeout`` passed first.

        Raises:
            EvaluatorError: model_fn, dataset_fn or evaluation failed (the cause is chained).
        """
        if not self._join(timeout):
            return False
        if self._error is not None:
            raise self._error
        return True

    def stop(self) -> None:
        """Stop after the evaluation in progress (if any) and wait for the thread.

        Raises:
            EvaluatorError: the loop had failed (the cause is chained).
        """
        self._stop.set()
        self.join()

    def run(self, until_done: bool = True) -> tuple[EvalResult, ...]:
        """Evaluate in the calling thread.

        Args:
            until_done: True: keep polling until training ends (or ``timeout``); False: evaluate the
                checkpoints complete now and return.

        Returns:
            The history.

        Raises:
            EvaluatorError: model_fn, dataset_fn or evaluation failed (the cause is chained).

        Example:
            >>> tfnb.Evaluator(model_fn, dataset_fn, model_dir, log_dir).run(until_done=False)
        """
        if self.running:
            raise EvaluatorError("the evaluator is running in the background; call stop() or join() instead")
        self._begin()
        self._loop(until_done)
        self.join()  # raises the loop's error
        return self.history

    def __repr__(self) -> str:
        return (f"Evaluator({self.checkpoint_dir!r} -> {self.log_dir!r}, state={self.state!r}, "
                f"evaluated={len(self._history)}, skipped={len(self._skipped)})")

    def _begin(self) -> None:
        if self.state != "new":
            raise EvaluatorError("this Evaluator has already run; create a new one (history stays readable)")
        self.state = "running"

    def _loop(self, until_done: bool = True) -> None:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            self._tf.prepare(self.log_dir, self._options)
            while not self._stop.is_set():
                # read the status before listing: every checkpoint written before "finished" is then seen
                finished = until_done and self._training_finished()
                progressed = self._poll(finished)
                if not until_done or (finished and not self._checkpoints.pending):
                    self.state = "finished"
                    log.info("evaluator done (%d evaluated, %d skipped)", len(self._history), len(self._skipped))
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    self.state = "timed out"
                    log.warning("evaluator stopped after timeout=%s s; %d checkpoints pending",
                                self.timeout, len(self._checkpoints.pending))
                    break
                if not progressed:
                    self._stop.wait(self.interval)
            else:
                self.state = "stopped"
        except KeyboardInterrupt:  # run() in the notebook's thread, interrupted
            self.state = "stopped"
            raise
        except Exception as e:  # noqa: BLE001 - kept and raised from stop()/join()/run()
            cause, message = ((e.__cause__ or e, str(e)) if isinstance(e, _Fatal)
                              else (e, f"the evaluator failed: {type(e).__name__}: {e}"))
            self._error, self.state = EvaluatorError(message), "failed"
            self._error.__cause__ = cause
            log.error("%s", message, exc_info=cause)
        finally:
            if self._mlflow is not None:
                self._mlflow.close(failed=self._error is not None)
            self._tf.close()

    def _training_finished(self) -> bool:
        try:
            status = read_status(self._status_store)
        except StorageError as e:
            # a blip is retried next poll; a status that stays unreadable ends the evaluator
            self._status_failures += 1
            if self._status_failures >= _STATUS_ATTEMPTS:
                raise _Fatal(f"cannot read the run status in {self.model_dir} ({self._status_failures} "
                             f"polls in a row): {e}") from e
            log.warning("reading the run status failed (%d of %d): %s", self._status_failures, _STATUS_ATTEMPTS, e)
            return False
        self._status_failures = 0
        return isinstance(status, dict) and status.get("state") in FINAL_STATES

    def _poll(self, finished: bool) -> bool:
        """Scan, then evaluate the complete checkpoints in order; True when one was dealt with."""
        ready, gone = self._checkpoints.scan(finished)
        for cand, reason in gone:
            self._skip(cand, reason)
        progressed = False
        for cand in ready:
            if self._stop.is_set():
                break
            self._evaluate(cand)
            progressed = progressed or cand.name not in self._checkpoints.pending
        return progressed

    def _skip(self, cand: Candidate, reason: str) -> None:
        self._checkpoints.done(cand)
        where = self._ckpt_store.url(cand.name)
        self._skipped.append(SkippedCheckpoint(where, reason, time.time()))
        log.warning("skipping checkpoint %s: %s", where, reason)

    def _evaluate(self, cand: Candidate) -> None:
        started_at, t0 = time.time(), time.monotonic()
        where = self._ckpt_store.url(cand.name)
        try:
            with self._checkpoints.local_copy(cand) as prefix:
                saved_step = self._tf.restore(prefix)
            step = self._step(cand, saved_step)
        except _Fatal:
            raise
        except _Mismatch as e:
            if not self._history:
                raise _Fatal(f"checkpoint {where} does not fit the model model_fn() built: {e.why}; "
                             "make model_fn build the same layers as train_fn") from e.__cause__
            self._skip(cand, f"does not fit the model: {e.why}")
            return
        except Exception as e:  # noqa: BLE001 - half-written or corrupt: decided below
            self._load_failed(cand, e)
            return
        with _fatal_on_error(f"model.evaluate failed on checkpoint {where}"):
            metrics = self._tf.evaluate()
        seconds = time.monotonic() - t0
        is_best = self._is_best(metrics, where)
        result = EvalResult(step, where, metrics, seconds, started_at, cand.found_at or started_at, is_best)
        self._tf.write(step, metrics)
        self._checkpoints.done(cand)
        self._history.append(result)
        if self._mlflow is not None:
            self._mlflow.log(result)
        log.info("evaluated %s (step %d) in %.1f s: %s", where, step, seconds,
                 " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
        if is_best:
            self._best = result
            if self.export_format:
                try:
                    self._export(result)
                except Exception:  # noqa: BLE001 - a failed export must not end evaluation
                    log.exception("exporting the best model (step %d) to %s failed", step, self.export_dir)

    def _step(self, cand: Candidate, saved: int | None) -> int:
        rule = self.step_rule
        if callable(rule):
            return int(rule(self._ckpt_store.url(cand.name)))
        if rule in ("epoch", "name") and cand.number is not None:
            return cand.number - 1 if rule == "epoch" else cand.number
        return saved if saved is not None else len(self._history)

    def _load_failed(self, cand: Candidate, e: Exception) -> None:
        text = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        if isinstance(e, Torn):
            cand.torn += 1  # the file changed under the load; a failure only if the next scan finds it as it was
        else:
            cand.failures += 1
        gone = isinstance(e, FileNotFoundError) or type(e).__name__ == "NotFoundError" or "No such file" in str(e)
        if gone and not self._checkpoints.exists(cand):
            self._skip(cand, "deleted before it could be evaluated")
        elif cand.failures >= self.max_retries:
            self._skip(cand, f"corrupt: failed to load {cand.failures} times with unchanged files ({text})")
        else:
            log.info("checkpoint %s %s (retrying next poll): %s", self._ckpt_store.url(cand.name),
                     "is being written" if isinstance(e, Torn) else f"not loadable yet (attempt {cand.failures})", text)

    def _is_best(self, metrics: Mapping[str, float], where: str) -> bool:
        if self.best_metric is None:
            return False
        if self.best_metric not in metrics:
            raise _Fatal(f"best_metric={self.best_metric!r} is not among the metrics model.evaluate returned "
                         f"({', '.join(metrics) or 'none'}) for {where}; pass one of those or best_metric=None")
        value = metrics[self.best_metric]
        if math.isnan(value):
            return False
        if self._best is None:
            return True
        old = self._best.metrics[self.best_metric]
        return value < old if self.mode == "min" else value > old

    def _export(self, result: EvalResult) -> None:
        store = open_store(self.export_dir, self._options, purpose="exporting the best model to")
        where = self._tf.export(store, self.export_format, {
            "step": result.step, "checkpoint": result.checkpoint, "metrics": dict(result.metrics),
            "best_metric": self.best_metric, "mode": self.mode, "format": self.export_format, "time": time.time()},
            self._mlflow)
        log.info("exported the best model (step %d, %s=%.4g) to %s", result.step, self.best_metric,
                 result.metrics[self.best_metric], where)
