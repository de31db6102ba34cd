"""Evaluation time of the default rule packs per cycle, on 8, 64 and 256 simulated GPUs with
one hour of 1 s history in the store: per daemon cycle (each group when its interval is due,
as the daemon runs them) and for all groups at once (what an XID or a lost GPU triggers).

The series are the simulator's own (one sampling cycle through the real NVML source), then
replayed for an hour with counters advancing, so the store holds what a daemon holds after an
hour. Run: .venv/bin/python bench/rules_eval.py [GPUS ...]
"""

from __future__ import annotations

import asyncio
import platform
import statistics
import sys
import time

from gpuwatch.clock import ManualClock
from gpuwatch.model import Sample
from gpuwatch.nvml.config import SamplingConfig
from gpuwatch.nvml.source import NvmlSource
from gpuwatch.rules.engine import RuleEngine
from gpuwatch.sim.library import SimulatedNvml
from gpuwatch.sim.scenario import load_scenario
from gpuwatch.store.tsdb import Store

HISTORY_S = 3600
ROUNDS = 61  # cycles timed after the first; the 15 s groups run 4 times


async def one_batch(gpus: int) -> list[Sample]:
    scenario = load_scenario("healthy").with_gpus(gpus)
    clock = ManualClock()
    source = NvmlSource(
        SimulatedNvml(scenario, clock).install(), clock, SamplingConfig(), lambda e: None
    )
    await source.start()
    batch = await source.collect()  # the first cycle reads every GPU's slow tier too
    await source.stop()
    return [*batch.samples, *batch.slow_samples]


# Counters that move on a healthy node; error counters stay flat, so no alert fires.
MOVING = {"gpuwatch_gpu_energy_joules_total": 700.0, "gpuwatch_gpu_nvlink_bytes_total": 2e10}


def ingest(store: Store, samples: list[Sample], start: float, i: int) -> None:
    batch = [Sample(s.name, s.labels, s.value + i * MOVING.get(s.name, 0.0)) for s in samples]
    store.ingest("nvml", start + i, batch)


def main(counts: list[int]) -> None:
    machine = platform.processor() or platform.machine()
    print(f"machine: {machine}, Python {platform.python_version()}", flush=True)
    print(
        f"{'GPUs':>5} {'series':>7} {'cycle mean ms':>14} {'cycle p50 ms':>13} "
        f"{'cycle max ms':>13} {'all groups ms':>14}",
        flush=True,
    )
    for gpus in counts:
        samples = asyncio.run(one_batch(gpus))
        start = 1_700_000_000.0
        store = Store(retention=HISTORY_S)
        # Loaded first, as a daemon does: the store keeps plain what the rules read back.
        engine = RuleEngine(store, None, 1.0, None)
        engine.load()
        for i in range(HISTORY_S):
            ingest(store, samples, start, i)
        store.pack_waiting()  # a daemon's many sources pack as runs close; one source lags
        cycles, everything = [], []
        for r in range(ROUNDS + 5):
            ingest(store, samples, start, HISTORY_S + r)
            now = start + HISTORY_S + r + 0.01
            t0 = time.perf_counter()
            if r < ROUNDS:
                engine.evaluate(now)  # the groups whose interval is due, as each daemon cycle
                cycles.append((time.perf_counter() - t0) * 1000)
            else:
                engine.evaluate(now, everything=True)  # every group, as after an XID
                everything.append((time.perf_counter() - t0) * 1000)
        cycles = cycles[1:]  # the first cycle also builds the selection caches
        print(
            f"{gpus:>5} {len(samples):>7} {statistics.mean(cycles):>14.2f} "
            f"{statistics.median(cycles):>13.2f} {max(cycles):>13.2f} "
            f"{statistics.mean(everything):>14.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [8, 64, 256])
