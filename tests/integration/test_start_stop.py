"""Starting and stopping `gpuwatch run`'s components: a stop closes the readers before the
sampling loop, so a health check asking meanwhile finds no daemon rather than a stopped loop
read as an unhealthy node (Slurm's health check drains on unhealthy, and waits a miss out on
unreachable); a start that fails part of the way undoes what it started."""

from __future__ import annotations

import socket
from pathlib import Path

import pynvml
import pytest

from gpuwatch.clock import SystemClock
from gpuwatch.daemon import Daemon
from gpuwatch.nvml.source import NvmlSource
from gpuwatch.serve import runner
from gpuwatch.sim.scenario import load_scenario
from tests.conftest import Simulate, node_config


def answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


async def test_the_readers_close_before_the_sampling_loop_stops(
    tmp_path: Path, simulate: Simulate, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _ = node_config(tmp_path, "listen: 127.0.0.1:0\n")
    clock = SystemClock()
    simulate(load_scenario("healthy"), clock)
    running = await runner.start(config, pynvml, clock)
    control, push = running.control_path, running.push_path
    assert answers(control) and answers(push)
    seen: list[tuple[bool, bool]] = []
    source = running.daemon.source
    stop = source.stop

    async def noting() -> None:  # the daemon stops its source after the loop
        seen.append((answers(control), answers(push)))
        await stop()

    monkeypatch.setattr(source, "stop", noting)
    await running.stop()
    assert seen == [(False, False)]


async def test_a_start_that_fails_in_the_first_cycle_stops_the_source(
    tmp_path: Path, simulate: Simulate, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, state = node_config(tmp_path, "listen: 127.0.0.1:0\n")
    clock = SystemClock()
    simulate(load_scenario("healthy"), clock)
    stopped: list[str] = []
    stop = NvmlSource.stop

    async def noting(self: NvmlSource) -> None:
        stopped.append("source")
        await stop(self)

    async def failing(self: Daemon) -> None:
        raise RuntimeError("the first cycle failed")

    monkeypatch.setattr(NvmlSource, "stop", noting)
    monkeypatch.setattr(Daemon, "sample_once", failing)
    with pytest.raises(RuntimeError, match="the first cycle failed"):
        await runner.start(config, pynvml, clock)
    assert stopped == ["source"]
    assert not (state / "gpuwatch.sock").exists()
    # The state directory's lock went with it: a second start takes it.
    monkeypatch.undo()
    running = await runner.start(config, pynvml, clock)
    await running.stop()
