"""Time from an injected XID to its journal entry, and to its alert's firing entry.

Runs the real daemon (NVML source on the simulator, rules, journal in a temporary state
directory) in this process, injects 10 XIDs one second apart on different GPUs, and times each
journal commit against the moment the simulator raised the XID. The journal commits (fsync) are
part of the measurement. Run: .venv/bin/python bench/xid_latency.py
"""

from __future__ import annotations

import asyncio
import logging
import platform
import statistics
import tempfile
from dataclasses import replace

from gpuwatch.clock import SystemClock
from gpuwatch.config import Config
from gpuwatch.model import Event
from gpuwatch.serve.runner import start
from gpuwatch.sim.faults import Fault
from gpuwatch.sim.library import SimulatedNvml
from gpuwatch.sim.scenario import load_scenario

XIDS = 10
CODES = (48, 74, 79, 95, 119)  # all of them fire GpuXidCritical or GpuFellOffBus


async def run() -> tuple[list[float], list[float]]:
    faults = tuple(
        Fault("xid", gpu=i % 8, at=2.0 + i, code=CODES[i % len(CODES)]) for i in range(XIDS)
    )
    scenario = replace(load_scenario("healthy"), faults=faults)
    clock = SystemClock()
    library = SimulatedNvml(scenario, clock)
    nvml = library.install()  # the real pynvml over the simulated library
    injected = {(f.gpu, f.code): library.node.start + f.at for f in faults}
    journal_ms: list[float] = []
    alert_ms: list[float] = []
    with tempfile.TemporaryDirectory() as state:
        config = Config(listen="127.0.0.1:0", state_dir=state)
        running = await start(config, nvml, clock)
        journal = running.daemon.journal
        assert journal is not None
        record = journal.record

        def timed(event: Event) -> None:
            record(event)  # committed (fsync'd) when this returns
            done = clock.now()
            if event.kind == "xid":
                journal_ms.append((done - injected[(event.gpu, event.data["xid"])]) * 1000)
            elif event.kind == "alert" and event.data["state"] == "firing":
                # the newest XID injected on that GPU is the one this alert answers
                times = [t for (g, _), t in injected.items() if g == event.gpu and t <= done]
                if times:
                    alert_ms.append((done - max(times)) * 1000)

        running.daemon.events.listeners[running.daemon.events.listeners.index(record)] = timed
        await asyncio.sleep(3.0 + XIDS)
        await running.stop()
    return journal_ms, alert_ms


def main() -> None:
    print(f"machine: {platform.machine()}, Python {platform.python_version()}")
    journal_ms, alert_ms = asyncio.run(run())
    for name, values in (("XID -> journal", journal_ms), ("XID -> alert firing", alert_ms)):
        print(
            f"{name:<20} n={len(values):>2}  p50 {statistics.median(values):6.1f} ms  "
            f"max {max(values):6.1f} ms"
        )


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)  # the daemon's XID warnings are expected here
    main()
