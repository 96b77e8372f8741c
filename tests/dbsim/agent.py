"""PID 1 of one simulated cluster: run as ``unshare --mount --pid --fork --propagation private -- python
agent.py SPEC.json`` by the controller (``dbsim.Cluster``). Stdlib only.

It builds the cluster's view of the file system in its private mount namespace and stays as the
namespace's init until its standard input closes (the controller closing it, or dying). When it exits,
the kernel kills every process of the PID namespace, so nothing a simulated notebook started (Spark
JVMs, Python workers, their children) can outlive the cluster.

The view: a tmpfs root holding a bind mount of every top-level entry of the machine's ``/`` (same paths
as outside, so the controller and the notebooks name files alike), a fresh ``/proc`` for the namespace,
and what a Databricks driver has and this machine has not:

* ``/Volumes`` read-only, with each volume ``/Volumes/<catalog>/<schema>/<volume>`` a writable bind of a
  folder of the cluster's temp folder (writing beside a volume fails, as it does on Databricks);
* ``/dbfs`` (only when the workspace has a DBFS root) and ``/Workspace``, writable binds likewise;
* a home folder and a ``/tmp`` of the driver's own (with what every machine shares bound into the home:
  the cluster's folder, the runtime's interpreter, pip's cache and configuration), and an empty folder
  over the checkout of the tests.

Nothing is mounted or created outside the namespace.

SPEC: ``{"root": mount point (an empty folder), "pre": [[source, target, read_only], ...],
"binds": [[source, path inside, read_only, recursive], ...]}``: ``pre`` binds are made first, at machine
paths (they put what a machine shares into the folder that becomes its home), ``binds`` after the root is
built, in order.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys


def _mount(*args: str) -> None:
    res = subprocess.run(["mount", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"dbsim agent: mount {' '.join(args)} failed: {res.stderr.strip()}")


def _bind(src: str, dst: str, read_only: bool, recursive: bool = False) -> None:
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    elif not os.path.exists(dst):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "w").close()
    _mount("--rbind" if recursive else "--bind", src, dst)
    if read_only:
        _mount("-o", "remount,bind,ro", dst)


def build_root(root: str, pre: list[list], binds: list[list]) -> None:
    for src, dst, read_only in pre:
        _bind(src, dst, read_only)
    _mount("-t", "tmpfs", "-o", "mode=755", "dbsim-root", root)
    for name in sorted(os.listdir("/")):
        if name == "proc":
            continue
        src, dst = "/" + name, os.path.join(root, name)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif os.path.isdir(src):
            os.mkdir(dst)
            _mount("--rbind", src, dst)
        else:
            open(dst, "w").close()
            _mount("--bind", src, dst)
    os.mkdir(os.path.join(root, "proc"))
    _mount("-t", "proc", "proc", os.path.join(root, "proc"))
    for host, inside, read_only, recursive in binds:
        _bind(host, os.path.join(root, inside.lstrip("/")), read_only, recursive)


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    build_root(spec["root"], spec["pre"], spec["binds"])
    os.chroot(spec["root"])
    os.chdir("/")
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    stdin = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([stdin], [], [], 0.1)
        if ready and not os.read(stdin, 4096):
            break  # the controller closed our stdin or died: end the cluster
        while True:  # reap orphans re-parented to us (we are the namespace's init)
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break


if __name__ == "__main__":
    main()
