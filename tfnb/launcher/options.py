"""What ``tfnb.run`` is asked to do, resolved and checked once, on the driver: :class:`RunOptions`."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Sequence

from .._config import setting
from ..errors import ConfigError, suggest
from ..monitor.display import check_display
from .._config import check_seconds

_STALL_DEFAULT = 1800.0
_REPLACE_WAIT = 120.0  # seconds an elastic run waits for a lost executor's replacement before it shrinks
_PS_JOB_WAIT = 300.0  # seconds one barrier job waits for the other's tasks (ps tasks in a job of their own)
# TFNB_* variables that are tfnb's own plumbing between a task and its train_fn process, not settings
_TASK_OWN = ("TFNB_RUN_ID", "TFNB_ATTEMPT", "TFNB_EVENT_FD", "TFNB_HELD_PORT_FD", "TFNB_KEPT_PORT_FD",
             "TFNB_PREIMPORT")
# env= keys tfnb itself sets in every train_fn process, and what to do instead
_OWN_ENV = {**dict.fromkeys(_TASK_OWN, "it is tfnb's own plumbing; leave it out"),
            "TFNB_RUN_ID": "read ctx.run_id instead", "TFNB_ATTEMPT": "read ctx.attempt instead",
            "TFNB_PREIMPORT": "pass preimport= instead",
            "TF_CONFIG": "tfnb writes it per task for the cluster it launched; read ctx.tf_config instead",
            "CUDA_VISIBLE_DEVICES": ("pass use_gpu= instead (None: the GPUs Spark assigned, False: none), "
                                     "or gpus_per_worker= for how many"),
            "PYTHONUNBUFFERED": "tfnb needs it to stream train_fn's output as it is printed; leave it out"}
SETTING_ONLY = ("failure_grace", "warm_idle", "ps_job_wait", "slot_wait")  # TFNB_* settings, not keywords


def _int(name: str, value: Any, low: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name}={value!r} but it must be an int >= {low}; {fix}")
    return value


def _stall_timeout(value) -> float | None:
    """stall_timeout= resolved: "auto" -> TFNB_STALL_TIMEOUT or 30 min; None/0/"off" -> no watchdog."""
    name = "stall_timeout"
    if isinstance(value, str) and value == "auto":
        off = setting(name, None, str(_STALL_DEFAULT), str).strip().lower() in ("", "none", "off")
        name, value = "TFNB_STALL_TIMEOUT", None if off else setting(name, None, _STALL_DEFAULT, float)
    if value is None or (value == 0 and not isinstance(value, bool)):
        return None
    return check_seconds(name, value, "a number of seconds >= 0 (None or 0 turns the stall watchdog off)")


def _elastic(given: Mapping, num_workers: int, num_ps: int) -> tuple[int | None, float]:
    minimum = given.get("min_workers")
    wait = check_seconds("replace_wait", setting("replace_wait", given.get("replace_wait"), _REPLACE_WAIT, float))
    if minimum is None:
        return None, wait
    minimum = _int("min_workers", minimum, 1, f"pass min_workers between 1 and num_workers={num_workers}")
    if minimum > num_workers:
        raise ConfigError(f"min_workers={minimum} is more than num_workers={num_workers}; min_workers is the fewest "
                          f"workers an elastic run goes on with: pass min_workers <= {num_workers}")
    if num_ps:
        raise ConfigError(f"min_workers={minimum} with num_ps={num_ps}: elastic runs are MultiWorkerMirroredStrategy "
                          "runs (a parameter-server run keeps its size); pass num_ps=0 or leave min_workers out")
    return minimum, wait


def _check_env(env: Any, legacy_keras: bool | None) -> tuple:
    """env= as sorted (name, value) pairs, refusing what tfnb sets itself."""
    if env is None:
        return ()
    bad = {k: v for k, v in env.items() if not (isinstance(k, str) and isinstance(v, str))} \
        if isinstance(env, Mapping) else env
    if bad:  # name the entries by key and type only: env values are often credentials
        what = {k: type(v).__name__ for k, v in bad.items()} if isinstance(bad, dict) else type(bad).__name__
        raise ConfigError(f"env must be a dict of str to str, not {what}; convert values with str()")
    own = dict(_OWN_ENV)
    if legacy_keras is not False:
        own["TF_USE_LEGACY_KERAS"] = ("pass legacy_keras=False instead (by default tfnb sets it to 1 where tf-keras is "
                                      "installed)")
    taken = [k for k in env if k in own]
    if taken:
        raise ConfigError("; ".join(f"env= sets {k}, which tfnb sets in every train_fn process: {own[k]}"
                                    for k in taken))
    return tuple(sorted(env.items()))


def _check_resources(given: Mapping[str, Any]) -> tuple:
    """(gpus_per_worker, cpus_per_worker, use_gpu, ps_placement), checked."""
    gpus, cpus, use_gpu = given.get("gpus_per_worker"), given.get("cpus_per_worker"), given.get("use_gpu")
    if gpus is not None:
        _int("gpus_per_worker", gpus, 0, "whole GPUs for each chief/worker task (0: none), or None for what "
             "spark.task.resource.gpu.amount gives every task")
    if cpus is not None:
        _int("cpus_per_worker", cpus, 1, "CPU cores for each chief/worker task, or None for spark.task.cpus")
    if use_gpu not in (None, True, False):
        raise ConfigError(f"use_gpu={use_gpu!r} must be True (require GPUs), False (hide them) or None (use "
                          "what the tasks get); to choose how many, pass gpus_per_worker=")
    if use_gpu is False and gpus:
        raise ConfigError(f"use_gpu=False hides every GPU from train_fn, but gpus_per_worker={gpus} asks for "
                          "them; pass gpus_per_worker=0 for a run that takes no GPU, or leave use_gpu out")
    if use_gpu is True and gpus == 0:
        raise ConfigError("use_gpu=True requires GPUs, but gpus_per_worker=0 asks for none; pass "
                          "gpus_per_worker=1 (or more), or leave use_gpu out")
    placement = given.get("ps_placement", "executors")
    if placement not in ("executors", "driver"):
        raise ConfigError(f"ps_placement={placement!r} must be 'executors' (the default: ps tasks on the executors) "
                          "or 'driver' (ps processes on the driver)")
    return gpus, cpus, use_gpu, placement


@dataclass(frozen=True)
class RunOptions:
    """The options of one ``tfnb.run``, as the driver resolved them (see ``tfnb.run`` for each one).

    Build it with :meth:`resolve` (``TFNB_*`` settings and defaults applied, every value checked); pass it to
    ``tfnb.run(train_fn, options)`` and reuse it, the call's keywords overriding its fields. ``env`` and
    ``storage_options`` (often credentials) never appear in its repr.

    Example:
        >>> opts = RunOptions.resolve(num_workers=2, timeout=600, model_dir="/Volumes/main/default/tfnb/run1")
        >>> tfnb.run(train_fn, opts, args=(5,))
    """

    num_workers: int
    args: tuple = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict, repr=False)
    num_ps: int = 0
    spark: Any = field(default=None, repr=False)
    use_gpu: bool | None = None
    gpus_per_worker: int | None = None
    cpus_per_worker: int | None = None
    ps_placement: str = "executors"
    timeout: float | None = None
    model_dir: str | None = None
    log_dir: str | None = None
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False)
    data: Any = field(default=None, repr=False)
    max_attempts: int = 2
    min_workers: int | None = None
    replace_wait: float = _REPLACE_WAIT
    stall_timeout: float | None = _STALL_DEFAULT
    env: tuple = field(default=(), repr=False)
    legacy_keras: bool | None = None
    preimport: tuple = ("tensorflow",)
    warm: bool = True
    display: Callable | bool | None = field(default=None, repr=False)
    profile_steps: tuple | None = None
    mlflow: bool | str | None = None
    failure_grace: float = 3.0
    warm_idle: float = 600.0
    ps_job_wait: float = _PS_JOB_WAIT
    slot_wait: float = 30.0  # seconds for executors to register before a launch is judged too big
    settings: tuple = field(default=(), repr=False)

    @classmethod
    def resolve(cls, base: "RunOptions | None" = None, **given: Any) -> "RunOptions":
        """``given`` keywords over ``base``'s fields, then TFNB_* settings, then defaults; checked.

        Raises:
            ConfigError: an unknown keyword, or a value that breaks its rule (the message names the fix).
        """
        names = {f.name for f in fields(cls)} - {*SETTING_ONLY, "settings"}
        unknown = sorted(set(given) - names)
        if unknown:
            raise ConfigError(f"tfnb.run got unknown option(s) {', '.join(unknown)}; the options are below"
                              f"{suggest(unknown, names)}\n{', '.join(sorted(names))}")
        if base is not None:
            given = {**{n: getattr(base, n) for n in names}, **given}
        if "num_workers" not in given:
            raise ConfigError("tfnb.run needs num_workers=, the number of chief + worker tasks, e.g. num_workers=2")
        num_workers = _int("num_workers", given["num_workers"], 1, "pass num_workers=2 for two workers")
        num_ps = _int("num_ps", given.get("num_ps", 0), 0, "num_ps=0 runs MultiWorkerMirroredStrategy")
        if num_ps > 0 and num_workers < 2:
            raise ConfigError(f"num_ps={num_ps} needs a chief and at least one worker; "
                              "set num_workers >= 2 or num_ps=0")
        args = given.get("args", ())
        if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
            raise ConfigError(f"args must be a tuple of positional arguments, got {type(args).__name__}; "
                              "write args=(value,)")
        kwargs = given.get("kwargs") or {}
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            raise ConfigError(f"kwargs must be a dict of keyword arguments for train_fn, got {type(kwargs).__name__}")
        legacy_keras = setting("legacy_keras", given.get("legacy_keras"), None, bool)
        preimport = given.get("preimport")
        if preimport is None:
            preimport = tuple(filter(None, setting("preimport", None, "tensorflow", str).split(",")))
        elif isinstance(preimport, str):
            raise ConfigError(f"preimport={preimport!r} must be a sequence of module names; "
                              f"write preimport=({preimport!r},)")
        elif not all(isinstance(m, str) for m in preimport):
            raise ConfigError(f"preimport={preimport!r} must name modules as strings, e.g. preimport=('tensorflow',)")
        gpus, cpus, use_gpu, ps_placement = _check_resources(given)
        if given.get("data") is not None and num_ps > 0:
            raise ConfigError(
                f"data= feeds MultiWorkerMirroredStrategy workers, but num_ps={num_ps}; with parameter servers "
                "stage files per worker (tfnb.stage) and build the dataset in train_fn, or set num_ps=0")
        storage_options = given.get("storage_options")
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise ConfigError(f"storage_options must be a dict (key, secret, endpoint_url, ...), got "
                              f"{type(storage_options).__name__}")
        tuned = {f.name: setting(f.name, None, f.default, float) for f in fields(cls) if f.name in SETTING_ONLY}
        if tuned["failure_grace"] < 0:
            raise ConfigError(f"TFNB_FAILURE_GRACE={tuned['failure_grace']} must be >= 0 seconds")
        if not tuned["ps_job_wait"] > 0:  # NaN too
            raise ConfigError(f"TFNB_PS_JOB_WAIT={tuned['ps_job_wait']:g} must be a number of seconds > 0 (default "
                              f"{_PS_JOB_WAIT:g}); fix or unset TFNB_PS_JOB_WAIT")
        min_workers, replace_wait = _elastic(given, num_workers, num_ps)
        from .._task.profiling import check_profile_steps
        from ..monitor.tracking import check_option

        check_option(given.get("mlflow"))  # a bad value or a missing MLflow fails here, before Spark starts
        check_display(given.get("display"))
        env = given.get("env")
        env = env if isinstance(env, tuple) else _check_env(env, legacy_keras)
        # the train_fn processes resolve settings as the driver does, a TFNB_* given in env= winning
        settings = {k: v for k, v in (*os.environ.items(), *env) if k.startswith("TFNB_") and k not in _TASK_OWN}
        return cls(
            num_workers=num_workers, args=tuple(args), kwargs=dict(kwargs), num_ps=num_ps, use_gpu=use_gpu,
            gpus_per_worker=gpus, cpus_per_worker=cpus, ps_placement=ps_placement, storage_options=storage_options,
            timeout=check_seconds("timeout", setting("timeout", given.get("timeout"), None, float),
                                  "a number of seconds > 0 (or None for no limit)", optional=True),
            **{n: given.get(n) for n in ("spark", "model_dir", "log_dir", "data", "display", "mlflow")},
            max_attempts=_int("max_attempts", setting("max_attempts", given.get("max_attempts"), 2, int), 1,
                              "1 = never relaunch"), min_workers=min_workers, replace_wait=replace_wait,
            stall_timeout=_stall_timeout(given.get("stall_timeout", "auto")), env=env, legacy_keras=legacy_keras,
            preimport=tuple(preimport), warm=setting("warm", given.get("warm"), True, bool),
            profile_steps=check_profile_steps(given.get("profile_steps"), given.get("log_dir")),
            settings=tuple(sorted(settings.items())), **tuned)

    @property
    def num_tasks(self) -> int:
        return self.num_workers + self.num_ps
