"""The daemon's own cost: CPU share of one core and RSS at 1 Hz sampling, scraped every 5 s.

Runs `gpuwatch run --simulate` (the same NVML source code as production, through the real
pynvml, over the simulated NVML library) for 8, 64 and 256 GPUs, with `--ib-ports`
InfiniBand ports (default 8) and `--nvswitches` NVSwitches (default 0) in the simulated sysfs
and the simulated kernel log read as /dev/kmsg would be, lets it warm up, then measures over
a window:

  cpu%      CPU time (user+system) of the daemon process / wall time, in % of one core
  sim%      of that, the simulated library's share: the CPU time its entry points took in the
            daemon's process (they time themselves), what a real driver's C code costs instead
  host%     of that, the simulated host's share: its thread, which writes the node's sysfs
            files and kernel log, what a real kernel does instead
  own%      cpu% less sim% and host%: gpuwatch's own cost
            (the simulated host writes both shares to `cpu` in its directory, and the daemon
            logs where that is)
  rss       resident set size at the end of the window (MiB)
  scrape    /metrics latency of the 5 s scrapes (each renders a fresh cycle), p50 / max
  cached    /metrics latency of back-to-back scrapes within one cycle (served bytes), p50
  series    series on /metrics

The first line also times a fixed piece of plain Python ("plain Python N ms"): the daemon's
cost scales with it, so runs on different machines, or days of a shared VM, compare through it.

Usage: python bench/daemon_cost.py [--gpus 8 64 256] [--window 60] [--warmup 15]
       [--ib-ports 8] [--nvswitches 0]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import simulated_daemon

SCRAPE_EVERY_S = 5.0


def _scenario(
    directory: Path, gpus: int, workload: str, ib_ports: int = 0, nvswitches: int = 0
) -> Path:
    path = directory / f"bench-{gpus}.yaml"
    path.write_text(
        f"name: bench-{gpus}\nnode: {{gpus: {gpus}, model: H100, workload: {workload}, seed: 3, "
        f"ib_ports: {ib_ports}, nvswitches: {nvswitches}}}\nfaults: []\n"
    )
    return path


def _get(url: str) -> tuple[float, bytes]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
    return time.perf_counter() - start, body


def measure(
    gpus: int, window: float, warmup: float, workload: str, *, ib_ports: int, nvswitches: int
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        scenario = _scenario(directory, gpus, workload, ib_ports, nvswitches)
        proc, base, log = simulated_daemon.start(directory, scenario)
        try:
            url = f"{base}/metrics"
            host = re.search(r"simulated host \(.*?\) under ([^\"\n]+)", log.read_text())
            if not host:
                raise RuntimeError(log.read_text())
            sim_cpu = Path(host.group(1).strip()) / "cpu"
            process = psutil.Process(proc.pid)
            time.sleep(warmup)
            sim0 = _sim_cpu(sim_cpu)
            cpu0, wall0 = process.cpu_times(), time.monotonic()
            scrapes: list[float] = []
            body = b""
            next_scrape = wall0
            while time.monotonic() < wall0 + window:
                next_scrape += SCRAPE_EVERY_S
                latency, body = _get(url)
                scrapes.append(latency)
                time.sleep(max(0.0, next_scrape - time.monotonic()))
            cpu1, wall1 = process.cpu_times(), time.monotonic()
            sim1 = _sim_cpu(sim_cpu)
            rss = process.memory_info().rss
            cached = [_get(url)[0] for _ in range(5)]
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    busy = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    wall = wall1 - wall0
    return {
        "gpus": gpus,
        "cpu_pct": 100 * busy / wall,
        "sim_pct": 100 * (sim1[0] - sim0[0]) / wall,
        "host_pct": 100 * (sim1[1] - sim0[1]) / wall,
        "rss_mib": rss / 2**20,
        "scrape_p50_ms": 1000 * statistics.median(scrapes),
        "scrape_max_ms": 1000 * max(scrapes),
        "cached_p50_ms": 1000 * statistics.median(cached),
        "series": series,
    }


def _sim_cpu(path: Path) -> tuple[float, float]:
    """The simulated library's and host's CPU seconds so far, as the simulated host wrote them
    (twice a second)."""
    library, host = path.read_text().split()
    return float(library), float(host)


def python_speed_ms() -> float:
    """CPU milliseconds this machine takes for a fixed piece of plain Python (calls, tuples,
    dicts, sorting, JSON), the least of five: what the daemon's numbers scale with from one
    machine, or one day of a shared VM, to the next."""
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        table = {(i % 97, str(i)): (i, float(i) * 0.5) for i in range(40_000)}
        rows = sorted(table.items(), key=lambda kv: kv[1][1], reverse=True)
        text = json.dumps([[k[0], k[1], v[0], v[1]] for k, v in rows[:10_000]])
        sum(row[2] for row in json.loads(text))
        best = min(best, time.process_time() - start)
    return 1000 * best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument(
        "--workload",
        choices=("training", "inference"),
        default="training",
        help="training also runs the simulated job, which reports through the push API",
    )
    parser.add_argument("--ib-ports", type=int, default=8, help="InfiniBand ports on the node")
    parser.add_argument(
        "--nvswitches",
        type=int,
        default=0,
        help="NVSwitches on the node (4 on an HGX H100): the GPUs' NVLink fabric is read, and "
        "Fabric Manager's port asked",
    )
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, {platform.processor() or '?'}, "
        f"Python {platform.python_version()}; "
        f"window {args.window:g}s after {args.warmup:g}s warm-up; "
        f"1 Hz sampling, scrape every {SCRAPE_EVERY_S:g}s; {args.ib_ports} InfiniBand ports, "
        f"{args.nvswitches} NVSwitches; plain Python {python_speed_ms():.0f} ms"
    )
    print(
        f"{'GPUs':>5} {'series':>7} {'cpu% of 1 core':>15} {'sim%':>6} {'host%':>6} {'own%':>6} "
        f"{'RSS MiB':>8} {'scrape p50 ms':>14} {'scrape max ms':>14} {'cached p50 ms':>14}"
    )
    for gpus in args.gpus:
        r = measure(
            gpus,
            args.window,
            args.warmup,
            args.workload,
            ib_ports=args.ib_ports,
            nvswitches=args.nvswitches,
        )
        own = r["cpu_pct"] - r["sim_pct"] - r["host_pct"]
        print(
            f"{r['gpus']:>5} {r['series']:>7} {r['cpu_pct']:>15.2f} {r['sim_pct']:>6.2f} "
            f"{r['host_pct']:>6.2f} {own:>6.2f} {r['rss_mib']:>8.1f} "
            f"{r['scrape_p50_ms']:>14.1f} {r['scrape_max_ms']:>14.1f} "
            f"{r['cached_p50_ms']:>14.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
