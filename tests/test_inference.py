"""tfnb.predict: predictions over a real Spark DataFrame equal model.predict in one process.

A tiny tf-keras model is trained on scikit-learn's digits in this process and saved as .keras,
.h5 and SavedModel (and a Keras 3 one as .keras); Spark's Python workers (local[2]) load those files and predict.
"""
from __future__ import annotations

import os
import shutil
import warnings
import zipfile
from collections import Counter

import numpy as np
import pytest


os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before tensorflow is imported anywhere in this process

from tfnb.data import inference, scoring
from tfnb.data import model as data_model
from tfnb.errors import ConfigError, MissingDependencyError  # noqa: E402

ATOL = 1e-5


def _train(x, y, units: int, seed: int):
    import tensorflow as tf
    import tf_keras

    tf.random.set_seed(seed)
    layers = tf_keras.layers
    model = tf_keras.Sequential([layers.Input((64,)), layers.Dense(32, activation="relu"), layers.Dense(units)])
    if units == 1:
        model.compile("adam", "mse")
        model.fit(x, y.astype("float32"), epochs=2, batch_size=64, verbose=0)
    else:
        model.compile("adam", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, epochs=2, batch_size=64, verbose=0)
    return model


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.data / 16.0).astype("float32"), data.target


@pytest.fixture(scope="module")
def models(digits, tmp_path_factory):
    """{name: (path, expected predictions of every digit row)} for each saved format."""
    import tensorflow as tf

    x, y = digits
    root = tmp_path_factory.mktemp("models")
    clf = _train(x, y, 10, seed=1)
    reg = _train(x, y, 1, seed=2)
    clf.save(root / "digits.keras")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*HDF5 file.*legacy", category=UserWarning)
        reg.save(root / "digits_reg.h5")  # the legacy format is one of those users have
    tf.saved_model.save(clf, str(root / "digits_savedmodel"))
    with zipfile.ZipFile(root / "models.zip", "w") as z:
        z.write(root / "digits.keras", "digits.keras")
        for f in (root / "digits_savedmodel").rglob("*"):
            z.write(f, f.relative_to(root))
    logits = clf.predict(x, verbose=0)
    return {
        "keras": (root / "digits.keras", logits),
        "h5": (root / "digits_reg.h5", reg.predict(x, verbose=0)[:, 0]),
        "savedmodel": (root / "digits_savedmodel", logits),
        "zip": (root / "models.zip", logits),
        "clf": clf,
    }


@pytest.fixture(scope="module")
def df(digits):
    """id, features (array<float>[64]), head (array<double>[48]), p48..p63 (double), label (string)."""
    from conftest import spark_session

    spark = spark_session("local[2]")
    x, y = digits
    rows = [(i, x[i].tolist(), x[i, :48].astype(float).tolist(), *map(float, x[i, 48:]), str(y[i]))
            for i in range(len(x))]
    cols = ["id", "features", "head"] + [f"p{j}" for j in range(48, 64)] + ["label"]
    schema = ("id long, features array<float>, head array<double>, "
              + ", ".join(f"p{j} double" for j in range(48, 64)) + ", label string")
    # Shuffled over 3 partitions, so the rows reach the workers in an order unlike the ids.
    return spark.createDataFrame(rows, schema).select(*cols).repartition(3)


def _by_id(rows, col="prediction"):
    return {r["id"]: r[col] for r in rows}


def _assert_matches(rows, expected, col="prediction"):
    got = _by_id(rows, col)
    assert sorted(got) == list(range(len(expected))), "rows lost or duplicated"
    ids = np.arange(len(expected))
    np.testing.assert_allclose(np.array([got[i] for i in ids], dtype=np.float32), expected, atol=ATOL, rtol=1e-5)


# ------------------------------------------------------------------ predictions


def test_keras_file_predictions_equal_model_predict(spark, df, models):
    path, expected = models["keras"]
    preds = inference.predict(df, str(path), input_cols=["features"], batch_size=100)
    assert preds.schema["prediction"].dataType.simpleString() == "array<float>"
    assert preds.schema["prediction"].metadata == {"tfnb.batch_size": 100}
    assert preds.columns == df.columns + ["prediction"]
    rows = preds.collect()
    _assert_matches(rows, expected)
    # The other columns of each row came through untouched (identity, not just order).
    x = df.select("id", "features", "label").collect()
    want = {r["id"]: (list(r["features"]), r["label"]) for r in x}
    assert all((list(r["features"]), r["label"]) == want[r["id"]] for r in rows)


