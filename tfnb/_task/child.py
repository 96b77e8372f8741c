"""The process that runs ``train_fn``: one fresh Python per task and attempt.

A fresh process per run is what makes ``tfnb.run`` rerunnable in one Spark session (TensorFlow
configures collective ops once per process) and lets the supervising task capture its output and
kill it as a group.

Started by tfnb._task.supervisor only: ``python -c <_CHILD_MAIN> WORKDIR``, which calls :func:`main`; or forked
by a warm standby that a later task claims (see tfnb._task.warm), which calls :func:`run_claimed`. The supervisor
starts this process as soon as its task starts, so that importing TensorFlow (seconds) overlaps the tasks'
address exchange. WORKDIR holds ``payload.pkl`` (train_fn,
args, mode) from the start; once the cluster is known the supervisor writes ``ctx.pkl`` and sends
``go`` on stdin. This process then sets TF_CONFIG and runs train_fn, writing ``result.pkl`` or
``error.json``; with ``linger`` in the payload it then sends a ``finished`` event and stays up (its
TensorFlow server with it) until the supervisor sends ``end``, once every task's train_fn has
returned. End-of-file on stdin means the supervisor died, and this process group exits.
"""
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


ENV_SUPERVISOR = "TFNB_SUPERVISOR_PID"  # set by tfnb._task.supervisor for a fresh process: the pid it started from


def _die_with_supervisor() -> None:
    """A fresh process: the kernel SIGKILLs it when its supervisor's thread ends, since :func:`_watch_parent`
    cannot act in a stopped process (SIGSTOP: a debugger, kill -STOP, a cgroup freezer). A process forked by a
    warm standby has the standby for that (tfnb._task.warm)."""
    expected = os.environ.pop(ENV_SUPERVISOR, None)
    if not expected or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):  # no libc prctl: the parent watch alone
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != int(expected):  # it ended before the line above
        os.killpg(os.getpgrp(), signal.SIGKILL)


def _watch_parent(fd: int = 0) -> tuple[threading.Event, threading.Event]:
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
    """Import hook: when train_fn imports Keras 3 (``import keras``), tfnb._task.keras3 corrects it for
    tf.distribute (or, for an untested version, makes ``fit`` refuse) before train_fn sees it; when it imports
    tf-keras (``tf.keras`` with TF_USE_LEGACY_KERAS=1), tfnb._task.legacy_keras does. Either is imported only if
    train_fn does (it costs seconds)."""

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
                _INSTALL[name](module)
            spec.loader.exec_module = run_then_install
        return spec


def _install_keras3(keras) -> None:
    from .keras3 import install

    install(keras)


def _install_legacy(tf_keras) -> None:
    from .legacy_keras import install

    install(tf_keras)


_INSTALL = {"keras": _install_keras3, "tf_keras": _install_legacy}


def _serve_forever(ctx) -> None:
    """ps and worker tasks of a ParameterServerStrategy cluster: run a TF server until told to stop."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    print(f"tfnb: {ctx.job_name} {ctx.task_index} serving at {server.target}", flush=True)
    server.join()


def prepare() -> None:
    """What every train_fn process does before it imports anything: Keras 3 made ready for tf.distribute (see
    _KerasWatch)."""
    watch = _KerasWatch()
    for name, install in _INSTALL.items():
        if name in sys.modules:
            install(sys.modules[name])
            watch.waiting.discard(name)
    if watch.waiting:
        sys.meta_path.insert(0, watch)


def main(argv: list[str]) -> None:
    """A fresh process: ``argv`` is ``[WORKDIR]``; go and end come on stdin."""
    _die_with_supervisor()
    prepare()
    _run(argv[0], *_watch_parent(), preimport=True)


def run_claimed(conn, workdir: str) -> None:
    """A process forked by a warm standby (already prepared and imported); go and end come on ``conn``."""
    _run(workdir, *_watch_parent(conn.fileno()), preimport=False)


def _run(workdir: str, go: threading.Event, end: threading.Event, preimport: bool) -> None:
    # The stall watchdog asks for every thread's stack: faulthandler writes from its C signal handler, so the
    # dump works even while the main thread is stuck in C code (a sleep, a blocking TensorFlow op).
    stacks = open(os.path.join(workdir, STACKS), "a")  # kept open: faulthandler writes to its descriptor
    faulthandler.register(DUMP_SIGNAL, file=stacks, all_threads=True)
    faulthandler.enable()  # segfaults in native code print the Python stack to stderr, forwarded as logs
    try:
        import cloudpickle

        with open(os.path.join(workdir, PAYLOAD), "rb") as f:
            payload = cloudpickle.load(f)
        if preimport:
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
        if payload["mode"] == "serve":
            _serve_forever(ctx)
            result = None
        else:
            result = payload["fn"](ctx, *payload["args"], **payload.get("kwargs", {}))
        try:
            data = cloudpickle.dumps(result)
        except Exception as e:  # noqa: BLE001 - any pickling failure means the same fix
            raise TypeError(
                f"train_fn returned a {type(result).__name__} that cannot be pickled ({e}); return plain "
                "values (numbers, dicts, lists, numpy arrays) and save models to model_dir instead"
            ) from e
        atomic_write(os.path.join(workdir, RESULT), data)
        if payload.get("linger"):
            # A peer may still be in its last collective with this process' TensorFlow server:
            # exiting now would abort it ("Socket closed"). Wait until every train_fn has returned.
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


def _remove_generated_sources() -> None:
    """TensorFlow's autograph writes a temporary ``__autograph_generated_file*.py`` for each function it converts
    and removes it at interpreter exit, which ``os._exit`` skips: without this, every run would leave them in
    the executor's temporary folder."""
    for name, module in list(sys.modules.items()):
        if name.startswith("__autograph_generated_file"):
            with contextlib.suppress(OSError, TypeError):
                os.unlink(module.__file__)


if __name__ == "__main__":
    main(sys.argv[1:])
