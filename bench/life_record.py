"""What keeping each GPU's life record costs a cycle: the recorder's `after_cycle` (comparing
each GPU's identity and board counts with its record), timed on a simulated node wired as
`gpuwatch run` wires it, through the real pynvml, on a manual clock.

Usage: python bench/life_record.py [--gpus 8 64] [--cycles 120]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import platform
import statistics
import tempfile
import time
from pathlib import Path

import pynvml

from gpuwatch.clock import ManualClock
from gpuwatch.config import load_config
from gpuwatch.life.recorder import LifeRecorder
from gpuwatch.serve.wiring import wire
from gpuwatch.sim.library import SimulatedNvml
from gpuwatch.sim.scenario import load_scenario


async def measure(gpus: int, cycles: int) -> tuple[float, float, int]:
    """(median, largest) milliseconds of the recorder's part of a cycle, and the samples a
    cycle's batch holds."""
    with tempfile.TemporaryDirectory() as directory:
        state = Path(directory)
        (state / "gpuwatch.yaml").write_text(f"node_name: bench\nstate_dir: {state}\n")
        clock = ManualClock()
        SimulatedNvml(load_scenario("healthy").with_gpus(gpus), clock).install()
        wired = wire(load_config(state / "gpuwatch.yaml"), pynvml, clock, state, 10040)
        recorder = next(o for o in wired.daemon.outputs if isinstance(o, LifeRecorder))
        await wired.daemon.source.start()
        took = []
        try:
            for cycle in range(cycles + 5):
                clock.advance(1.0)
                await wired.daemon.sample_once()  # the recorder runs in it; timed again below
                started = time.perf_counter()
                recorder.after_cycle(clock.now(), wired.daemon.view)
                if cycle >= 5:  # the first cycles install every GPU
                    took.append((time.perf_counter() - started) * 1000)
            batch = wired.daemon.view.batch
            samples = len(batch.samples) if batch else 0
        finally:
            await wired.daemon.source.stop()
            await wired.close()
            SimulatedNvml.uninstall()
    return statistics.median(took), max(took), samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--cycles", type=int, default=120)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(f"machine: {platform.machine()}, Python {platform.python_version()}")
    for gpus in args.gpus:
        median, largest, samples = asyncio.run(measure(gpus, args.cycles))
        print(
            f"{gpus:3d} GPUs: recorder {median:.3f} ms a cycle (largest {largest:.3f}), "
            f"{median / gpus * 1000:.1f} us a GPU; the batch holds {samples} samples"
        )


if __name__ == "__main__":
    main()
