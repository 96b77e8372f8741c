"""MLflow tracking from the driver alone, so workers need neither MLflow nor credentials: :class:`Tracker` tees a
``tfnb.run``'s display into a thread that logs params, epoch-end metrics (``step = epoch - 1``), relaunches, the final
state and the model; :class:`EvalTracker` logs an Evaluator into the same run (the status file names it). The first
failing MLflow call is reported once and ends tracking (docs/monitoring.md, "MLflow")."""
from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import logging
import math
import os
import sys
import tempfile
import time
from typing import Any, Callable, Mapping

from .. import _protocol as events
from ..errors import ConfigError, summary
from .._protocol import RunEvent
from .display import show

log = logging.getLogger(__name__)

MLFLOW_FLOOR = (2, 13)  # Databricks Runtime 15.4 LTS ML's MLflow 2.13.1; 16.4 LTS ML has 2.21.3, 17.3 LTS ML 3.0.1
_MLFLOW_FIX = ("on Databricks use Runtime ML 15.4 LTS or later (MLflow 2.13.1 or later), or %pip install "
               "'mlflow-skinny>=2.13'; elsewhere pip install 'tfnb[mlflow]'")
_SETTINGS = ("experiment", "registered_model_name", "input_example")  # the keys of mlflow={...}
_NOT_METRICS = frozenset({"epoch", "epochs", "step", "steps", "epoch_end", "batch_size", "time"})
_MAX_TAG = 5000     # characters of a tag value (MLflow's limit is 8000)
_MAX_PARAM = 500    # characters of a param value logged from args
_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
# (MLflow run id, log the model) for the tfnb.run calls of this thread: see logging_to
_LOGGING_TO: contextvars.ContextVar = contextvars.ContextVar("tfnb_mlflow_logging_to", default=None)
_OPTION_PARAMS = ("num_ps", "max_attempts", "model_dir", "log_dir", "timeout", "gpus_per_worker", "cpus_per_worker",
                  "ps_placement")  # the RunOptions fields logged as params
# params the Spark conf (and its default) gives when None: a resource option left None is every task's share
_FROM_CONF = {"gpus_per_worker": ("spark.task.resource.gpu.amount", "0"), "cpus_per_worker": ("spark.task.cpus", "1"),
              "spark.master": ("spark.master", None), "spark.app.id": ("spark.app.id", None)}


def settings(value: Any) -> dict:
    """``mlflow=`` as ``{"experiment", "registered_model_name", "input_example"}`` (None where not given)."""
    given = value if isinstance(value, Mapping) else {"experiment": value if isinstance(value, str) else None}
    return {k: given.get(k) for k in _SETTINGS}


def check_option(value: Any) -> bool:
    """Validate ``mlflow=`` and, when tracking is on, import MLflow (>= 2.13) and return True."""
    if value is None or value is False:
        return False
    if isinstance(value, Mapping):
        unknown = sorted(map(str, set(value) - set(_SETTINGS)))
        if unknown:
            raise ConfigError(f"mlflow={{...}} has {', '.join(map(repr, unknown))}, which tfnb does not know; its keys "
                              f"are {', '.join(_SETTINGS)} (e.g. mlflow={{'experiment': 'digits', "
                              "'registered_model_name': 'main.default.digits', 'input_example': x[:5]})")
        for key in ("experiment", "registered_model_name"):
            given = value.get(key)
            if given is not None and not (isinstance(given, str) and given.strip()):
                raise ConfigError(f"mlflow={{'{key}': {given!r}}} must be a name (a non-empty string) or left out")
    elif value is not True and not (isinstance(value, str) and value.strip()):
        raise ConfigError(f"mlflow={value!r} must be True (MLflow's default experiment), an experiment name "
                          "such as mlflow='my-training', a dict of experiment, registered_model_name and "
                          "input_example, or None for no MLflow tracking")
    from .._deps import _floor, require

    mlflow = require("mlflow", "MLflow tracking (mlflow=...)")
    _floor("MLflow", getattr(mlflow, "__version__", "0"), MLFLOW_FLOOR,
           "Databricks Runtime 15.4 LTS ML's MLflow 2.13.1 is the oldest tfnb logs runs and models with", _MLFLOW_FIX)
    return True


