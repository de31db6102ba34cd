"""Floods against one simulated node: how fast /metrics and /healthz answer while each runs,
and whether the daemon's memory comes back afterwards.

    .venv/bin/python bench/flood.py [--tree PATH] [--seconds 15]

`--tree` runs the daemon from another checkout (its `gpuwatch` package; run the bench with a
Python that has that checkout installed, for its dependencies), for numbers before a
change. The daemon runs a healthy 8-GPU node with basic auth on its listener, a textfile
directory and a push token; under each flood a prober fetches /metrics and /healthz on a new
connection every 100 ms (a prober that gets no answer in 5 s counts a failure). RSS is read
from /proc after the warm-up, `--settle` seconds after each flood ends, and `--final-settle`
seconds after the last; the store keeps 1 m and pushed series go stale after 10 s, so what
remains then is what the floods left behind. The jobs push `flood_value`, which no rule reads:
the store keeps a series a rule reads back for as long as the rule reads (`train_step`, 10 m
of it read by TrainingStalled, is kept 15 m), which would be retention, not a leak.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import multiprocessing
import os
import platform
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import bcrypt

USER, PASSWORD = "prometheus", "bench-password"
TOKEN = "bench-push-token"
SERVING = re.compile(r"gpuwatch serving on ([\d.]+):(\d+)")
SIM_HOST = re.compile(r"simulated host \(.*\) under (\S+?)\"")


def auth(password: str) -> dict[str, str]:
    token = base64.b64encode(f"{USER}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


GOOD = auth(PASSWORD)


def get(url: str, headers: dict[str, str], timeout: float = 5.0) -> int:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


class Daemon:
    def __init__(self, tree: Path, work: Path) -> None:
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
        (work / "web.yaml").write_text(f"basic_auth_users:\n  {USER}: '{hashed}'\n")
        self.textfiles = work / "textfiles"
        self.textfiles.mkdir()
        (work / "gpuwatch.yaml").write_text(
            "store:\n  retention: 1m\n"
            f"push:\n  textfile_dir: {self.textfiles}\n  token: {TOKEN}\n  max_series: 20000\n"
            "  stale_after: 10s\n"
        )
        self.state = work / "state"
        self.log_path = log_path = work / "daemon.log"
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
        # systemd's default soft limit on descriptors, as a unit without LimitNOFILE has it.
        trampoline = (
            "import os, resource, sys; "
            "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)); "
            "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
        )
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    trampoline,
                    "-m",
                    "gpuwatch",
                    "run",
                    "--listen",
                    "127.0.0.1:0",
                    "--state-dir",
                    str(self.state),
                    "--simulate",
                    "healthy",
                    "-c",
                    str(work / "gpuwatch.yaml"),
                    "--web-config",
                    str(work / "web.yaml"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=work,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = SERVING.search(log_path.read_text())
            if found:
                self.host, self.port = found.group(1), int(found.group(2))
                self.url = f"http://{self.host}:{self.port}"
                return
            time.sleep(0.1)
        raise SystemExit(f"daemon did not start:\n{log_path.read_text()}")

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


class Prober:
    """/metrics and /healthz, alternately, on a new connection every 100 ms, from a process of
    its own: a flood's hundreds of threads in this process would hold the GIL and delay the
    prober, and the numbers would be the bench's, not the daemon's."""

    def __init__(self, url: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._results, sender = context.Pipe(duplex=False)
        self._process = context.Process(target=_probe, args=(url, self._stop, sender))
        self.latencies: dict[str, list[float]] = {}
        self.failures = 0

    def __enter__(self) -> Prober:
        self._process.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self.latencies, self.failures = self._results.recv()
        self._process.join()


def _probe(url: str, stop: EventType, results: Connection) -> None:
    latencies: dict[str, list[float]] = {"/metrics": [], "/healthz": []}
    failures = 0
    paths = ("/metrics", "/healthz")
    i = 0
    while not stop.is_set():
        started = time.monotonic()
        path = paths[i % 2]
        status = get(url + path, GOOD)
        elapsed = time.monotonic() - started
        if status == 200:
            latencies[path].append(elapsed)
        else:
            failures += 1
        i += 1
        stop.wait(max(0.0, 0.1 - elapsed))
    results.send((latencies, failures))


def p(values: list[float], q: float) -> float:
    """The q-quantile in milliseconds (nearest rank); q=1 is the maximum."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


