"""``python -m tfnb``, as a user types it: help, a wrong command, ``stage`` against a real S3 server on
loopback; and ``./dev demo``'s program (``python -m tools.demo``): a real two-worker run on scikit-learn's digits."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

from components import need
from s3server import put_tree

USAGE = "usage: python -m tfnb stage SRC DEST [--index I --count N]\n"
ROOT = Path(__file__).resolve().parent.parent


def tfnb_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfnb", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_help_and_an_unknown_command(tmp_path):
    for args in (["--help"], ["-h"]):
        done = tfnb_cli(*args, cwd=tmp_path)
        assert (done.returncode, done.stderr) == (0, "") and done.stdout.startswith(USAGE), (args, done)
        assert "./dev demo" in done.stdout and "./dev dbc" in done.stdout
    done = tfnb_cli(cwd=tmp_path)                        # no command: a usage error
    assert (done.returncode, done.stdout) == (2, "") and done.stderr.startswith(USAGE), done
    done = tfnb_cli("train", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "tfnb: unknown command 'train'; try: python -m tfnb stage --help\n"
    done = tfnb_cli("demo", cwd=tmp_path)                # a developer tool: it says where it lives
    assert done.returncode == 2 and "demo is a developer tool of the tfnb repository: run ./dev demo" in done.stderr
    script = Path(sysconfig.get_path("scripts")) / "tfnb"  # the console script pip installed
    need("the tfnb console script", script.is_file(), "pip install -e . (./dev does)")
    done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith(USAGE), done


def test_stage_copies_one_shard_and_reports_a_missing_bucket(rclone_s3, tmp_path):
    bucket = f"cli-{uuid.uuid4().hex[:8]}"
    files = {f"train/part-{i}.bin": bytes([i]) * (1000 * (i + 1)) for i in range(4)}
    put_tree(rclone_s3.client(), bucket, files)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=rclone_s3.access_key, AWS_SECRET_ACCESS_KEY=rclone_s3.secret_key,
               AWS_REGION="us-east-1")
    shards = []
    for index in (0, 1):
        dest = tmp_path / f"shard{index}"
        done = tfnb_cli("stage", f"s3://{bucket}/train", str(dest), "--index", str(index), "--count", "2",
                        "--endpoint-url", rclone_s3.endpoint_url, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        got = {p.name: p.read_bytes() for p in dest.iterdir() if not p.name.startswith(".")}
        assert re.fullmatch(rf"shard {index}/2 of s3://{bucket}/train: {len(got)} files \(.*\) in {dest}; "
                            rf"downloaded {len(got)} \(.*\), 0 already complete; .* MB/s\n", done.stdout), done.stdout
        shards.append(got)
    assert shards[0].keys().isdisjoint(shards[1]) and {**shards[0], **shards[1]} == {
        k.removeprefix("train/"): v for k, v in files.items()}
    done = tfnb_cli("stage", "s3://no-such-bucket/train", str(tmp_path / "none"),
                    "--endpoint-url", rclone_s3.endpoint_url, cwd=tmp_path, env=env)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("tfnb stage: bucket 'no-such-bucket' does not exist at http://127.0.0.1:"), \
        done.stderr
    assert not (tmp_path / "none").exists() or not any((tmp_path / "none").iterdir())


def test_demo_trains_two_workers_and_writes_what_it_says(tmp_path):
    out = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-m", "tools.demo", "--workers", "2", "--epochs", "1", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = dict(re.findall(r"^  (test accuracy|model|checkpoints|tensorboard) +: (.*)$", done.stdout, re.M))
    assert "tfnb demo: 2 workers, 1 epochs on scikit-learn digits" in done.stdout, done.stdout
    accuracy = float(re.fullmatch(r"(0\.\d{3})  \(chance is 0\.100\)", said["test accuracy"]).group(1))
    assert said["model"] == f"{out}/model/model.keras" and said["checkpoints"] == f"{out}/model"
    assert said["tensorboard"] == f"tensorboard --logdir {out}/logs"
    assert (out / "model" / "ckpt-1.weights.h5").is_file()            # the checkpoint of its one epoch
    assert list((out / "logs" / "train").glob("events.out.tfevents.*")), "no TensorBoard events"
    # the saved model is the trained one, and the accuracy printed is on all 360 held-out digits
    import keras  # Keras 3, what the demo trains with
    import numpy as np

    from tools.demo import load_digits_split

    _, _, x_test, y_test = load_digits_split()
    logits = keras.models.load_model(said["model"]).predict(x_test, verbose=0)
    assert f"{np.mean(np.argmax(logits, axis=1) == y_test):.3f}" == f"{accuracy:.3f}" and accuracy > 0.5
