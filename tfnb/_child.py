"""The process that runs ``train_fn``: one fresh Python per task and attempt.

A fresh process per run is what makes ``tfnb.run`` rerunnable in one Spark
session (TensorFlow configures collective ops once per process) and lets the
supervising task capture its output and kill it as a group.

Usage (by tfnb._worker only): ``python -m tfnb._child WORKDIR``. WORKDIR holds
``payload.pkl`` (train_fn, args, ctx, mode); this process writes ``result.pkl``
or ``error.json`` there. Its stdin is a pipe from the supervisor that is never
written: end-of-file means the supervisor died, and this process group exits.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import traceback

PAYLOAD, RESULT, ERROR = "payload.pkl", "result.pkl", "error.json"
ENV_HELD_PORT_FD = "TFNB_HELD_PORT_FD"


def _die_with_parent() -> None:
    def watch():
        try:
            while os.read(0, 1024):
                pass
        except OSError:
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="tfnb-parent-watch", daemon=True).start()


def _release_port() -> None:
    """Close the socket that kept this task's TensorFlow port reserved, right before TF binds it."""
    fd = os.environ.pop(ENV_HELD_PORT_FD, None)
    if fd:
        try:
            os.close(int(fd))
        except OSError:
            pass


def _write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _type_name(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ in ("builtins", "__main__") else f"{t.__module__}.{t.__qualname__}"


def _serve_forever(ctx) -> None:
    """ps and worker tasks of a ParameterServerStrategy cluster: run a TF server until told to stop."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc", start=True,
    )
    print(f"tfnb: {ctx.job_name} {ctx.task_index} serving at {server.target}", flush=True)
    server.join()


def main(workdir: str) -> int:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    _die_with_parent()
    try:
        import cloudpickle

        with open(os.path.join(workdir, PAYLOAD), "rb") as f:
            payload = cloudpickle.load(f)
        ctx = payload["ctx"]
        if payload["mode"] == "serve":
            _release_port()
            _serve_forever(ctx)
            result = None
        else:
            fn, args = payload["fn"], payload["args"]
            _release_port()
            result = fn(ctx, *args)
        try:
            data = cloudpickle.dumps(result)
        except Exception as e:  # noqa: BLE001 - any pickling failure means the same fix
            raise TypeError(
                f"train_fn returned a {type(result).__name__} that cannot be pickled ({e}); return plain "
                "values (numbers, dicts, lists, numpy arrays) and save models to model_dir instead"
            ) from e
        _write_atomic(os.path.join(workdir, RESULT), data)
        code = 0
    except BaseException as e:  # noqa: BLE001 - every failure must reach the driver
        info = {"exc_type": _type_name(e), "message": str(e), "traceback": traceback.format_exc()}
        try:
            _write_atomic(os.path.join(workdir, ERROR), json.dumps(info).encode())
        except OSError:
            pass
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # TensorFlow leaves non-daemon threads behind that can block a normal interpreter exit.
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1])
