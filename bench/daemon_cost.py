"""The daemon's own cost: CPU share of one core and RSS at 1 Hz sampling, scraped every 5 s.

Runs `gpuwatch run --simulate` (the same NVML source code as production, through the real
pynvml, over the simulated NVML library) for 8, 64 and 256 GPUs, with `--ib-ports`
InfiniBand ports (default 8) and `--nvswitches` NVSwitches (default 0) in the simulated sysfs
and the simulated kernel log read as /dev/kmsg would be, lets it warm up, then measures over
a window:

  cpu%      CPU time (user+system) of the daemon process / wall time, in % of one core
  sim%      of that, the simulated library's own share: what a real driver's C code costs
            instead. Measured apart, in this process: the same NVML source reads the same
            node for 60 cycles with the library timing its entry points (thread CPU time)
  host%     of that, the simulated host's share: the thread that writes the node's sysfs
            files and kernel log, what a real kernel does instead. Measured apart, in this
            process: 60 s of its updates at the cadence its thread runs them
  rss       resident set size at the end of the window (MiB)
  scrape    /metrics latency of the 5 s scrapes (each renders a fresh cycle), p50 / max
  cached    /metrics latency of back-to-back scrapes within one cycle (served bytes), p50
  series    series on /metrics

Usage: python bench/daemon_cost.py [--gpus 8 64 256] [--window 60] [--warmup 15]
       [--ib-ports 8] [--nvswitches 0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

SCRAPE_EVERY_S = 5.0
SIM_CYCLES = 60


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
        log = directory / "daemon.log"
        with open(log, "wb") as log_file:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpuwatch",
                    "run",
                    "--simulate",
                    str(_scenario(directory, gpus, workload, ib_ports, nvswitches)),
                    "--listen",
                    "127.0.0.1:0",
                    "--state-dir",
                    str(directory / "state"),
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
            try:
                url = ""
                for _ in range(300):
                    match = re.search(r"serving on ([\d.]+):(\d+)", log.read_text())
                    if match:
                        url = f"http://{match.group(1)}:{match.group(2)}/metrics"
                        break
                    time.sleep(0.1)
                if not url:
                    raise RuntimeError(log.read_text())
                process = psutil.Process(proc.pid)
                time.sleep(warmup)
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
                rss = process.memory_info().rss
                cached = [_get(url)[0] for _ in range(5)]
            finally:
                proc.terminate()
                proc.wait(timeout=20)
    busy = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    return {
        "gpus": gpus,
        "cpu_pct": 100 * busy / (wall1 - wall0),
        "rss_mib": rss / 2**20,
        "scrape_p50_ms": 1000 * statistics.median(scrapes),
        "scrape_max_ms": 1000 * max(scrapes),
        "cached_p50_ms": 1000 * statistics.median(cached),
        "series": series,
    }


async def _library_share(scenario: Path, cycles: int) -> float:
    """CPU seconds the simulated library spends per 1 s cycle of the NVML source."""
    from gpuwatch.clock import ManualClock
    from gpuwatch.config import SamplingConfig
    from gpuwatch.nvml.source import NvmlSource
    from gpuwatch.sim.library import SimulatedNvml
    from gpuwatch.sim.scenario import load_scenario

    clock = ManualClock()
    library = SimulatedNvml(load_scenario(str(scenario)), clock, account_cpu=True)
    source = NvmlSource(library.install(), clock, SamplingConfig(), lambda _: None)
    await source.start()
    await source.collect()  # the first cycle finds out what the driver supports
    library.cpu_seconds = 0.0
    for _ in range(cycles):
        clock.advance(1.0)
        await source.collect()
    spent = library.cpu_seconds
    stopping = asyncio.ensure_future(source.stop())
    while not stopping.done():  # the event thread waits on the manual clock
        clock.advance(0.3)
        await asyncio.sleep(0.005)
    SimulatedNvml.uninstall()
    return spent / cycles


def library_share(gpus: int, workload: str, nvswitches: int) -> float:
    """The simulated library's CPU, in % of one core at 1 Hz sampling."""
    with tempfile.TemporaryDirectory() as tmp:
        scenario = _scenario(Path(tmp), gpus, workload, nvswitches=nvswitches)
        return 100 * asyncio.run(_library_share(scenario, SIM_CYCLES))


def host_share(gpus: int, workload: str, ib_ports: int, nvswitches: int) -> float:
    """The simulated host's CPU, in % of one core."""
    from gpuwatch.clock import ManualClock
    from gpuwatch.sim.host import FILES_EVERY_S, SimHost
    from gpuwatch.sim.node import SimNode
    from gpuwatch.sim.scenario import load_scenario

    seconds = 60.0
    with tempfile.TemporaryDirectory() as tmp:
        clock = ManualClock()
        scenario = load_scenario(str(_scenario(Path(tmp), gpus, workload, ib_ports, nvswitches)))
        host = SimHost(SimNode(scenario, clock), Path(tmp) / "host")
        start = time.thread_time()
        for _ in range(round(seconds / FILES_EVERY_S)):
            clock.advance(FILES_EVERY_S)
            host.update()
        spent = time.thread_time() - start
        host.stop()
    return 100 * spent / seconds


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
        f"{args.nvswitches} NVSwitches"
    )
    print(
        f"{'GPUs':>5} {'series':>7} {'cpu% of 1 core':>15} {'sim%':>6} {'host%':>6} {'RSS MiB':>8} "
        f"{'scrape p50 ms':>14} {'scrape max ms':>14} {'cached p50 ms':>14}"
    )
    for gpus in args.gpus:
        r = measure(gpus, args.window, args.warmup, args.workload, ib_ports=args.ib_ports,
                    nvswitches=args.nvswitches)  # fmt: skip
        sim = library_share(gpus, args.workload, args.nvswitches)
        host = host_share(gpus, args.workload, args.ib_ports, args.nvswitches)
        print(
            f"{r['gpus']:>5} {r['series']:>7} {r['cpu_pct']:>15.2f} {sim:>6.2f} {host:>6.2f} "
            f"{r['rss_mib']:>8.1f} {r['scrape_p50_ms']:>14.1f} {r['scrape_max_ms']:>14.1f} "
            f"{r['cached_p50_ms']:>14.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
