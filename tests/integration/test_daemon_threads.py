"""The daemon's cycle beside NVML's worker threads: the host's files are read after the GPUs,
or beside GPUs that hang. Real threads, so not a unit test."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pynvml

from gpuwatch.clock import ManualClock
from gpuwatch.config import Config
from gpuwatch.daemon import Daemon, EventLog
from gpuwatch.model import BackendState, Batch, Sample
from gpuwatch.nvml.config import SamplingConfig
from gpuwatch.nvml.source import NvmlSource
from gpuwatch.sim.scenario import load_scenario
from tests.conftest import Simulate
from tests.conftest import daemon_parts as parts


class GatedSource:
    """The simulated GPUs' source, whose cycles wait for the test to open a gate (a hung
    NVML call), and which notes when each cycle's reads finished."""

    def __init__(self, source: NvmlSource) -> None:
        self.source = source
        self.name = source.name
        self.gate = asyncio.Event()
        self.gate.set()
        self.collected = 0

    @property
    def backend(self) -> BackendState:
        return self.source.backend

    async def start(self) -> None:
        await self.source.start()

    async def collect(self) -> Batch:
        await self.gate.wait()
        batch = await self.source.collect()
        self.collected += 1
        return batch

    async def stop(self) -> None:
        await self.source.stop()


class NotingWatcher:
    """A watcher that notes how many cycles of the GPUs had been read when it was read."""

    name = "noting"

    def __init__(self, source: GatedSource) -> None:
        self.source = source
        self.read_after: list[int] = []

    async def start(self) -> None:
        pass

    async def read(self) -> list[Sample]:
        self.read_after.append(self.source.collected)
        return [Sample("noted_reads_total", (), float(len(self.read_after)))]

    async def stop(self) -> None:
        pass


async def test_the_hosts_files_are_read_after_the_gpus_or_beside_gpus_that_hang(
    tmp_path: Path, simulate: Simulate
) -> None:
    """A worker thread reading files beside the NVML runner makes the two trade the
    interpreter lock at every call: the watchers wait for the GPUs. GPUs that have not
    answered after a tenth of the deadline are waited for beside them."""
    clock = ManualClock()
    config = Config(state_dir=str(tmp_path), sampling=SamplingConfig(interval=1.0))
    events = EventLog()
    simulate(load_scenario("healthy"), clock)
    source = GatedSource(NvmlSource(pynvml, clock, config.sampling, events.publish))
    watcher = NotingWatcher(source)
    daemon = Daemon(config, clock, source, events, watchers=[watcher], **parts(config))
    await source.start()
    await daemon.sample_once()
    assert watcher.read_after == [1]  # the GPUs of this cycle were read first

    source.gate.clear()  # the next cycle's GPUs hang
    cycle = asyncio.ensure_future(daemon.sample_once())
    for _ in range(50):
        await asyncio.sleep(0.001)
    clock.advance(0.05)
    for _ in range(50):
        await asyncio.sleep(0.001)
    assert watcher.read_after == [1]  # half the wait: the files still wait for the GPUs
    clock.advance(0.06)
    for _ in range(200):
        if len(watcher.read_after) == 2:
            break
        await asyncio.sleep(0.001)
    assert watcher.read_after == [1, 1]  # read beside the hung GPUs
    assert not cycle.done()
    source.gate.set()
    await cycle
    assert source.collected == 2
    assert daemon.store.latest(clock.now())  # the cycle was stored
    noted = [s for s in daemon.store.latest(clock.now()) if s.name == "noted_reads_total"]
    assert [s.last_value for s in noted] == [2.0]
    await source.stop()