def _experiment_id(client, value: Any) -> str | None:
    """The id of the experiment ``mlflow="name"`` names (created when missing); None: MLflow's default."""
    value = settings(value)["experiment"]
    if not isinstance(value, str):
        return None
    found = client.get_experiment_by_name(value)
    return found.experiment_id if found is not None else client.create_experiment(value)


class _Link:
    """MLflow calls for one run (and a sweep's child runs), from one thread; the first failing call turns it off."""

    def __init__(self, what: str):
        import mlflow

        self.what, self.mlflow, self.client = what, mlflow, mlflow.MlflowClient()
        self.run_id: str | None = None
        self.own = False     # tfnb started the run, so tfnb ends it
        self.broken = False

    def call(self, fn: Callable, *args, **kwargs) -> Any:
        if self.broken:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - a tracking server problem must never end the training
            self.broken = True
            run = f" (MLflow run {self.run_id})" if self.run_id else ""
            log.warning("MLflow tracking of %s stopped%s after %s; it goes on without MLflow",
                        self.what, run, summary(e, 320))

    def start(self, experiment: Any, run_id: str | None, tags: Mapping[str, str], *, reopen: str | None = None,
              run_name: str | None = None) -> None:
        """Log to ``run_id`` (left open), else to a run of our own active in this thread: ``reopen``, or a new one."""
        if run_id is not None:
            self.run_id = run_id
            return
        if reopen:
            run = self.call(self.mlflow.start_run, run_id=reopen)
        else:
            run = self.call(self.mlflow.start_run, experiment_id=self.call(_experiment_id, self.client, experiment),
                            run_name=run_name, tags=dict(tags))
        if run is not None:
            self.run_id, self.own = run.info.run_id, True

    def log(self, metrics=(), params=None, tags=None, run_id: str | None = None) -> None:
        """One ``log_batch`` to ``run_id`` (default: this link's run); MLflow splits it at its limits."""
        from mlflow.entities import Param, RunTag

        run_id = run_id or self.run_id
        if run_id is not None:
            self.call(self.client.log_batch, run_id, metrics=list(metrics),
                      params=[Param(k, str(v)[:_MAX_PARAM]) for k, v in (params or {}).items()],
                      tags=[RunTag(k, str(v)[:_MAX_TAG]) for k, v in (tags or {}).items()])

    def end(self, status: str) -> None:
        if self.own:  # call() does nothing once the link is broken
            self.call(self.mlflow.end_run, status)


def metrics_at(values: Mapping[str, float], step: int, stamp: float | None = None, prefix: str = "") -> list:
    """MLflow ``Metric`` entities of ``values`` at ``step`` (``stamp``: epoch seconds, default now)."""
    from mlflow.entities import Metric

    ms = int((time.time() if stamp is None else stamp) * 1000)
    return [Metric(prefix + k, float(v), ms, step) for k, v in values.items()]


@contextlib.contextmanager
def logging_to(mlflow_run_id: str, *, log_model: bool = True):
    """Inside the block, this thread's ``tfnb.run(mlflow=...)`` calls log to ``mlflow_run_id`` and leave it open
    (a sweep runs each trial in its own thread); ``log_model=False`` leaves the model to the caller."""
    token = _LOGGING_TO.set((mlflow_run_id, log_model))
    try:
        yield
    finally:
        _LOGGING_TO.reset(token)