def test_keras3_file_predictions_equal_model_predict(spark, df, digits, tmp_path):
    """A .keras file Keras 3 saved (``import keras``; tf.keras is tf-keras here) is loaded by Keras 3."""
    import keras

    keras.utils.set_random_seed(4)  # untrained: its predictions tell the same, for less
    model = keras.Sequential([keras.layers.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    model.save(tmp_path / "digits3.keras")
    preds = inference.predict(df, str(tmp_path / "digits3.keras"), input_cols=["features"])
    assert preds.schema["prediction"].dataType.simpleString() == "array<float>"
    _assert_matches(preds.select("id", "prediction").collect(), model.predict(digits[0], verbose=0))


def test_savedmodel_from_array_and_scalar_columns(spark, df, models):
    path, expected = models["savedmodel"]
    cols = ["head"] + [f"p{j}" for j in range(48, 64)]  # 48 + 16 values per row, in model order
    rows = inference.predict(df, str(path), input_cols=cols, output_col="logits").select("id", "logits").collect()
    _assert_matches(rows, expected, col="logits")


def test_binary_columns_of_packed_values(spark, models, digits):
    """Rows packed as bytes, float32 values or one uint8 per value (image pixels), predict the same as
    the values they were packed from."""
    path, expected = models["keras"]
    x, _ = digits
    pixels = np.round(x * 16).astype(np.uint8)
    packed = spark.createDataFrame([(i, x[i].tobytes(), pixels[i].tobytes()) for i in range(len(x))],
                                   "id long, f32 binary, u8 binary").repartition(3)
    rows = inference.predict(packed, str(path), input_cols=["f32"], batch_size=100).select("id", "prediction")
    _assert_matches(rows.collect(), expected)
    rows = inference.predict(packed, str(path), input_cols=["u8"], output_col="p").select("id", "p").collect()
    _assert_matches(rows, models["clf"].predict(pixels.astype("float32"), verbose=0), col="p")


def test_single_unit_model_gives_a_float_column(spark, df, models):
    path, expected = models["h5"]
    preds = inference.predict(df, str(path), input_cols=["features"], batch_size=7)
    assert preds.schema["prediction"].dataType.simpleString() == "float"
    _assert_matches(preds.select("id", "prediction").collect(), expected)


def test_pyspark_without_arrow_udf_falls_back_to_map_in_arrow(spark, df, models, monkeypatch, capsys):
    """pyspark < 4.1 has no arrow_udf; the same call then runs through mapInArrow."""
    import pyspark.sql.functions as F

    monkeypatch.delattr(F, "arrow_udf")
    path, expected = models["keras"]
    preds = inference.predict(df, str(path), input_cols=["features"])
    preds.explain()
    assert "MapInArrow" in capsys.readouterr().out
    assert preds.columns == df.columns + ["prediction"]
    _assert_matches(preds.select("id", "prediction").collect(), expected)


def test_model_at_an_fsspec_url_is_downloaded_once_per_version(spark, df, models, tmp_path, monkeypatch):
    zip_path, expected = models["zip"]
    cache = tmp_path / "cache"
    monkeypatch.setenv("TFNB_MODEL_CACHE_DIR", str(cache))
    for name in ("digits.keras", "digits.keras", "digits_savedmodel"):
        url = f"zip://{name}::file://{zip_path}"  # an fsspec URL: a file, or a SavedModel directory, in a zip
        rows = inference.predict(df, url, input_cols=["features"]).select("id", "prediction").collect()
        _assert_matches(rows, expected)
    copies = [p for p in cache.rglob("digits.keras")]
    assert len(copies) == 1, copies
    assert len(list(cache.rglob("digits_savedmodel/saved_model.pb"))) == 1
    assert not list(cache.rglob(".part-*")), "partial downloads left behind"


def test_rewritten_model_file_is_loaded_again(spark, df, models, digits, tmp_path):
    x, y = digits
    path = tmp_path / "m.keras"
    shutil.copy(models["keras"][0], path)
    first = inference.predict(df, str(path), input_cols=["features"]).select("id", "prediction").collect()
    _assert_matches(first, models["keras"][1])
    other = _train(x, y, 10, seed=7)
    other.save(path)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))  # coarse-mtime filesystems
    second = inference.predict(df, str(path), input_cols=["features"]).select("id", "prediction").collect()
    _assert_matches(second, other.predict(x, verbose=0))


