"""gpuwatch and nvitop-exporter side by side, on the same simulated node, in one run.

nvitop-exporter 1.7.2 (the Python exporter built on nvitop and nvidia-ml-py) is installed by
this bench into a virtualenv of its own (`.bench/nvitop-exporter`, made once), and run there
by bench/peer_exporter.py, which puts gpuwatch's simulated NVML library beneath that venv's
pynvml first, as `gpuwatch run --simulate` does beneath gpuwatch's. Each process runs alone
(this is a 2-core machine), on the same scenario (H100s serving inference: no job pushing
to gpuwatch, which the peer has no way to take), sampling every second and scraped every
5 s; after a warm-up, over a window (default 2 minutes), the bench takes:

  cpu ms/GPU-sample  the process's CPU time, less the simulated library's (and gpuwatch's
                     simulated host's) own, per GPU sample it took: gpuwatch's cycles, the
                     peer's power reads (one per GPU per sample; it falls behind its interval
                     at 64 GPUs, its PCIe throughput reads taking 40 ms a GPU one after another)
  samples/s          samples of every GPU a second
  RSS                resident set at the end of the window
  scrape p50, p99    /metrics latency of the 5 s scrapes
  series             series on /metrics

and prints gpuwatch's figure over the peer's for each: the goals are CPU at most a quarter of
the peer's, and a /metrics p99 of at most 20 ms at 64 GPUs.

The simulated library has the calls gpuwatch makes; nvitop makes a few it lacks (encoder and
decoder utilization, fan speed, graphics processes, the power management limit, the CUDA
driver version). Those answer FUNCTION_NOT_FOUND, which nvitop reports once and shows as N/A:
the peer does a little less work here than on a driver, so its figures are a floor.

Usage: python bench/side_by_side.py [--gpus 8 64] [--window 120] [--warmup 15]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import daemon_cost
import psutil
import simulated_daemon

ROOT = Path(__file__).resolve().parents[1]
PEER_VENV = ROOT / ".bench" / "nvitop-exporter"
PEER = ("nvitop-exporter==1.7.2", "pyyaml")
INTERVAL_S = 1.0
SCRAPE_EVERY_S = 5.0
START_WITHIN_S = 60.0


def peer_python() -> Path:
    """The peer's venv's python, the venv made and the peer installed first if need be. Its
    nvidia-ml-py is the one gpuwatch runs with, so both go through the same pynvml."""
    python = PEER_VENV / "bin" / "python"
    marker = PEER_VENV / "installed"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
        from importlib.metadata import version

        wanted = [*PEER, f"nvidia-ml-py=={version('nvidia-ml-py')}"]
        subprocess.run([str(python), "-m", "pip", "install", "-q", *wanted], check=True)
        marker.write_text("\n".join(wanted) + "\n")
    return python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scenario(directory: Path, gpus: int) -> Path:
    path = directory / f"side-by-side-{gpus}.yaml"
    path.write_text(
        f"name: side-by-side-{gpus}\n"
        f"node: {{gpus: {gpus}, model: H100, workload: inference, seed: 3}}\nfaults: []\n"
    )
    return path


def _observe(
    pid: int, url: str, sim: Callable[[], tuple[float, float]], window: float, warmup: float
) -> dict[str, float]:
    """`sim()`: the simulator's CPU seconds so far and the samples of each GPU taken so far."""
    process = psutil.Process(pid)
    time.sleep(warmup)
    (sim0, samples0), cpu0, wall0 = sim(), process.cpu_times(), time.monotonic()
    scrapes: list[float] = []
    body = b""
    next_scrape = wall0
    while time.monotonic() < wall0 + window:
        next_scrape += SCRAPE_EVERY_S
        latency, body = daemon_cost._get(url)
        scrapes.append(latency)
        time.sleep(max(0.0, next_scrape - time.monotonic()))
    cpu1, wall1, (sim1, samples1) = process.cpu_times(), time.monotonic(), sim()
    rss = process.memory_info().rss
    busy = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system) - (sim1 - sim0)
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    return {
        "cpu_s": busy,
        "wall_s": wall1 - wall0,
        "samples": samples1 - samples0,
        "rss_mib": rss / 2**20,
        "p50_ms": 1000 * statistics.median(scrapes),
        "p99_ms": 1000 * statistics.quantiles(scrapes, n=100, method="inclusive")[98],
        "series": series,
    }