class Tracker:
    """The display of a ``tfnb.run(mlflow=...)``: passes events on and logs to MLflow in the background until closed;
    ``on_start`` gets the id of the MLflow run it logs to."""

    def __init__(self, display: Callable[[RunEvent], None], opts, *, run_id: str, spark, num_workers: int,
                 on_start: Callable[[str], None]):
        self.display, self.model_dir, self.on_start = display, opts.model_dir, on_start
        self.link = _Link(f"tfnb run {run_id}")
        self._state: str | None = None  # the driver's final state event
        self._error: str | None = None
        active = self.link.mlflow.active_run()  # thread-local in MLflow: the caller's run, read in the caller's thread
        given = _LOGGING_TO.get()
        self.log_model = given is None or given[1]
        self.settings = settings(opts.mlflow)
        # one thread, in order: the MLflow run it starts is active in that thread only
        self._calls = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tfnb-mlflow")
        self._calls.submit(self._begin, opts.mlflow, given[0] if given else active.info.run_id if active else None,
                           run_id, _params(opts, spark, num_workers))

    def __call__(self, event: RunEvent) -> None:
        self.display(event)
        self._observe(event)

    def batch(self, batch: list) -> None:
        show(self.display, batch)
        for event in batch:
            self._observe(event)

    def _observe(self, event: RunEvent) -> None:
        data = event.data
        if event.kind == events.PROGRESS and event.job_name == "chief" and data.get("epoch_end"):
            try:
                step = int(data["epoch"]) - 1
            except (KeyError, TypeError, ValueError):
                return
            metrics = metrics_at({k: v for k, v in data.items() if k not in _NOT_METRICS and isinstance(v, (int, float))
                                  and not isinstance(v, bool) and math.isfinite(v)}, step, event.time)
            if metrics:
                self._submit(self.link.log, metrics)
        elif event.kind == events.ATTEMPT:
            reason = f"{data.get('reason', '')}; relaunched as attempt {data.get('attempt')}"
            resize = data.get("resize") or {}
            self._submit(self.link.log, tags={"tfnb.attempt": data.get("attempt"),
                                              f"tfnb.relaunch.{data.get('attempt')}": reason,
                                              **({"tfnb.num_workers": resize.get("to")} if resize else {})})
            self._error = None
        elif event.kind == events.FAILED and self._error is None:
            # the attempt's first failure: the others are usually peers losing it
            self._error = f"{event.label}: {data.get('exc_type')}: {data.get('message', '')}"
        elif event.kind == events.STATE and event.job_name == "driver" and data.get("state") in _STATUS:
            self._state = data["state"]

    def _submit(self, fn: Callable, *args, **kwargs) -> None:
        with contextlib.suppress(RuntimeError):  # after close(): a straggling event of an interrupted run is not logged
            self._calls.submit(fn, *args, **kwargs)

    def close(self) -> None:
        """Close the display, log the final status (and model), wait for it. Without a final state event the run
        was interrupted (KILLED while a KeyboardInterrupt propagates) or timed out (FAILED)."""
        close = getattr(self.display, "close", None)
        if close:
            close()
        state = self._state or ("cancelled" if isinstance(sys.exc_info()[1], KeyboardInterrupt) else "failed")
        self._calls.submit(self._end, state, self._error if state == "failed" else None)
        self._calls.shutdown()

    def _begin(self, experiment, active_run_id, run_id, params) -> None:
        link = self.link
        link.start(experiment, active_run_id, {"tfnb.run_id": run_id})
        if link.run_id is None:
            return
        if active_run_id is not None:
            # params cannot change in MLflow: a second tfnb.run in the same active run keeps the first's
            have = link.call(lambda: link.client.get_run(link.run_id).data.params) or {}
            params = {k: v for k, v in params.items() if k not in have}
        link.log(params=params, tags={"tfnb.run_id": run_id, "tfnb.attempt": 1})
        self.on_start(link.run_id)

    def _end(self, state: str, error: str | None) -> None:
        link = self.link
        link.log(tags={"tfnb.state": state, **({"tfnb.error": error} if error else {})})
        if state == "succeeded" and self.log_model and self.model_dir and link.run_id is not None and not link.broken:
            started = time.monotonic()
            if link.call(_log_model, link.mlflow, self.model_dir, link.run_id, self.settings["registered_model_name"],
                         self.settings["input_example"]):
                log.info("logged the model in %s to MLflow run %s in %.1f s", self.model_dir, link.run_id,
                         time.monotonic() - started)
        link.end(_STATUS.get(state, "FAILED"))


def _params(opts, spark, num_workers: int) -> dict:
    params = {"num_workers": num_workers, **{name: getattr(opts, name) for name in _OPTION_PARAMS}}
    for name, conf in _FROM_CONF.items():
        if params.get(name) is None:
            with contextlib.suppress(Exception):  # a Connect server may not say; the run goes on without it
                params[name] = spark.conf.get(*conf)
    params.update({f"args.{i}": arg for i, arg in enumerate(opts.args) if isinstance(arg, (bool, int, float, str))})
    return {k: v for k, v in params.items() if v is not None}


