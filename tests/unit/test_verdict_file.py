"""The verdict file node-problem-detector reads: the health line, rewritten when it changes
and renewed by the monotonic clock, whatever the wall clock does."""

from __future__ import annotations

import os
from pathlib import Path

import pynvml

from gpuwatch.clock import ManualClock
from gpuwatch.serve.verdictfile import TOUCH_EVERY_S, VerdictFile
from gpuwatch.serve.wiring import wire
from gpuwatch.sim.scenario import load_scenario
from tests.conftest import Simulate, node_config


async def test_the_line_is_written_on_change_and_renewed_by_the_monotonic_clock(
    tmp_path: Path, simulate: Simulate
) -> None:
    config, state = node_config(tmp_path, "")
    clock = ManualClock()
    simulate(load_scenario("healthy"), clock)
    wired = wire(config, pynvml, clock, state, 10040)
    await wired.daemon.source.start()
    try:
        await wired.daemon.sample_once()
        monotonic = [1000.0]
        verdict = VerdictFile(state, lambda: monotonic[0])
        verdict.after_cycle(clock.now(), wired.daemon.view)
        assert verdict.path.read_text() == "healthy: 8 GPUs, nothing wrong\n"
        old = 1_000_000.0
        os.utime(verdict.path, (old, old))
        # The wall clock steps back an hour: renewal follows the monotonic clock regardless.
        clock.advance(-3600.0)
        monotonic[0] += TOUCH_EVERY_S / 2
        verdict.after_cycle(clock.now(), wired.daemon.view)
        assert verdict.path.stat().st_mtime == old  # not due yet
        monotonic[0] += TOUCH_EVERY_S / 2
        verdict.after_cycle(clock.now(), wired.daemon.view)
        assert verdict.path.stat().st_mtime > old
    finally:
        await wired.daemon.source.stop()
        await wired.close()
