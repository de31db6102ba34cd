"""NVML deadlines on a host whose CPUs other processes saturate, and on one with a real hang.

Runs `gpuwatch run --simulate` on 8 simulated H100s at 1 Hz, lets it warm up, then starts
`--burners` processes (default: two per CPU) that spin at the daemon's own priority for
`--load` seconds, and reads the daemon's /metrics and /api/v1/alerts once a second:

  healthy   a node whose GPUs all answer: every NVML timeout counted under the load, and
            every alert about unresponsive GPUs or NVML timeouts that fired, is a false page
  hang      the same node and load, with GPU 3 hung in NVML from the load's 20th second for
            a minute: the first timeout and GpuUnresponsive's firing, after the hang began

Each line prints: the timeouts counted during the load, the GPUs they were counted for, the
alerts of those names that fired, and for `hang` the seconds from the hang to its first
timeout and to GpuUnresponsive firing (its `for:` is 10 s, the rule pack's).

Usage: python bench/cpu_starved.py [--load 60] [--warmup 15] [--burners N] [--only healthy|hang]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import re
import tempfile
import time
import urllib.request
from pathlib import Path

import simulated_daemon

HANG_AFTER_S = 20.0  # into the load
HANG_FOR_S = 60.0
WATCHED = ("GpuUnresponsive", "GpuDriverUnresponsive", "GpuwatchNvmlTimeouts")


def _spin(nice: int) -> None:
    if nice:
        os.nice(nice)
    while True:
        pass


def _scenario(directory: Path, hang_at: float | None) -> Path:
    faults = "[]"
    if hang_at is not None:
        faults = f"[{{kind: nvml_hang, gpu: 3, at: {hang_at:.0f}s, duration: {HANG_FOR_S:.0f}s}}]"
    path = directory / "node.yaml"
    path.write_text(
        "name: starved\nnode: {gpus: 8, model: H100, workload: training, seed: 3}\n"
        f"faults: {faults}\n"
    )
    return path


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        body: bytes = response.read()
    return body


def _timeouts(base: str) -> tuple[dict[str, float], float]:
    """gpuwatch_nvml_timeouts_total by GPU ("" for the driver's lane), and the deadline time
    granted for the daemon's wait for a CPU (0 where the daemon does not count it)."""
    by_gpu: dict[str, float] = {}
    granted = 0.0
    for line in _get(base + "/metrics").decode().splitlines():
        if line.startswith("gpuwatch_nvml_cpu_wait_granted_seconds_total"):
            granted = float(line.rsplit(" ", 1)[1])
        elif line.startswith("gpuwatch_nvml_timeouts_total"):
            gpu = re.search(r'gpu="(\d+)"', line)
            by_gpu[gpu.group(1) if gpu else ""] = float(line.rsplit(" ", 1)[1])
    return by_gpu, granted


def _firing(base: str) -> set[tuple[str, str]]:
    alerts = json.loads(_get(base + "/api/v1/alerts"))["data"]["alerts"]
    return {
        (a["labels"]["alertname"], a["labels"].get("gpu", ""))
        for a in alerts
        if a["state"] == "firing" and a["labels"]["alertname"] in WATCHED
    }


def run(case: str, load: float, warmup: float, burners: int, nice: int) -> dict[str, object]:
    hang_at = warmup + HANG_AFTER_S if case == "hang" else None
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        proc, base, _ = simulated_daemon.start(directory, _scenario(directory, hang_at))
        spinners: list[multiprocessing.Process] = []
        try:
            time.sleep(warmup)
            before, granted_before = _timeouts(base)
            spinners = [
                multiprocessing.Process(target=_spin, args=(nice,), daemon=True)
                for _ in range(burners)
            ]
            for p in spinners:
                p.start()
            load_start = time.monotonic()
            hang = load_start + HANG_AFTER_S if hang_at is not None else None
            first_timeout: float | None = None
            fired: dict[tuple[str, str], float] = {}
            counts, granted = before, granted_before
            while time.monotonic() < load_start + load:
                time.sleep(1.0)
                now = time.monotonic()
                counts, granted = _timeouts(base)
                if first_timeout is None and sum(counts.values()) > sum(before.values()):
                    first_timeout = now
                for key in _firing(base):
                    fired.setdefault(key, now)
        finally:
            for p in spinners:
                p.kill()
            proc.terminate()
            proc.wait(timeout=20)
    grew = {g: counts[g] - before.get(g, 0.0) for g in counts if counts[g] > before.get(g, 0.0)}
    out: dict[str, object] = {
        "case": case,
        "granted_s": round(granted - granted_before, 1),
        "timeouts": int(sum(grew.values())),
        "gpus": ",".join(sorted(grew, key=lambda g: (g == "", g))) or "-",
        "alerts": ", ".join(f"{n}{{gpu={g}}}" if g else n for n, g in sorted(fired)) or "-",
    }
    if hang is not None:
        unresponsive = [t for (n, g), t in fired.items() if n == "GpuUnresponsive" and g == "3"]
        out["to_timeout_s"] = None if first_timeout is None else round(first_timeout - hang, 1)
        out["to_page_s"] = round(unresponsive[0] - hang, 1) if unresponsive else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--burners", type=int, default=2 * (os.cpu_count() or 1))
    parser.add_argument(
        "--nice", type=int, default=0, help="the spinning processes' niceness (below 0 needs root)"
    )
    parser.add_argument("--only", choices=("healthy", "hang"))
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python "
        f"{platform.python_version()}; {args.burners} spinning processes for {args.load:.0f}s "
        f"after {args.warmup:.0f}s warm-up"
    )
    for case in ("healthy", "hang"):
        if args.only in (None, case):
            result = run(case, args.load, args.warmup, args.burners, args.nice)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