def _find_model(listing: Mapping[str, Any]) -> str | None:
    """The relative path of the newest saved model (file or SavedModel folder) in a model_dir listing, or None."""
    found: dict[str, float] = {}
    for rel, entry in listing.items():
        parts = rel.split("/")
        if parts[0] == "backup" or any(p.startswith("workertemp_") for p in parts):
            continue  # BackupAndRestore's state and the non-chief workers' copies
        mtime = getattr(entry, "mtime", 0) or 0
        if rel.endswith((".keras", ".h5")) and not rel.endswith(".weights.h5"):  # weights alone are no model
            found[rel] = mtime
        elif parts[-1] == "saved_model.pb":
            folder = "/".join(parts[:-1])
            found[folder] = max(found.get(folder, 0), mtime)
    return max(found, key=found.get) if found else None


def _log_model(mlflow, model_dir: str, mlflow_run_id: str, registered_model_name: str | None = None,
               input_example: Any = None) -> str | None:
    """Log the newest saved model in ``model_dir`` to the run (tag ``tfnb.model.uri``), registered as
    ``registered_model_name`` when given (tag ``tfnb.model.registered``); its path in model_dir, None if none."""
    from ..data.model import _fetch, _locate
    from ..storage import open_store

    store = open_store(model_dir, purpose="reading the saved model in")
    rel = _find_model(store.list())
    if rel is None:
        return None
    client, uri, why = mlflow.MlflowClient(), None, "it does not load as a Keras model"
    with tempfile.TemporaryDirectory(prefix="tfnb-mlflow-model-", ignore_cleanup_errors=True) as tmp:
        path = _fetch(*_locate(store.url(rel), {}), {}, tmp)  # a local model_dir's model is read in place
        model = _load_keras(path)
        try:
            uri = None if model is None else _log_keras(model, mlflow_run_id, input_example)
        except Exception as e:  # noqa: BLE001 - a model MLflow's flavour cannot take goes in as files
            why = f"MLflow's Keras flavour could not log it ({summary(e, 320)})"
            log.info("%s: %s; logging its files instead", path, why)
        if not uri:
            _log_files(client, mlflow_run_id, path, "model")
            if registered_model_name:
                log.warning("the model in %s is not registered as %s: %s; its files are the run's artifact 'model'",
                            path, registered_model_name, why)
            return rel or "."
    client.set_tag(mlflow_run_id, "tfnb.model.uri", uri)
    if registered_model_name:
        # the registry mlflow.set_registry_uri chose (on Databricks: "databricks-uc" for Unity Catalog)
        try:
            version = mlflow.register_model(uri, registered_model_name).version
        except Exception as e:  # noqa: BLE001 - the model stays logged; the registry said no
            log.warning("the model of MLflow run %s (%s) is logged but could not be registered as %s: %s",
                        mlflow_run_id, uri, registered_model_name, summary(e, 320))
        else:
            client.set_tag(mlflow_run_id, "tfnb.model.registered", f"models:/{registered_model_name}/{version}")
    return rel or "."


def _log_files(client, run_id: str, path: str, artifact_path: str) -> None:
    (client.log_artifacts if os.path.isdir(path) else client.log_artifact)(run_id, path, artifact_path)


def _load_keras(path: str):
    """The Keras model at ``path`` loaded by the Keras that saved it; None when not one or TensorFlow is missing."""
    try:
        from .._deps import keras_for, tensorflow_with_tf_keras

        # tf.keras code trained with tf-keras: MLflow's tensorflow flavour saves and loads a tf.keras model through
        # tf.keras, which must then be tf-keras (the notebook's environment is left alone)
        tensorflow_with_tf_keras("logging the model to MLflow")
        return keras_for(path).models.load_model(path)
    except Exception as e:  # noqa: BLE001 - not a Keras model (a tf.Module SavedModel...)
        log.info("%s does not load as a Keras model (%s); logging its files", path, summary(e, 320))
        return None


def _signature(model, input_example: Any):
    """The model's MLflow signature from ``input_example`` and its predictions, else from its single input's and
    output's shapes (Unity Catalog registers no model without one), else None."""
    import numpy as np
    from mlflow.models import infer_signature

    if input_example is not None:
        try:
            return infer_signature(input_example, np.asarray(model.predict(input_example, verbose=0)))
        except Exception as e:  # noqa: BLE001 - the example does not fit the model: the shapes say it instead
            log.warning("the model does not predict on mlflow={'input_example': ...} (%s); its signature comes "
                        "from its input and output shapes", summary(e, 320))
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    def spec(tensors):
        if not isinstance(tensors, (list, tuple)) or len(tensors) != 1:
            return None
        (t,) = tensors
        dtype = np.dtype(getattr(t.dtype, "name", t.dtype))
        return Schema([TensorSpec(dtype, tuple(-1 if d is None else int(d) for d in t.shape))])

    with contextlib.suppress(Exception):  # a subclassed model has no symbolic inputs: no signature then
        inputs, outputs = spec(model.inputs), spec(model.outputs)
        if inputs is not None and outputs is not None:
            return ModelSignature(inputs=inputs, outputs=outputs)
    return None


