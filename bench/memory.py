"""Where a daemon's memory goes: what its imports cost, and what an hour of history costs
per series and per sample.

Two parts, each in a fresh process so that one does not count the other's:

1. imports: the resident set (VmRSS) of a bare interpreter, then after each library and each
   of gpuwatch's rooms the daemon imports, in the order it imports them;
2. history: a simulated node of N GPUs sampled through the real NVML source on a manual
   clock, one cycle a simulated second, its batches ingested into a store as the daemon does
   (the slow tier on timelines of their own), for the default hour. The RSS before and after,
   and what the store holds by kind, from sys.getsizeof over its objects: the varying runs'
   packed values, the run objects, the series' objects and labels, the timelines.

    python bench/memory.py [--gpus 8 64] [--seconds 3600]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

# What `gpuwatch run` imports, in the order the command line loads it.
IMPORTS = (
    "json", "logging", "asyncio", "uvloop", "yaml", "httptools", "gpuwatch.web.server", "pynvml",
    "gpuwatch.model", "gpuwatch.metrics", "gpuwatch.store.tsdb", "gpuwatch.promql.evaluator",
    "gpuwatch.rules.engine", "gpuwatch.notify.notifier", "gpuwatch.nvml.source",
    "gpuwatch.kernel.watcher", "gpuwatch.exporters.prometheus", "gpuwatch.config",
    "gpuwatch.daemon", "gpuwatch.serve.runner", "gpuwatch.sim.library", "gpuwatch.cli.serving",
)  # fmt: skip
ROOT = Path(__file__).resolve().parents[1]


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# Run by a bare interpreter (`python -c`): nothing imported before the first reading.
IMPORTS_PROBE = """
import importlib, json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
out = [("(interpreter)", rss())]
for name in sys.argv[1:]:
    importlib.import_module(name)
    out.append((name, rss()))
print(json.dumps(out))
"""


def store_bytes(store: object) -> Counter[str]:
    """What the store's objects take, by kind (sys.getsizeof: each object's own bytes, the
    packed arrays' buffers included)."""
    from gpuwatch.store.tsdb import Store

    assert isinstance(store, Store)
    out: Counter[str] = Counter()
    by_name: Counter[str] = Counter()  # the varying values, packed or plain, by metric
    seen: set[int] = set()

    def size(kind: str, obj: object) -> None:
        if id(obj) not in seen:
            seen.add(id(obj))
            out[kind] += sys.getsizeof(obj)

    for key, series in store._series.items():
        size("series objects and keys", series)
        size("series objects and keys", key)
        size("labels", series.labels)
        for pair in series.labels:
            size("labels", pair)
        size("run lists", series.runs)
        for run in series.runs:
            if run.packed is not None:
                size("varying runs (objects)", run)
                size("packed runs (values)", run.packed)
                by_name[series.name] += sys.getsizeof(run.packed)
            elif run.values is None:
                size("constant runs", run)
            else:
                size("varying runs (objects)", run)
                size("varying runs (values)", run.values)
                by_name[series.name] += sys.getsizeof(run.values)
    for timeline in store._timelines.values():
        size("timelines", timeline.times)
    index = sum(sys.getsizeof(d) for d in store._by_name.values())
    out["index by name"] = index + sys.getsizeof(store._series)
    for name, held in by_name.most_common(8):
        out[f"  values of {name}"] = held
    return out


async def fill(gpus: int, seconds: int) -> tuple[int, int, int, int, Counter[str]]:
    from gpuwatch.clock import ManualClock
    from gpuwatch.nvml.config import SamplingConfig
    from gpuwatch.nvml.source import NvmlSource
    from gpuwatch.sim.library import SimulatedNvml
    from gpuwatch.sim.scenario import load_scenario
    from gpuwatch.store.tsdb import Store

    scenario = load_scenario("healthy").with_gpus(gpus)
    clock = ManualClock()
    source = NvmlSource(
        SimulatedNvml(scenario, clock).install(), clock, SamplingConfig(), lambda e: None
    )
    await source.start()
    store = Store(retention=3600.0)
    clock.advance(1.0)
    await source.collect()  # the first read: what the source keeps, before any history
    before = rss_kib()
    samples = 0
    for _ in range(seconds):
        clock.advance(1.0)
        batch = await source.collect()
        store.ingest("nvml", batch.time, batch.samples)
        samples += len(batch.samples)
        for part, part_samples in batch.slow_read:
            store.ingest(f"nvml/{part}", batch.time, part_samples)
            samples += len(part_samples)
    after = rss_kib()
    await source.stop()
    return len(store), samples, before, after, store_bytes(store)


def history_part(gpus: int, seconds: int) -> None:
    series, samples, before, after, by_kind = asyncio.run(fill(gpus, seconds))
    print(
        json.dumps(
            {
                "series": series,
                "samples": samples,
                "rss_before_kib": before,
                "grown_kib": after - before,
                # Kinds first, then the names whose values (packed or plain) take most.
                "by_kind": sorted(by_kind.items(), key=lambda kv: (kv[0][0] == " ", -kv[1])),
            }
        )
    )


def child(argv: list[str]) -> object:
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--seconds", type=int, default=3600)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        history_part(int(args.child[0]), int(args.child[1]))
        return
    print(f"machine: {platform.machine()}, Python {platform.python_version()}")
    rows = child([sys.executable, "-c", IMPORTS_PROBE, *IMPORTS])
    assert isinstance(rows, list)
    print(f"{'after importing':34} {'RSS MiB':>8} {'+MiB':>6}")
    last = rows[0][1]
    for name, kib in rows:
        print(f"{name:34} {kib / 1024:8.1f} {(kib - last) / 1024:6.1f}")
        last = kib
    for gpus in args.gpus:
        started = time.monotonic()
        found = child([sys.executable, __file__, "--child", str(gpus), str(args.seconds)])
        assert isinstance(found, dict)
        held = sum(size for kind, size in found["by_kind"] if not kind.startswith(" "))
        print(
            f"\n{gpus} GPUs, {args.seconds} s of 1 Hz history ({time.monotonic() - started:.0f} s"
            f" to fill): {found['series']} series, {found['samples']} samples; RSS "
            f"{found['rss_before_kib'] / 1024:.1f} MiB before, grew "
            f"{found['grown_kib'] / 1024:.1f} MiB; the store holds {held / 2**20:.1f} MiB, "
            f"{held / max(found['samples'], 1):.2f} bytes a sample"
        )
        for kind, size in found["by_kind"]:
            print(f"  {kind:28} {size / 2**20:8.2f} MiB")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
