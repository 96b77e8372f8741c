"""The search space and the study ``tfnb.sweep`` accepts, checked (with the fix) before anything launches."""
from __future__ import annotations

import logging
import math
from typing import Any, Callable, Mapping

from .._deps import require
from ..errors import ConfigError

_FORMS = ("a list of choices ['adam', 'sgd'], a range (1e-4, 1e-1) or (1e-4, 1e-1, 'log'), or an "
          "optuna.distributions object\nA range of ints samples integers, (1e-4, 1e-1, 'log') on a log scale.")
log = logging.getLogger(__name__)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _one(name: str, value: Any, dists):
    given = f"space[{name!r}]={value!r}"
    if isinstance(value, dists.BaseDistribution):
        return value
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"{given} has no choices; list at least one, e.g. [32, 64]")
        odd = [v for v in value if not (v is None or isinstance(v, (bool, int, float, str)))]
        if odd:
            raise ConfigError(f"{given}: Optuna samples choices of None, bool, int, float or str only, not "
                              f"{type(odd[0]).__name__}; list names or numbers and build the object in train_fn")
        return dists.CategoricalDistribution(value)
    if isinstance(value, tuple) and len(value) in (2, 3):
        low, high, *scale = value
        if not (_number(low) and _number(high)):
            raise ConfigError(f"{given}: a range is (low, high) numbers; for choices write a list [...]")
        if scale and scale[0] != "log":
            raise ConfigError(f"{given}: the third item of a range can only be 'log' (a log scale)")
        if low >= high:
            raise ConfigError(f"{given}: low must be below high, e.g. ({min(low, high)!r}, {max(low, high)!r})")
        if scale and low <= 0:
            raise ConfigError(f"{given}: a log-scale range needs low > 0, e.g. (1e-4, {high!r}, 'log')")
        if isinstance(low, int) and isinstance(high, int):
            return dists.IntDistribution(low, high, log=bool(scale))
        return dists.FloatDistribution(float(low), float(high), log=bool(scale))
    raise ConfigError(f"{given} is not a search space Optuna can sample; give {_FORMS}")


def distributions(space: Any) -> dict | Callable:
    """``space`` checked: a dict of Optuna distributions, or the define-by-run function as given."""
    if callable(space) and not isinstance(space, Mapping):
        return space
    if not isinstance(space, Mapping):
        raise ConfigError(f"space={space!r} must be a dict of hyperparameters ({{'learning_rate': (1e-4, 1e-1, 'log'), "
                          "'units': [32, 64]}) or a function space(trial) -> dict calling trial.suggest_*")
    if not space:
        raise ConfigError("space={} has nothing to search; name at least one hyperparameter, e.g. "
                          "{'learning_rate': (1e-4, 1e-1, 'log')}")
    optuna = require("optuna", "tfnb.sweep")
    bad = [k for k in space if not isinstance(k, str) or not k]
    if bad:
        raise ConfigError(f"space has the key {bad[0]!r}; hyperparameter names are non-empty strings")
    return {name: _one(name, value, optuna.distributions) for name, value in space.items()}


def sample(study, space: dict | Callable) -> tuple[Any, dict]:
    """A new trial of ``study`` and its hyperparameters; a space function that raises or returns no dict fails the
    trial and raises ConfigError."""
    import optuna

    if isinstance(space, dict):
        trial = study.ask(space)
        return trial, dict(trial.params)
    trial = study.ask()
    try:
        params = space(trial)
    except Exception as e:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise ConfigError(f"space(trial) raised {type(e).__name__}: {e}; fix the space function "
                          "(it runs on the driver, once per trial)") from e
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise ConfigError(f"space(trial) returned {type(params).__name__}, not a dict of hyperparameters; end "
                          "the space function with return {'learning_rate': trial.suggest_float(...), ...}")
    return trial, dict(params)


def warn_clustered(study, at_once: int) -> None:
    """Warn when trials run at once under a TPE sampler without ``constant_liar`` (Optuna < 5's default)."""
    import optuna

    sampler = study.sampler
    if at_once > 1 and isinstance(sampler, optuna.samplers.TPESampler) and not getattr(sampler, "_constant_liar", 1):
        log.warning("tfnb.sweep: study %r: its TPESampler runs without constant_liar, so the %d trials that run at "
                    "once get clustered, even equal, suggestions; create the study with "
                    "sampler=optuna.samplers.TPESampler(constant_liar=True)", study.study_name, at_once)


def make_study(study: Any, direction: str | None, metric: str):
    """``study`` checked against ``direction``, or a new in-memory one: Optuna's median pruner and its TPE sampler
    with ``constant_liar`` (running trials count as bad results, so the trials asked for at once spread out)."""
    import warnings

    optuna = require("optuna", "tfnb.sweep")
    if direction is not None and direction not in ("minimize", "maximize"):
        raise ConfigError(f"direction={direction!r} must be 'minimize' or 'maximize' (for {metric!r})")
    if study is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ExperimentalWarning before Optuna 5
            sampler = optuna.samplers.TPESampler(constant_liar=True)
        return optuna.create_study(direction=direction or "minimize", sampler=sampler)
    if not isinstance(study, optuna.Study):
        raise ConfigError(f"study={study!r} is not an optuna.Study; create one with optuna.create_study(...) "
                          "(or optuna.load_study to resume), or leave study= out")
    if len(study.directions) != 1:
        raise ConfigError(f"study {study.study_name!r} has {len(study.directions)} objectives; tfnb.sweep optimizes "
                          "one metric: create the study with direction=")
    own = study.direction.name.lower()
    if direction is not None and direction != own:
        raise ConfigError(f"direction={direction!r} but study {study.study_name!r} is set to {own}; leave direction= "
                          "out (the study's is used) or create the study with the direction you want")
    return study