def _log_keras(model, mlflow_run_id: str, input_example: Any = None) -> str:
    """Log ``model`` as the run's ``model`` (a LoggedModel with MLflow 3) and return its URI: Keras 3 in MLflow's
    ``keras`` flavour, tf-keras in its ``tensorflow`` one."""
    import importlib.metadata

    import mlflow
    from mlflow.models import Model

    from .._deps import _version

    keras3 = type(model).__module__.split(".")[0] == "keras"
    reqs = []
    for dist in ("tensorflow", "tensorflow-cpu", "keras" if keras3 else "tf-keras"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            reqs.append(f"{dist}=={importlib.metadata.version(dist)}")
    # explicit requirements: MLflow would otherwise load the model in a subprocess to infer them.
    kwargs = {"pip_requirements": reqs, "signature": _signature(model, input_example)}
    if input_example is not None:
        kwargs["input_example"] = input_example
    if keras3:
        import types

        import mlflow.keras  # imports Keras 3, already imported to load the model

        def save_model(path, **kw):
            os.makedirs(path, exist_ok=True)  # the flavour writes the input example before it makes the folder
            mlflow.keras.save_model(path=path, **kw)

        flavor = types.SimpleNamespace(__name__=mlflow.keras.__name__, save_model=save_model)
    else:
        import mlflow.tensorflow  # imports TensorFlow: only once there is a model to log

        flavor = mlflow.tensorflow
        # "keras_v3" by name: from a thread other than the one that imported tf-keras, a ".keras" path
        # with MLflow's default save_format would be written as HDF5 (see EvalModel.export).
        kwargs["keras_model_kwargs"] = {"save_format": "keras_v3"}
    # Model.log, as the flavours' log_model take no run_id before MLflow 3: this thread has no active run to log to
    major = _version(getattr(mlflow, "__version__", "0"))[0]
    where = {"artifact_path": None, "name": "model"} if major >= 3 else {"artifact_path": "model"}
    return Model.log(flavor=flavor, model=model, run_id=mlflow_run_id, **where, **kwargs).model_uri


class EvalTracker:
    """Logs an Evaluator's results from its thread to (decided at the first result) the run of the ``tfnb.run``
    writing ``model_dir`` (the ``mlflow_run_id`` of its status file), else the MLflow run active where the Evaluator
    was created, else a run of its own. Metrics ``eval_<name>``, the best's also ``best_eval_*``.
    """

    def __init__(self, experiment: Any, status_store):
        self.experiment, self.store, self.link = experiment, status_store, _Link("the evaluator")
        active = self.link.mlflow.active_run()  # the creating thread's, read there
        self.active_run_id = active.info.run_id if active else None

    def log(self, result) -> None:
        if self.link.run_id is None:  # the first result (or MLflow failed: then the link does nothing)
            from .._status import read_status

            run_id = (self.link.call(read_status, self.store) or {}).get("mlflow_run_id") or self.active_run_id
            self.link.start(self.experiment, run_id, {"tfnb.evaluator": "true"})
        metrics = [m for prefix in (("eval_", "best_eval_") if result.best else ("eval_",))
                   for m in metrics_at(result.metrics, int(result.step), prefix=prefix)]
        tags = {"tfnb.eval.best_step": result.step, "tfnb.eval.best_checkpoint": result.checkpoint}
        self.link.log(metrics, tags=tags if result.best else None)

    def log_best_model(self, local_path: str) -> None:
        """Upload the exported best model (file or SavedModel folder) as the run's ``best_model``."""
        if self.link.run_id is not None:
            self.link.call(_log_files, self.link.client, self.link.run_id, local_path, "best_model")

    def close(self, failed: bool) -> None:
        self.link.end("FAILED" if failed else "FINISHED")
