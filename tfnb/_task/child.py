"""The process that runs ``train_fn``, one per task and attempt (TensorFlow configures collective ops once per
process): started fresh or forked by a warm standby, both in :func:`run`. It imports TensorFlow,
waits for ``go``, runs train_fn and writes its result or error; with ``linger`` its TF server stays up until ``end``."""
from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import sys
import threading
import traceback

from .._config import use_settings
from .._protocol import (CONTEXT, DUMP_SIGNAL, END, ENV_HELD_PORT_FD, ENV_PREIMPORT, ERROR, FINISHED, GO, PAYLOAD,
                         RESULT, STACKS)
from ..storage import atomic_write
from .setup import ENV_SUPERVISOR


def prctl(option: int, arg) -> None:  # Linux's prctl(2); nothing where libc has none
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None).prctl(option, arg, 0, 0, 0)


def _die_with_supervisor() -> None:
    """The kernel SIGKILLs a fresh process when its supervisor's thread ends: :func:`_watch_parent` cannot act in a
    stopped process (SIGSTOP). A forked one has its standby for that."""
    expected = os.environ.pop(ENV_SUPERVISOR, None)
    if expected:
        prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != int(expected):  # it ended before the line above
            os.killpg(os.getpgrp(), signal.SIGKILL)


def _watch_parent(fd: int) -> tuple[threading.Event, threading.Event]:
    """Events set when the supervisor says go / end on ``fd``; kills this process group if it dies first."""
    go, end = threading.Event(), threading.Event()

    def watch():
        buf = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(fd, 1024):
                buf += chunk
                if GO in buf:
                    go.set()
                if END in buf:
                    end.set()
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="tfnb-parent-watch", daemon=True).start()
    return go, end


def _preimport() -> None:
    for name in filter(None, os.environ.get(ENV_PREIMPORT, "").split(",")):
        with contextlib.suppress(Exception):  # train_fn will hit (and report) the same error itself
            __import__(name)


class _KerasWatch:
    """Import hook: as train_fn imports Keras 3 or tf-keras, tfnb._task.keras3 / legacy_keras corrects it for
    tf.distribute before train_fn sees it (never imported here: it costs seconds)."""

    def __init__(self):
        self.waiting = {"keras", "tf_keras"}

    def find_spec(self, name, path=None, target=None):
        if name not in self.waiting:
            return None
        import importlib.machinery

        # asked by importlib.util.find_spec too (TensorFlow does, before importing Keras): stay until Keras runs
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = getattr(spec and spec.loader, "exec_module", None)
        if exec_module is not None:
            def run_then_install(module):
                self.waiting.discard(name)
                if not self.waiting:
                    with contextlib.suppress(ValueError):
                        sys.meta_path.remove(self)
                exec_module(module)
                _install(name, module)
            spec.loader.exec_module = run_then_install
        return spec


def _install(name: str, module) -> None:
    import importlib

    importlib.import_module(".keras3" if name == "keras" else ".legacy_keras", __package__).install(module)


def serve_forever(ctx) -> None:
    """ps and worker tasks of a ParameterServerStrategy cluster: run a TF server until told to stop."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    print(f"tfnb: {ctx.job_name} {ctx.task_index} serving at {server.target}", flush=True)
    server.join()


def prepare() -> None:
    """Before train_fn imports anything: Keras made ready for tf.distribute (see _KerasWatch)."""
    watch = _KerasWatch()
    for name in list(watch.waiting):
        if name in sys.modules:
            _install(name, sys.modules[name])
            watch.waiting.discard(name)
    if watch.waiting:
        sys.meta_path.insert(0, watch)


def run(workdir: str, fd: int, fresh: bool = False) -> None:
    """Run train_fn once told go on ``fd``: a ``fresh`` process' stdin, or the connection of a warm standby, which
    prepared and imported."""
    if fresh:
        _die_with_supervisor()
        prepare()
    go, end = _watch_parent(fd)
    # the stall watchdog's stack dump: faulthandler writes from its C signal handler, even while stuck in C code
    stacks = open(os.path.join(workdir, STACKS), "a")  # kept open: faulthandler writes to its descriptor
    faulthandler.register(DUMP_SIGNAL, file=stacks, all_threads=True)
    faulthandler.enable()  # segfaults in native code print the Python stack to stderr, forwarded as logs
    try:
        import cloudpickle

        with open(os.path.join(workdir, PAYLOAD), "rb") as f:
            payload = cloudpickle.load(f)
        if fresh:
            _preimport()
        go.wait()
        with open(os.path.join(workdir, CONTEXT), "rb") as f:
            ctx = cloudpickle.load(f)
        os.environ["TF_CONFIG"] = json.dumps(ctx.tf_config)
        use_settings(ctx.settings)  # settings resolve as on the driver, not from this executor's environment
        held = os.environ.pop(ENV_HELD_PORT_FD, None)  # the socket keeping TF's port reserved: TF binds it next
        if held:
            with contextlib.suppress(OSError):
                os.close(int(held))
        result = payload["fn"](ctx, *payload["args"], **payload["kwargs"])
        try:
            data = cloudpickle.dumps(result)
        except Exception as e:  # noqa: BLE001 - any pickling failure means the same fix
            raise TypeError(
                f"train_fn returned a {type(result).__name__} that cannot be pickled ({e}); return plain "
                "values (numbers, dicts, lists, numpy arrays) and save models to model_dir instead"
            ) from e
        atomic_write(os.path.join(workdir, RESULT), data)
        if payload.get("linger"):
            # a peer may still be in its last collective with this TensorFlow server: exiting would abort it
            from .events import emit

            emit(FINISHED)
            end.wait()
        code = 0
    except BaseException as e:  # noqa: BLE001 - every failure must reach the driver
        from .resize import found_in

        e = found_in(e) or e  # an elastic run's stop at an epoch boundary, even re-raised as train_fn's own error
        t = type(e)
        name = t.__qualname__ if t.__module__ in ("builtins", "__main__") else f"{t.__module__}.{t.__qualname__}"
        info = {"exc_type": name, "message": str(e), "traceback": traceback.format_exc()}
        with contextlib.suppress(OSError):
            atomic_write(os.path.join(workdir, ERROR), json.dumps(info).encode())
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    _remove_generated_sources()
    # TensorFlow leaves non-daemon threads behind that can block a normal interpreter exit.
    os._exit(code)


def _remove_generated_sources() -> None:  # autograph removes its temporary files at an exit os._exit skips
    for name, module in list(sys.modules.items()):
        if name.startswith("__autograph_generated_file"):
            with contextlib.suppress(OSError, TypeError):
                os.unlink(module.__file__)
