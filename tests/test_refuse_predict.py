"""Refusals of ``tfnb.predict``: arguments first (no Spark), then checks against the shared local[2]
session's DataFrames."""
from __future__ import annotations

import tfnb
from tfnb import ConfigError

from refusals import Refusals, case


@case("predict", "`tfnb.predict(df, m, input_cols=[])`", ConfigError, "input_cols=[]", "input_cols=['features']",
      says="a non-empty list of column names")
def predict_no_input_cols(env):
    tfnb.predict(None, "model.keras", input_cols=[])


@case("predict", "`input_cols='features'`", ConfigError, "input_cols='features'", "input_cols=['features']",
      says="a list: input_cols=['features']")
def predict_input_cols_str(env):
    tfnb.predict(None, "model.keras", input_cols="features")


@case("predict", "`batch_size=0`", ConfigError, "batch_size=0", "batch_size=1024", says="an int >= 1, e.g. 1024")
def predict_batch_size(env):
    tfnb.predict(None, "model.keras", input_cols=["x"], batch_size=0)


@case("predict", "`output_type='int'`", ConfigError, "output_type='int'", "'float', 'array'",
      says="'float', 'array', or leave it out")
def predict_output_type(env):
    tfnb.predict(None, "model.keras", input_cols=["x"], output_type="int")


@case("predict", "`input_cols=['x', 'x']`", ConfigError, "['x']", "name each column once", says="name each column once")
def predict_duplicate_cols(env):
    tfnb.predict(None, "model.keras", input_cols=["x", "x"])


@case("predict", "`tfnb.predict(<pandas DataFrame>, ...)`", ConfigError, "got DataFrame", "spark.createDataFrame",
      says="convert it with spark.createDataFrame")
def predict_pandas(env):
    import pandas as pd

    tfnb.predict(pd.DataFrame({"x": [1.0]}), "model.keras", input_cols=["x"])


@case("predict", "`input_cols=['z']` not in the DataFrame", ConfigError, "'z'", "fix input_cols",
      says="fix input_cols (the message lists the columns)", spark=True)
def predict_missing_column(env):
    tfnb.predict(env.spark.range(2), "model.keras", input_cols=["z"])


@case("predict", "a string input column", ConfigError, "'name' has type string", "numeric",
      says="numeric columns, arrays of numbers or packed bytes (binary)", spark=True)
def predict_string_column(env):
    df = env.spark.createDataFrame([("a",)], "name string")
    yield
    tfnb.predict(df, "model.keras", input_cols=["name"])


@case("predict", "`output_col` that exists", ConfigError, "output_col='id'", "df.drop('id')",
      says="another output_col, or drop the column", spark=True)
def predict_output_exists(env):
    tfnb.predict(env.spark.range(2), "model.keras", input_cols=["id"], output_col="id")


@case("predict", "`model_path` that does not exist", ConfigError, "does not exist on the driver", ".keras/.h5",
      says="the path of a .keras/.h5 file or SavedModel directory", spark=True)
def predict_missing_model(env):
    tfnb.predict(env.spark.range(2), str(env.tmp / "nope.keras"), input_cols=["id"])


class TestRefusals(Refusals):
    """The cases above."""