def test_batch_size_is_chosen_from_the_model_and_reported(spark, df, models, tmp_path):
    """Without batch_size: a whole Arrow batch per call for a small MLP, a power of two for a conv net."""
    import tf_keras

    old = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "300")
    try:
        preds = inference.predict(df, str(models["keras"][0]), input_cols=["features"])
        assert preds.schema["prediction"].metadata == {"tfnb.batch_size": 300}
        _assert_matches(preds.select("id", "prediction").collect(), models["keras"][1])
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", old)
    # Keras' MNIST convnet: ~39k float32 values per row over all its layers; 256 MiB hold 1730 rows: 1024.
    layers = tf_keras.layers
    cnn = tf_keras.Sequential([layers.Input((28, 28, 1)), layers.Conv2D(32, 3, activation="relu"),
                               layers.MaxPooling2D(), layers.Conv2D(64, 3, activation="relu"),
                               layers.MaxPooling2D(), layers.Flatten(), layers.Dense(10)])
    cnn.save(tmp_path / "cnn.keras")
    images = np.random.default_rng(0).random((40, 784), dtype=np.float32)
    frame = spark.createDataFrame([(i, images[i].tolist()) for i in range(40)], "id long, pixels array<float>")
    preds = inference.predict(frame, str(tmp_path / "cnn.keras"), input_cols=["pixels"])
    assert preds.schema["prediction"].metadata == {"tfnb.batch_size": 1024}
    _assert_matches(preds.collect(), cnn.predict(images.reshape(-1, 28, 28, 1), verbose=0))


def test_without_tensorflow_on_the_driver_each_worker_chooses(spark, df, models, monkeypatch):
    """A driver that cannot read the model (no TensorFlow) still predicts when output_type is given."""
    def no_tensorflow(*_):
        raise MissingDependencyError("No module named 'tensorflow'")

    monkeypatch.setattr(inference, "_describe", no_tensorflow)  # stands in for a driver without TensorFlow
    path, expected = models["keras"]
    preds = inference.predict(df, str(path), input_cols=["features"], output_type="array")
    assert preds.schema["prediction"].metadata == {}
    _assert_matches(preds.select("id", "prediction").collect(), expected)
    with pytest.raises(MissingDependencyError, match="tensorflow"):
        inference.predict(df, str(path), input_cols=["features"])


def test_model_is_loaded_once_per_python_worker(spark, df, models, tmp_path, monkeypatch):
    """Each Python worker loads the model once, however many batches, tasks and predict calls."""
    trace = tmp_path / "trace"
    trace.mkdir()
    path = tmp_path / "once.keras"  # a path no worker has cached yet, so every load shows in the trace
    shutil.copy(models["keras"][0], path)
    monkeypatch.setenv("TFNB_PREDICT_TRACE_DIR", str(trace))
    old = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        sc = spark.sparkContext
        sc.setJobGroup("tfnb-lazy", "predict must not run a job")
        preds = inference.predict(df, str(path), input_cols=["features"], batch_size=16)
        assert sc.statusTracker().getJobIdsForGroup("tfnb-lazy") == [], "predict ran a Spark job"
        assert not list(trace.iterdir()), "predict touched the workers before an action"
        sc.setJobGroup("tfnb-run", "predict")
        _assert_matches(preds.collect(), models["keras"][1])
        again = inference.predict(df.limit(500), str(path), input_cols=["features"])
        assert again.count() == 500 and len(again.select("prediction").collect()) == 500
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", old)
        sc.setLocalProperty("spark.jobGroup.id", None)
    loads, batches = Counter(), Counter()
    for f in trace.iterdir():
        for line in f.read_text().splitlines():
            kind, arg = line.split(" ", 1)
            if kind == "load":
                assert arg == str(path)
                loads[f.stem] += 1
            else:
                batches[f.stem] += 1
    assert loads, "no worker recorded a model load"
    assert set(batches) == set(loads), "a worker predicted without loading, or loaded without predicting"
    assert all(n == 1 for n in loads.values()), f"model loaded more than once in a worker: {loads}"
    assert sum(batches.values()) >= 1797 // 50, batches
    assert sum(batches.values()) > 4 * len(loads), (loads, batches)


def test_row_with_wrong_feature_count_fails_with_the_fix(spark, df, models):
    path, _ = models["keras"]
    preds = inference.predict(df, str(path), input_cols=["head"], output_type="array")
    with pytest.raises(Exception) as e:
        preds.collect()
    assert "expects 64 values per row" in str(e.value) and "['head'] give 48" in str(e.value)


@pytest.mark.parametrize("column, message", [
    ([[0.0] * 64, [0.0] * 63], "holds arrays of different lengths (63..64)"),
    ([[0.0] * 64, None], "has 1 null value(s)"),
    ([[0.0] * 63 + [None]], "has arrays with null elements"),
])
def test_ragged_or_null_inputs_are_refused_with_the_fix(column, message):
    """What a worker says about one Arrow batch it cannot turn into a matrix (no Spark job: a failing
    task costs a new Python worker and a TensorFlow import)."""
    import pyarrow as pa

    model = data_model._Model(call=None, input_shape=[64], input_dtype="float32", output_shapes=[[10]])
    with pytest.raises(ConfigError) as e:
        scoring._features([pa.array(column, pa.list_(pa.float64()))], ["f"], model)
    assert message in str(e.value) and "'f'" in str(e.value)


