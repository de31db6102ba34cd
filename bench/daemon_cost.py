"""The daemon's own cost: CPU share of one core and RSS at 1 Hz sampling, scraped every 5 s.

Runs `gpuwatch run --simulate` (the same NVML source code as production, on the simulator's
fake pynvml) for 8, 64 and 256 GPUs, lets it warm up, then measures over a window:

  cpu%      CPU time (user+system) of the daemon process / wall time, in % of one core
  rss       resident set size at the end of the window (MiB)
  scrape    /metrics latency of the 5 s scrapes (each renders a fresh cycle), p50 / max
  cached    /metrics latency of back-to-back scrapes within one cycle (served bytes), p50
  series    series on /metrics

Usage: python bench/daemon_cost.py [--gpus 8 64 256] [--window 60] [--warmup 15]
"""

from __future__ import annotations

import argparse
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


def _scenario(directory: Path, gpus: int, workload: str) -> Path:
    path = directory / f"bench-{gpus}.yaml"
    path.write_text(
        f"name: bench-{gpus}\nnode: {{gpus: {gpus}, model: H100, workload: {workload}, seed: 3}}\n"
        "faults: []\n"
    )
    return path


def _get(url: str) -> tuple[float, bytes]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
    return time.perf_counter() - start, body


def measure(gpus: int, window: float, warmup: float, workload: str) -> dict[str, float]:
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
                    str(_scenario(directory, gpus, workload)),
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
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, {platform.processor() or '?'}, "
        f"Python {platform.python_version()}; "
        f"window {args.window:g}s after {args.warmup:g}s warm-up; "
        f"1 Hz sampling, scrape every {SCRAPE_EVERY_S:g}s"
    )
    print(
        f"{'GPUs':>5} {'series':>7} {'cpu% of 1 core':>15} {'RSS MiB':>8} "
        f"{'scrape p50 ms':>14} {'scrape max ms':>14} {'cached p50 ms':>14}"
    )
    for gpus in args.gpus:
        r = measure(gpus, args.window, args.warmup, args.workload)
        print(
            f"{r['gpus']:>5} {r['series']:>7} {r['cpu_pct']:>15.2f} {r['rss_mib']:>8.1f} "
            f"{r['scrape_p50_ms']:>14.1f} {r['scrape_max_ms']:>14.1f} {r['cached_p50_ms']:>14.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
