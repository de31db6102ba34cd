"""InfiniBand ports and the PCI bus as a sysfs tree shows them: a port that goes down, one that
flaps and one whose symbol errors climb raise their alerts and the node's causes, and clear
once the ports are stable again; a GPU on the bus that the driver does not list is a cause of
its own."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pynvml

from gpuwatch.clock import ManualClock
from gpuwatch.serve.runner import Wired, wire
from gpuwatch.sim.host import SimHost
from gpuwatch.sim.library import SimulatedNvml
from gpuwatch.sim.scenario import from_doc
from gpuwatch.text.yamlfile import parse
from tests.conftest import Simulate, node_config

PORTS = """\
name: ports
node: {gpus: 4, model: H100, workload: training, seed: 1, ib_ports: 4}
faults:
  - {kind: ib_port_down, port: 0, at: 10s, duration: 60s}
  - {kind: ib_port_flap, port: 1, at: 10s, duration: 100s}
  - {kind: ib_symbol_errors, port: 2, at: 10s, duration: 60s, rate: 1}
"""


def firing(wired: Wired) -> set[tuple[str, str]]:
    return {
        (a.name, dict(a.labels).get("device", dict(a.labels).get("pci_bus_id", "")))
        for r in wired.rules.alerting_rules()
        for a in r.active.values()
        if a.state.value == "firing"
    }


def node_causes(wired: Wired) -> set[str]:
    verdict = wired.daemon.view.node_verdict
    assert verdict is not None
    return {c.key for c in verdict.causes}


@contextlib.asynccontextmanager
async def play(
    tmp_path: Path, simulate: Simulate, scenario: str
) -> AsyncIterator[tuple[Wired, SimHost, ManualClock]]:
    """The node wired as `gpuwatch run --simulate` wires it, reading the simulated host's
    sysfs, started at the scenario's beginning, and stopped after."""
    clock = ManualClock()
    library: SimulatedNvml = simulate(from_doc(parse(scenario, "test.yaml"), "test"), clock)
    host = SimHost(library.node, tmp_path / "host")
    config, state = node_config(
        tmp_path, f"sources: {{kmsg: {{enabled: false}}, host: {{sysfs_root: {host.sysfs}}}}}\n"
    )
    wired = wire(config, pynvml, clock, state, 10040)
    await wired.daemon.start()
    try:
        yield wired, host, clock
    finally:
        await wired.daemon.stop()
        await wired.close()


async def run_until(
    wired: Wired, host: SimHost, clock: ManualClock, until: float, step: float = 1.0
) -> None:
    """Sample every `step` seconds until `until` seconds into the scenario."""
    start = host.node.start
    while clock.now() - start < until:
        clock.advance(step)
        host.update()
        await wired.daemon.sample_once()


async def test_ports_down_flapping_and_erring_raise_causes_that_clear(
    tmp_path: Path, simulate: Simulate
) -> None:
    async with play(tmp_path, simulate, PORTS) as (wired, host, clock):
        await run_until(wired, host, clock, 60)
        assert firing(wired) >= {
            ("IbPortDown", "mlx5_0"),
            ("IbPortFlapping", "mlx5_1"),
            ("IbPortSymbolErrors", "mlx5_2"),
        }
        assert {"ib-port-down:mlx5_0/1", "ib-port-flapping:mlx5_1/1",
                "ib-symbol-errors:mlx5_2/1"} <= node_causes(wired)  # fmt: skip
        assert not {a for a in firing(wired) if a[1] == "mlx5_3"}  # the healthy port
        verdict = wired.daemon.view.node_verdict
        assert verdict is not None and verdict.state.value == "unhealthy"
        [down] = [c for c in verdict.causes if c.key == "ib-port-down:mlx5_0/1"]
        assert down.reason == "InfiniBand port mlx5_0/1 is down"
        assert down.action.startswith("drain the node. Check the cable")

        await run_until(wired, host, clock, 80)  # mlx5_0 came back at 70 s
        assert ("IbPortDown", "mlx5_0") not in firing(wired)
        assert "ib-port-down:mlx5_0/1" not in node_causes(wired)

        # The flaps end at 110 s, the symbol errors at 70 s: stable for their windows after
        # (sampled less often: nothing changes any more).
        await run_until(wired, host, clock, 120)
        assert ("IbPortFlapping", "mlx5_1") in firing(wired)
        await run_until(wired, host, clock, 110 + 300 + 10, step=10.0)
        assert ("IbPortFlapping", "mlx5_1") not in firing(wired)
        await run_until(wired, host, clock, 70 + 600 + 10, step=10.0)
        assert not {a for a in firing(wired) if a[0].startswith("Ib")}
        assert not {c for c in node_causes(wired) if c.startswith("ib-")}
        verdict = wired.daemon.view.node_verdict
        assert verdict is not None and verdict.state.value == "healthy", verdict.reasons


UNLISTED = """\
name: unlisted
node: {gpus: 4, model: H100, workload: training, seed: 1}
faults:
  - {kind: gpu_missing, gpu: 2, at: 0s}
"""


async def test_a_gpu_on_the_bus_the_driver_does_not_list_is_a_cause(
    tmp_path: Path, simulate: Simulate
) -> None:
    async with play(tmp_path, simulate, UNLISTED) as (wired, host, clock):
        await run_until(wired, host, clock, 40)
        assert ("GpuNotListedByDriver", "0000:3a:00.0") in firing(wired)
        assert "gpu-unlisted:0000:3a:00.0" in node_causes(wired)
        assert len(wired.daemon.view.batch.gpus if wired.daemon.view.batch else []) == 3
