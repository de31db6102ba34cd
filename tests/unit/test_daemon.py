"""The node's verdict as the API reports it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pynvml

from gpuwatch import metrics as m
from gpuwatch.clock import ManualClock
from gpuwatch.config import Config
from gpuwatch.daemon import Daemon, EventLog
from gpuwatch.model import GpuStatus
from gpuwatch.nvml.config import SamplingConfig
from gpuwatch.nvml.source import NvmlSource
from gpuwatch.serve.payloads import landing_page, node_payload
from gpuwatch.serve.readers import reader_options
from gpuwatch.sim.scenario import load_scenario
from tests.conftest import Simulate
from tests.conftest import daemon_parts as parts


async def test_stale_sampling_makes_the_node_unhealthy_until_the_next_sample(
    tmp_path: Path, simulate: Simulate
) -> None:
    clock = ManualClock()
    config = Config(state_dir=str(tmp_path))
    events = EventLog()
    simulate(load_scenario("healthy"), clock)
    source = NvmlSource(pynvml, clock, config.sampling, events.publish)
    daemon = Daemon(config, clock, source, events, **parts(config))
    await source.start()
    await daemon.sample_once()
    assert node_payload(reader_options(daemon))["verdict"] == "healthy"
    # No cycle for 5 intervals (a wedged loop): the verdict says so without a new sample.
    clock.advance(5)
    node = node_payload(reader_options(daemon))
    assert node["verdict"] == "unhealthy"
    assert node["reasons"] == ["last sample is 5.0s old (more than 3 intervals)"]
    page = landing_page(node)  # what a browser on the daemon's address shows first
    assert "<b>UNHEALTHY</b>" in page
    assert "<h2>Why</h2><ul><li>last sample is 5.0s old (more than 3 intervals)</li>" in page
    await daemon.sample_once()
    assert node_payload(reader_options(daemon))["verdict"] == "healthy"
    await source.stop()


async def test_slow_fields_stay_current_between_reads_and_go_stale_when_their_gpu_is_lost(
    tmp_path: Path, simulate: Simulate
) -> None:
    """At 10 Hz each GPU's error counters are read once a second, on a timeline of their own:
    between reads they are current (in /metrics, in rules), and when the GPU falls off the bus
    they go stale in that same cycle, not a second later."""
    clock = ManualClock()
    config = Config(
        state_dir=str(tmp_path), sampling=SamplingConfig(interval=0.1, slow_interval=1.0)
    )
    events = EventLog()
    simulate(load_scenario("fall_off_bus"), clock)  # GPU 1 is lost at 10 s
    source = NvmlSource(pynvml, clock, config.sampling, events.publish)
    daemon = Daemon(config, clock, source, events, **parts(config))
    await source.start()

    def ecc_gpus() -> set[str]:
        return {
            s.label_dict["gpu"] for s in daemon.store.latest(clock.now()) if s.name == m.ECC_ERRORS
        }

    lost_at = None
    for cycle in range(110):
        await daemon.sample_once()
        assert daemon.view.batch is not None
        gpu1 = daemon.view.batch.gpus[1]
        if lost_at is None and gpu1.status == GpuStatus.LOST:
            lost_at = cycle
            assert ecc_gpus() == {"0", *(str(i) for i in range(2, 8))}
        elif cycle >= 10 and lost_at is None:
            assert ecc_gpus() == {str(i) for i in range(8)}, f"cycle {cycle}"
        clock.advance(0.1)
    await source.stop()
    assert lost_at is not None and 99 <= lost_at <= 101


def test_the_landing_page_escapes_what_came_from_outside() -> None:
    node = {
        "node": "<b>node</b>",
        "version": "0.1.0",
        "verdict": "degraded",
        "reasons": ['GPU 1: label rank="<script>alert(1)</script>"'],
        "actions": ["drain & reset"],
        "firing_alerts": ["TrainingNaN"],
    }
    page = landing_page(node)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "&lt;b&gt;node&lt;/b&gt;" in page and "drain &amp; reset" in page
    assert "<b>DEGRADED</b>" in page and "<li>TrainingNaN</li>" in page


async def test_a_wait_cancelled_as_it_finishes_stays_cancelled() -> None:
    """The clocks' waits keep a cancellation that comes as what they wait for finishes (on
    Python 3.11, asyncio.wait_for lost it, and a daemon's sampling loop cancelled at a tick
    went on sampling after the daemon stopped, until the stop timed out)."""
    import asyncio

    from gpuwatch.clock import ScaledClock, SystemClock

    for clock in (SystemClock(), ScaledClock(10.0)):
        for _ in range(20):
            done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            went_on = asyncio.Event()

            async def loop_once(clock: SystemClock | ScaledClock = clock) -> None:
                await clock.wait_for(done, 10.0)  # noqa: B023 (awaited before the next turn)
                went_on.set()  # noqa: B023

            task = asyncio.create_task(loop_once())
            await asyncio.sleep(0)  # the task waits
            done.set_result(1)
            task.cancel()  # in the same turn of the loop as the result
            await asyncio.wait([task])
            assert task.cancelled()
            assert not went_on.is_set()
