"""Refusals of tfnb.sweep's arguments: the search space, the study, the counts, the options passed on to every
trial's tfnb.run (all before a Spark session is needed), and trials the shared local[2] session cannot hold."""
from __future__ import annotations

import sys

import tfnb
from tfnb import ClusterError, ConfigError, MissingDependencyError

from refusals import Refusals, case, table


def trial_fn(ctx, params):
    return params["x"]


def _sweep(env, /, **kwargs):
    """tfnb.sweep(trial_fn, {"x": (0.0, 1.0)}, n_trials=2, num_workers=1, **kwargs), no display."""
    given = {"train_fn": trial_fn, "space": {"x": (0.0, 1.0)}, "n_trials": 2, "num_workers": 1, "display": False,
             **kwargs}
    tfnb.sweep(given.pop("train_fn"), given.pop("space"), **given)


def _study(**kwargs):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(**kwargs)


table("sweep", ConfigError, _sweep, [
    ("sweep_train_fn_not_callable", dict(train_fn="train.py"),
     "`tfnb.sweep('train.py', ...)`", ("got str", "(ctx, params)"), "pass a function taking (ctx, params)"),
    ("sweep_n_trials_zero", dict(n_trials=0),
     "`n_trials=0`", ("n_trials=0", "n_trials=20"), "an int >= 1"),
    ("sweep_n_trials_float", dict(n_trials=2.5),
     "`n_trials=2.5`", ("n_trials=2.5", "int >= 1"), "an int >= 1"),
    ("sweep_at_once_zero", dict(at_once=0),
     "`at_once=0`", ("at_once=0", "None for as many as fit"), "an int >= 1, or None for as many as fit"),
    ("sweep_same_error_limit_zero", dict(same_error_limit=0),
     "`same_error_limit=0`", ("same_error_limit=0", "(default 3)"), "an int >= 1 (default 3)"),
    ("sweep_metric_empty", dict(metric=""),
     "`metric=''`", ("metric=''", "metric='val_accuracy'"), "name the objective"),
    ("sweep_space_not_a_dict", dict(space=[0.1, 0.2]),
     "`space=[0.1, 0.2]`", ("space=[0.1, 0.2]", "a dict of hyperparameters", "space(trial)"),
     "a dict of hyperparameters, or a function space(trial)"),
    ("sweep_space_empty", dict(space={}),
     "`space={}`", ("space={}", "name at least one hyperparameter"), "name at least one hyperparameter"),
    ("sweep_space_text_value", dict(space={"lr": "0.01"}),
     "`space={'lr': '0.01'}`", ("space['lr']='0.01'", "a list of choices", "(1e-4, 1e-1, 'log')"),
     "a list of choices, a (low, high[, 'log']) range or an optuna distribution"),
    ("sweep_space_reversed_range", dict(space={"lr": (0.1, 0.01)}),
     "`space={'lr': (0.1, 0.01)}`", ("space['lr']=(0.1, 0.01)", "low must be below high", "(0.01, 0.1)"),
     "low below high"),
    ("sweep_space_log_from_zero", dict(space={"lr": (0.0, 0.1, "log")}),
     "`space={'lr': (0.0, 0.1, 'log')}`", ("space['lr']=(0.0, 0.1, 'log')", "low > 0", "(1e-4, 0.1, 'log')"),
     "a log-scale range needs low > 0"),
    ("sweep_space_no_choices", dict(space={"units": []}),
     "`space={'units': []}`", ("space['units']=[]", "at least one"), "list at least one choice"),
    ("sweep_space_dict_choices", dict(space={"optimizer": [{"name": "adam"}]}),
     "`space={'optimizer': [{'name': 'adam'}]}`", ("space['optimizer']", "None, bool, int, float or str only",
                                                  "build the object in train_fn"),
     "choices Optuna can store: names or numbers; build objects in train_fn"),
    ("sweep_direction_unknown", dict(direction="up"),
     "`direction='up'`", ("direction='up'", "'minimize' or 'maximize'"), "minimize or maximize"),
    ("sweep_study_not_a_study", dict(study="digits"),
     "`study='digits'`", ("study='digits'", "optuna.create_study", "optuna.load_study"),
     "an optuna.Study (create_study, or load_study to resume)"),
    ("sweep_unknown_option", dict(num_worker=2),
     "`num_worker=2` (a typo)", ("unknown option(s) num_worker", "num_workers"),
     "lists tfnb.run's options it passes on"),
    ("sweep_bad_run_option", dict(timeout=-1),
     "`timeout=-1` (for every trial)", ("timeout=-1", "seconds > 0"), "checked as tfnb.run checks it, before launch"),
    ("sweep_display_text", dict(display="panel"),
     "`display='panel'`", ("display='panel'", "a callable taking SweepEvents", "False for none"),
     "a callable, False, or None for the default"),
])


@case("sweep", "`direction='minimize'` with a maximizing study", ConfigError, "direction='minimize'",
      "is set to maximize", "leave direction= out", says="leave direction= out: the study's is used")
def sweep_direction_against_study(env):
    _sweep(env, study=_study(direction="maximize"), direction="minimize")


@case("sweep", "a study with two objectives", ConfigError, "has 2 objectives", "direction=",
      says="a single-objective study")
def sweep_multi_objective_study(env):
    _sweep(env, study=_study(directions=["minimize", "maximize"]))


@case("sweep", "Optuna not installed", MissingDependencyError, "optuna is needed for tfnb.sweep",
      "pip install 'tfnb[sweep]'", says="pip install 'tfnb[sweep]' (or %pip install optuna)")
def sweep_without_optuna(env):
    env.monkeypatch.setitem(sys.modules, "optuna", None)  # as if not installed: import optuna raises ImportError
    _sweep(env)


@case("sweep", "`num_workers=3` per trial on 2 task slots", ClusterError, "num_workers=3 per trial",
      "needs 3 task slots", "has 2", says="lower num_workers or add executors/cores", spark=True)
def sweep_trial_more_than_slots(env):
    _sweep(env, num_workers=3, spark=env.spark)


@case("sweep", "`at_once=3` trials of 1 slot on 2 task slots", ClusterError, "at_once=3", "holds 2 at once",
      "leave it out", says="lower at_once, or leave it out (as many as fit)", spark=True)
def sweep_at_once_more_than_fit(env):
    _sweep(env, n_trials=4, at_once=3, spark=env.spark)


@case("sweep", "a space function that returns a number", ConfigError, "space(trial) returned float",
      "return {'learning_rate'", says="return a dict of hyperparameters", spark=True)
def sweep_space_function_no_dict(env):
    _sweep(env, space=lambda trial: trial.suggest_float("lr", 1e-4, 1e-1), spark=env.spark)


class TestRefusals(Refusals):
    """The cases above."""
