"""The node's verdict as the API reports it."""

from __future__ import annotations

from pathlib import Path

from gpuwatch.api import node_payload
from gpuwatch.clock import ManualClock
from gpuwatch.config import Config
from gpuwatch.daemon import Daemon, EventLog
from gpuwatch.nvml.source import NvmlSource
from gpuwatch.sim.fake_pynvml import FakeNvml
from gpuwatch.sim.scenario import load_scenario


async def test_stale_sampling_makes_the_node_unhealthy_until_the_next_sample(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    config = Config(state_dir=str(tmp_path))
    events = EventLog()
    source = NvmlSource(
        FakeNvml(load_scenario("healthy"), clock), clock, config.sampling, events.publish
    )
    daemon = Daemon(config, clock, source, events)
    await source.start()
    await daemon.sample_once()
    assert node_payload(daemon)["verdict"] == "healthy"
    # No cycle for 5 intervals (a wedged loop): the verdict says so without a new sample.
    clock.advance(5)
    node = node_payload(daemon)
    assert node["verdict"] == "unhealthy"
    assert node["reasons"] == ["last sample is 5.0s old (more than 3 intervals)"]
    await daemon.sample_once()
    assert node_payload(daemon)["verdict"] == "healthy"
    await source.stop()