@pytest.mark.parametrize("column, message", [
    ([b"\0" * 10] * 2, "hold 10 bytes per row; the model's input (8, 8, 1) float32 needs 256 bytes of float32"
                        " (pack rows with ndarray.astype('float32').tobytes()) or 64 bytes of uint8"),
    ([b"\0" * 64, b"\0" * 63], "holds binary values of different lengths (63..64)"),
])
def test_packed_bytes_that_do_not_make_a_row_are_refused(column, message):
    import pyarrow as pa

    model = data_model._Model(call=None, input_shape=[8, 8, 1], input_dtype="float32", output_shapes=[[10]])
    with pytest.raises(ConfigError) as e:
        scoring._features([pa.array(column, pa.binary())], ["img"], model)
    assert message in str(e.value) and "'img'" in str(e.value)


def test_packed_columns_split_mid_value_are_refused():
    """Two binary columns whose bytes add up to the row but cut a float32 in two."""
    import pyarrow as pa

    model = data_model._Model(call=None, input_shape=[2], input_dtype="float32", output_shapes=[[1]])
    with pytest.raises(ConfigError, match=r"\['a', 'b'\] hold bytes that are not whole float32 values"):
        scoring._features([pa.array([b"\0" * 6]), pa.array([b"\0" * 2])], ["a", "b"], model)


# ------------------------------------------------------------------ bad arguments, caught on the driver


@pytest.mark.parametrize("kwargs, message", [
    ({"input_cols": ["nope"]}, "input column 'nope' is not in the DataFrame"),
    ({"input_cols": ["label"]}, "input column 'label' has type string"),
    ({"input_cols": "features"}, "must be a non-empty list of column names"),
    ({"input_cols": []}, "must be a non-empty list of column names"),
    ({"input_cols": ["features", "features"]}, "more than once"),
    ({"input_cols": ["features"], "output_col": "label"}, "output_col='label' already exists"),
    ({"input_cols": ["features"], "batch_size": 0}, "batch_size=0 must be an integer >= 1"),
    ({"input_cols": ["features"], "batch_size": True}, "batch_size=True must be an integer >= 1"),
    ({"input_cols": ["features"], "output_type": "double"}, "output_type='double' is not one of"),
])
def test_bad_arguments_name_the_fix(df, models, kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        inference.predict(df, str(models["keras"][0]), **kwargs)


def test_vector_column_suggests_vector_to_array(spark, models):
    from pyspark.ml.linalg import Vectors

    vec = spark.createDataFrame([(0, Vectors.dense([0.0] * 64))], ["id", "v"])
    with pytest.raises(ConfigError, match="vector_to_array"):
        inference.predict(vec, str(models["keras"][0]), input_cols=["v"])


def test_missing_model_path(df, tmp_path):
    with pytest.raises(ConfigError, match="does not exist on the driver"):
        inference.predict(df, str(tmp_path / "nope.keras"), input_cols=["features"])
    with pytest.raises(ConfigError, match="does not exist"):
        inference.predict(df, f"zip://nope.keras::file://{tmp_path}/none.zip", input_cols=["features"])


def test_url_without_its_filesystem_package(df, no_gcsfs):
    pytest.importorskip("fsspec")
    with pytest.raises(MissingDependencyError, match="gcsfs"):
        inference.predict(df, "gs://bucket/model.keras", input_cols=["features"])


def test_file_that_is_not_a_model(df, tmp_path):
    bogus = tmp_path / "bogus.keras"
    bogus.write_text("not a model")
    with pytest.raises(ConfigError, match="cannot load the model"):
        inference.predict(df, str(bogus), input_cols=["features"])


def test_model_description_in_a_subprocess_matches_in_process(models):
    """The driver reads the output shape in a subprocess when it has not imported TensorFlow."""
    path = str(models["keras"][0])  # one TensorFlow import in a subprocess; the loaders are shared
    assert data_model._describe_in_subprocess(path) == data_model._load(path, threads=None).describe()


# ------------------------------------------------------------------ Spark Connect


@pytest.mark.slow
def test_predict_on_spark_connect(models, digits):
    """The same call works on a Spark Connect session (DataFrame API only, no SparkContext)."""
    from conftest import spark_connect

    x, _ = digits
    with spark_connect() as client:
        cdf = client.createDataFrame([(i, x[i].tolist()) for i in range(200)], "id long, features array<float>")
        path, expected = models["keras"]
        rows = inference.predict(cdf, str(path), input_cols=["features"]).collect()
        _assert_matches(rows, expected[:200])
        with pytest.raises(ConfigError, match="output_col='id' already exists"):
            inference.predict(cdf, str(path), input_cols=["features"], output_col="id")