# -- the floods: each runs for `seconds`, then cleans up -----------------------------------


def idle_connections(d: Daemon, seconds: float) -> None:
    socks = []
    for _ in range(1100):
        with contextlib.suppress(OSError):
            socks.append(socket.create_connection((d.host, d.port), timeout=5))
    time.sleep(seconds)
    for s in socks:
        s.close()


def wrong_passwords(d: Daemon, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    with ThreadPoolExecutor(300) as pool:
        n = 0
        while time.monotonic() < deadline:
            batch = [
                pool.submit(get, d.url + "/healthz", auth(f"guess-{n + i}"), 30.0)
                for i in range(300)
            ]
            n += 300
            for f in batch:
                f.result()


def sse_never_read(d: Daemon, seconds: float) -> None:
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    socks = []
    for _ in range(200):
        with contextlib.suppress(OSError):
            s = socket.create_connection((d.host, d.port), timeout=5)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            head = f"GET /api/v1/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {token}"
            s.sendall(f"{head}\r\n\r\n".encode())
            socks.append(s)
    time.sleep(seconds)
    for s in socks:
        s.close()


def push(url: str, body: bytes, content_type: str) -> None:
    """One push with the token; a refusal or a timeout is part of the flood, not an error."""
    request = urllib.request.Request(
        url, body, {"Authorization": f"Bearer {TOKEN}", "Content-Type": content_type}
    )
    with contextlib.suppress(OSError):
        urllib.request.urlopen(request, timeout=30).read()


def big_pushes(d: Daemon, seconds: float) -> None:
    body = "".join(f'loss{{rank="{i}"}} 1\n' for i in range(100_000)).encode()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        push(f"{d.url}/api/v1/push?job=big", body, "text/plain")


def textfiles(d: Daemon, seconds: float) -> None:
    for i in range(10_000):
        (d.textfiles / f"job{i:05d}.prom").write_text(f'flood_value{{rank="0"}} {i}\n')
    time.sleep(seconds)
    shutil.rmtree(d.textfiles)
    d.textfiles.mkdir()


def many_jobs(d: Daemon, seconds: float) -> None:
    def push_job(i: int) -> None:
        body = json.dumps({"job": f"job{i}", "metrics": {"flood_value": i}}).encode()
        push(f"{d.url}/api/v1/push", body, "application/json")

    deadline = time.monotonic() + seconds
    with ThreadPoolExecutor(16) as pool:
        i = 0
        while time.monotonic() < deadline and i < 10_000:
            list(pool.map(push_job, range(i, i + 500)))
            i += 500


def nothing(d: Daemon, seconds: float) -> None:
    time.sleep(seconds)


XID_LINE = "NVRM: Xid (PCI:0000:2a:00): 13, pid=4242, name=python3, Graphics SM Warp Exception"


def xid_storm(d: Daemon, seconds: float) -> None:
    """100,000 XID 13s in one write to the simulated node's kernel log (GPU 1's address): an
    application faulting in a loop."""
    found = SIM_HOST.search(d.log_path.read_text())
    if found is None:
        raise SystemExit("the daemon did not log its simulated host's directory")
    records = "".join(f"4,{10**13 + i},1,-;{XID_LINE}\n" for i in range(100_000))
    with open(Path(found.group(1)) / "kmsg", "a", encoding="utf-8") as log:
        log.write(records)
    time.sleep(seconds)


FLOODS: dict[str, Callable[[Daemon, float], None]] = {
    "none (baseline)": nothing,
    "1100 idle connections": idle_connections,
    "300 wrong passwords at once": wrong_passwords,
    "200 SSE readers that never read": sse_never_read,
    "100k-series pushes": big_pushes,
    "10,000 textfiles": textfiles,
    "10,000 jobs pushing": many_jobs,
    "100,000 XIDs in the kernel log": xid_storm,
}


@contextlib.contextmanager
def more_descriptors() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--seconds", type=float, default=15.0, help="each flood's length")
    parser.add_argument("--warmup", type=float, default=90.0)
    parser.add_argument("--settle", type=float, default=20.0, help="after each flood")
    parser.add_argument(
        "--final-settle",
        type=float,
        default=150.0,
        help="after the last flood: 10 s to go stale, 1 m kept, a retention sweep a minute",
    )
    parser.add_argument("--only", nargs="*", default=list(FLOODS))
    parser.add_argument(
        "--control",
        action="store_true",
        help="run a second daemon beside, probed alike and never flooded: the store fills "
        "its retention windows for an hour, and its RSS says how much of the growth is that",
    )
    args = parser.parse_args()
    machine = f"{platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}"
    print(
        f"machine: {machine}; daemon from {args.tree}; {args.seconds:g}s per flood, "
        "daemon fd limit 1024"
    )
    with tempfile.TemporaryDirectory() as tmp, more_descriptors():
        (Path(tmp) / "flooded").mkdir()
        d = Daemon(args.tree, Path(tmp) / "flooded")
        control: Daemon | None = None
        if args.control:
            (Path(tmp) / "control").mkdir()
            control = Daemon(args.tree, Path(tmp) / "control")
        try:
            time.sleep(args.warmup)  # the store fills its retention window, rules settle
            start_rss = d.rss_mib()
            print(f"RSS after {args.warmup:g}s of warm-up: {start_rss:.1f} MiB")
            if control is not None:
                control_start = control.rss_mib()
                print(f"control's RSS then: {control_start:.1f} MiB")
            print(
                f"{'flood':32} {'probes':>6} {'fail':>4}  {'/metrics p50/p99/max ms':>23}  "
                f"{'/healthz p50/p99/max ms':>23}  {'RSS after':>9}"
            )
            for name in args.only:
                with Prober(d.url) as prober, contextlib.ExitStack() as beside:
                    if control is not None:
                        beside.enter_context(Prober(control.url))
                    FLOODS[name](d, args.seconds)
                time.sleep(args.settle)
                counts = sum(len(v) for v in prober.latencies.values()) + prober.failures
                cells = [
                    "/".join(f"{x:.0f}" for x in (p(lat, 0.5), p(lat, 0.99), p(lat, 1.0)))
                    for lat in prober.latencies.values()
                ]
                beside_rss = "" if control is None else f"  control {control.rss_mib():.1f}M"
                print(
                    f"{name:32} {counts:6d} {prober.failures:4d}  {cells[0]:>23}  "
                    f"{cells[1]:>23}  {d.rss_mib():8.1f}M{beside_rss}",
                    flush=True,
                )
            time.sleep(args.final_settle)
            end_rss = d.rss_mib()
            print(
                f"RSS {args.final_settle:g}s after the last flood: {end_rss:.1f} MiB "
                f"({end_rss / start_rss - 1:+.0%} of the RSS after warm-up)"
            )
            if control is not None:
                control_end = control.rss_mib()
                print(
                    f"control's RSS then: {control_end:.1f} MiB "
                    f"({control_end / control_start - 1:+.0%} of its own after warm-up); "
                    f"the floods left {end_rss - control_end:+.1f} MiB beside it "
                    f"({(end_rss - control_end) / start_rss:+.0%})"
                )
        finally:
            d.stop()
            if control is not None:
                control.stop()


if __name__ == "__main__":
    main()
