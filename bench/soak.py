"""Soak: a simulated node of 64 GPUs sampled at 10 Hz for an hour, with faults all along,
scraped every second, alerting to a local webhook that goes down for five minutes midway.

It prints, every report interval, the daemon's RSS, open file descriptors, threads, CPU,
sampling cycles achieved and ticks skipped, scrape latency and failures, and the outbox; at the
end, whether every alert transition in the daemon's journal reached the receiver.

The store keeps 10 minutes (not the default hour). The names the shipped rules read back
further are kept as long as they read them (the XID counters 15 minutes, gpuwatch_gpu_info, a
constant, 1h15s), so the store is full after about 16 minutes, and anything that still grows
after 20 minutes is a leak, not history.

Usage: python bench/soak.py [--duration 3600] [--gpus 64] [--hz 10] [--report 300]
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fake_services import FakeService

SERVING = re.compile(r"gpuwatch serving on ([\d.]+):(\d+)")
# Faults that raise alerts and then clear; none that loses a GPU (that would inhibit the
# GPU's other alerts, which then, rightly, never reach the receiver).
FAULTS = (
    ("thermal_runaway", "duration: 2m"),
    ("ecc_sbe", ""),
    ("nvlink_crc_storm", "duration: 2m"),
    ("power_brake", "duration: 1m"),
    ("xid", "code: 13"),
    ("pcie_replay_storm", "duration: 2m"),
    ("hw_slowdown", "duration: 1m"),
    ("xid", "code: 48"),
    ("row_remap_pending", ""),
    ("nvlink_down", "duration: 2m"),
)
QUIET_END_S = 300.0  # the last five minutes have no new fault, so that everything resolves


def scenario(path: Path, gpus: int, duration: float) -> int:
    usable = duration - QUIET_END_S - 60
    count = max(1, int(usable // 120))
    lines = [
        "name: soak",
        f'description: "{gpus} H100s training, {count} faults over {duration:.0f} s"',
        f"node: {{gpus: {gpus}, model: H100, workload: training, seed: 11}}",
        "faults:",
    ]
    for i in range(count):
        kind, extra = FAULTS[i % len(FAULTS)]
        at = 60 + i * usable / count
        fields = f"kind: {kind}, gpu: {(i * 7) % gpus}, at: {at:.0f}s" + (
            f", {extra}" if extra else ""
        )
        lines.append(f"  - {{{fields}}}")
    path.write_text("\n".join(lines) + "\n")
    return count


def config(path: Path, hz: float, hook: str) -> None:
    path.write_text(
        f"sampling: {{interval: {1000 / hz:.0f}ms}}\n"
        "store: {retention: 10m}\n"
        "notify:\n"
        f"  receivers: [{{name: soak, type: webhook, url: '{hook}'}}]\n"
        "  route: {receiver: soak, group_by: ['...'], group_wait: 1s, group_interval: 10s}\n"
    )


class Scraper(threading.Thread):
    """GET /metrics every second; keeps latencies, failures and a few values."""

    WATCHED = (
        "gpuwatch_samples_total",
        "gpuwatch_sampling_overruns_total",
        "gpuwatch_outbox_pending",
        "gpuwatch_store_series",
        "gpuwatch_sample_duration_seconds",
    )

    def __init__(self, url: str, every: float) -> None:
        super().__init__(daemon=True)
        self.url, self.every = url, every
        self.latencies: list[float] = []
        self.failures = 0
        self.values: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def run(self) -> None:
        pattern = re.compile(r"^(" + "|".join(self.WATCHED) + r")(?:\{[^}]*\})? (\S+)$", re.M)
        while not self.stop.wait(self.every):
            start = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as response:
                    text = response.read().decode()
            except OSError:
                with self.lock:
                    self.failures += 1
                continue
            took = time.perf_counter() - start
            values: dict[str, float] = collections.defaultdict(float)
            for name, value in pattern.findall(text):
                values[name] += float(value)
            with self.lock:
                self.latencies.append(took)
                self.values = dict(values)

    def take(self) -> tuple[list[float], int, dict[str, float]]:
        with self.lock:
            out = (self.latencies, self.failures, dict(self.values))
            self.latencies, self.failures = [], 0
            return out


def unique_notifications(hook: FakeService) -> collections.Counter[tuple[str, str, str]]:
    """(alertname, gpu, status) per distinct alert episode the receiver was told about."""
    seen = set()
    for body in hook.bodies():
        for alert in body["alerts"]:
            labels = alert["labels"]
            seen.add(
                (labels["alertname"], labels.get("gpu", ""), alert["status"], alert["startsAt"])
            )
    return collections.Counter((a, g, s) for a, g, s, _ in seen)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--hz", type=float, default=10.0)
    parser.add_argument("--report", type=float, default=300.0, help="seconds between rows")
    args = parser.parse_args()

    hook = FakeService("webhook").up()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        faults = scenario(directory / "soak.yaml", args.gpus, args.duration)
        config(directory / "gpuwatch.yaml", args.hz, hook.url)
        log_path = directory / "daemon.log"
        with open(log_path, "wb") as log_file:
            daemon = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpuwatch",
                    "run",
                    "--listen",
                    "127.0.0.1:0",
                    "--state-dir",
                    str(directory / "state"),
                    "-c",
                    str(directory / "gpuwatch.yaml"),
                    "--simulate",
                    str(directory / "soak.yaml"),
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while not (match := SERVING.search(log_path.read_text())):
            if time.monotonic() > deadline or daemon.poll() is not None:
                sys.exit(f"daemon did not start:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        url = f"http://{match.group(1)}:{match.group(2)}"
        proc = psutil.Process(daemon.pid)
        scraper = Scraper(url + "/metrics", 1.0)
        scraper.start()
        print(
            f"machine: {platform.machine()}, {psutil.cpu_count()} cpus, Python "
            f"{platform.python_version()}; {args.gpus} GPUs at {args.hz:g} Hz for "
            f"{args.duration:.0f} s, {faults} faults, scrapes every 1 s; webhook down "
            f"from {args.duration * 0.4:.0f} s to {args.duration * 0.4 + 300:.0f} s"
        )
        print(
            "     t  RSS MiB  fds  threads  cpu%  cycles/s  skipped  cycle ms  "
            "scrape p50/max ms  failed  series  outbox  received"
        )
        started = time.monotonic()
        last_t, last_cpu = started, sum(proc.cpu_times()[:2])
        last_cycles = last_skipped = 0.0
        outage = (args.duration * 0.4, args.duration * 0.4 + 300)
        down = False
        rows: list[dict[str, float]] = []
        next_report = args.report
        while True:
            elapsed = time.monotonic() - started
            if not down and outage[0] <= elapsed < outage[1]:
                hook.down()  # chat is down: the daemon must keep what it could not send
                down = True
            elif down and elapsed >= outage[1]:
                hook.up()
                down = False
            if elapsed < min(next_report, args.duration):
                time.sleep(min(5.0, min(next_report, args.duration) - elapsed))
                continue
            next_report += args.report
            now, cpu = time.monotonic(), sum(proc.cpu_times()[:2])
            latencies, failed, values = scraper.take()
            cycles = values.get("gpuwatch_samples_total", 0.0)
            skipped = values.get("gpuwatch_sampling_overruns_total", 0.0)
            row = {
                "t": elapsed,
                "rss": proc.memory_info().rss / 2**20,
                "fds": float(proc.num_fds()),
                "threads": float(proc.num_threads()),
                "cpu": 100 * (cpu - last_cpu) / (now - last_t),
                "rate": (cycles - last_cycles) / (now - last_t),
                "skipped": skipped - last_skipped,
            }
            rows.append(row)
            p50 = statistics.median(latencies) * 1000 if latencies else float("nan")
            worst = max(latencies) * 1000 if latencies else float("nan")
            print(
                f"{elapsed:6.0f}  {row['rss']:7.1f}  {row['fds']:3.0f}  {row['threads']:7.0f}  "
                f"{row['cpu']:4.0f}  {row['rate']:8.2f}  {row['skipped']:7.0f}  "
                f"{values.get('gpuwatch_sample_duration_seconds', 0) * 1000:8.1f}  "
                f"{p50:8.1f}/{worst:7.1f}  {failed:6d}  "
                f"{values.get('gpuwatch_store_series', 0):6.0f}  "
                f"{values.get('gpuwatch_outbox_pending', 0):6.0f}  {len(hook.bodies()):8d}",
                flush=True,
            )
            last_t, last_cpu, last_cycles, last_skipped = now, cpu, cycles, skipped
            if elapsed >= args.duration:
                break
        if down:
            hook.up()
        # Let the last resolves through (group_interval 10 s), then compare with the journal.
        drain = time.monotonic() + 120
        while time.monotonic() < drain and scraper.values.get("gpuwatch_outbox_pending", 1):
            time.sleep(2)
        time.sleep(15)
        with urllib.request.urlopen(f"{url}/api/v1/events?since=3h&kind=alert&limit=10000") as r:
            events = json.load(r)["data"]["events"]
        scraper.stop.set()
        daemon.terminate()
        code = daemon.wait(timeout=30)
        journal = collections.Counter(
            (e["alertname"], "" if e.get("gpu") is None else str(e["gpu"]), e["state"])
            for e in events
        )
        told = unique_notifications(hook)
        missing = journal - told
        steady = [r for r in rows if r["t"] >= 1200]  # after the store has filled
        print()
        if steady:
            rss, fds = [r["rss"] for r in steady], [r["fds"] for r in steady]
            print(
                f"after 20 min: RSS {min(rss):.1f}..{max(rss):.1f} MiB "
                f"(first {rss[0]:.1f}, last {rss[-1]:.1f}); fds {min(fds):.0f}..{max(fds):.0f}"
            )
        rates = [r["rate"] for r in rows]
        print(
            f"cycles/s: min {min(rates):.2f}, median {statistics.median(rates):.2f} "
            f"(asked {args.hz:g}); ticks skipped: {sum(r['skipped'] for r in rows):.0f}"
        )
        print(
            f"alert transitions in the journal: {sum(journal.values())} "
            f"({sum(v for k, v in journal.items() if k[2] == 'firing')} firing); "
            f"told to the receiver: {sum(told.values())}; missing: {sum(missing.values())}"
        )
        for key, n in sorted(missing.items()):
            print(f"  missing: {key} x{n}")
        print(f"refused by the receiver: {len(hook.refused)}; daemon exit status {code}")
        errors = [
            line
            for line in log_path.read_text().splitlines()
            if "level=error" in line or "Traceback" in line
        ]
        print(f"error lines in the daemon's log: {len(errors)}")
        for line in errors[:10]:
            print("  " + line[:200])
    hook.down()


if __name__ == "__main__":
    main()