def measure_gpuwatch(gpus: int, window: float, warmup: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        proc, base, log = simulated_daemon.start(directory, _scenario(directory, gpus))
        try:
            host = re.search(r"simulated host \(.*?\) under ([^\"\n]+)", log.read_text())
            if not host:
                raise RuntimeError(log.read_text())
            cpu_file = Path(host.group(1).strip()) / "cpu"

            def sim() -> tuple[float, float]:
                _, body = daemon_cost._get(f"{base}/metrics")
                cycles = re.search(rb"^gpuwatch_samples_total (\S+)", body, re.MULTILINE)
                if cycles is None:
                    raise RuntimeError("no gpuwatch_samples_total on /metrics")
                return sum(daemon_cost._sim_cpu(cpu_file)), float(cycles.group(1))

            return _observe(proc.pid, f"{base}/metrics", sim, window, warmup)
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def measure_peer(python: Path, gpus: int, window: float, warmup: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        port = _free_port()
        cpu_file = directory / "sim-cpu"
        log = directory / "peer.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(python), str(ROOT / "bench" / "peer_exporter.py"), "--repo", str(ROOT),
                 "--scenario", str(_scenario(directory, gpus)), "--sim-cpu", str(cpu_file),
                 "--", "--bind-address", "127.0.0.1", "--port", str(port),
                 "--interval", str(INTERVAL_S)],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + START_WITHIN_S
            while "Start the exporter" not in log.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nvitop-exporter did not start:\n{log.read_text()}")
                time.sleep(0.2)

            def sim() -> tuple[float, float]:
                cpu, power_reads = cpu_file.read_text().split()
                return float(cpu), float(power_reads) / gpus

            result = _observe(proc.pid, f"http://127.0.0.1:{port}/metrics", sim, window, warmup)
            calls = re.findall(r"calling nvmlQuery\(<function (\w+)", log.read_text())
            missing = sorted(set(calls))
            print(f"  nvitop calls the simulator lacks: {', '.join(missing) or 'none'}")
            return result
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def per_sample_ms(r: dict[str, float], gpus: int) -> float:
    return 1000 * r["cpu_s"] / (gpus * r["samples"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--window", type=float, default=120.0)
    parser.add_argument("--warmup", type=float, default=15.0)
    args = parser.parse_args()
    python = peer_python()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python "
        f"{platform.python_version()}; plain Python {daemon_cost.python_speed_ms():.0f} ms; "
        f"window {args.window:g}s after {args.warmup:g}s; sampling every {INTERVAL_S:g}s, "
        f"scraped every {SCRAPE_EVERY_S:g}s; peer: {', '.join(PEER)}",
        flush=True,
    )
    header = (
        f"{'':>16} {'GPUs':>5} {'series':>7} {'samples/s':>9} {'cpu ms/GPU-sample':>18} "
        f"{'RSS MiB':>8} {'scrape p50 ms':>14} {'scrape p99 ms':>14}"
    )
    for gpus in args.gpus:
        ours = measure_gpuwatch(gpus, args.window, args.warmup)
        peer = measure_peer(python, gpus, args.window, args.warmup)
        print(header)
        for name, r in (("gpuwatch", ours), ("nvitop-exporter", peer)):
            print(
                f"{name:>16} {gpus:>5} {r['series']:>7.0f} {r['samples'] / r['wall_s']:>9.2f} "
                f"{per_sample_ms(r, gpus):>18.3f} "
                f"{r['rss_mib']:>8.1f} {r['p50_ms']:>14.1f} {r['p99_ms']:>14.1f}"
            )
        cpu = per_sample_ms(ours, gpus) / per_sample_ms(peer, gpus)
        print(
            f"{'gpuwatch / peer':>16} {gpus:>5} {'':>7} {'':>9} {cpu:>18.2f} "
            f"{ours['rss_mib'] / peer['rss_mib']:>8.2f} {ours['p50_ms'] / peer['p50_ms']:>14.2f} "
            f"{ours['p99_ms'] / peer['p99_ms']:>14.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
