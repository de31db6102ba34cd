"""A simulated node for `gpuwatch run --simulate` and `gpuwatch demo`: its NVML library
installed beneath the real pynvml, and its host (sysfs, kernel log) in a directory of its own."""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gpuwatch.clock import Clock, SystemClock, sim_clock
from gpuwatch.sim.host import SimHost
from gpuwatch.sim.library import SimulatedNvml
from gpuwatch.sim.nvml_core import node_salt
from gpuwatch.sim.scenario import load_scenario

log = logging.getLogger(__name__)


def simulated_library(
    scenario_name: str, speed: float, state_dir: str | None = None, node: str = ""
) -> tuple[SimulatedNvml, Clock]:
    """A simulated node's NVML library, installed beneath the real pynvml. With a node name,
    its GPUs' UUIDs and serials are that node's own, as two real nodes' are."""
    scenario = load_scenario(scenario_name)
    clock: Clock = SystemClock() if speed == 1.0 else sim_clock(speed, state_dir)
    # Its CPU is accounted (a random sample of its calls timed), reported by the simulated host.
    library = SimulatedNvml(scenario, clock, node=node, account_cpu=True)
    library.install()
    return library, clock


@contextlib.contextmanager
def simulated_host(library: SimulatedNvml, node: str = "") -> Iterator[SimHost]:
    """The simulated node's sysfs and kernel log, in a directory of their own while it runs."""
    with tempfile.TemporaryDirectory(prefix="gpuwatch-sim-host-") as directory:
        host = SimHost(library.node, Path(directory), node_salt(node), library.cpu_used)
        log.info("simulated host (sysfs, kernel log, the simulator's CPU) under %s", directory)
        host.start()
        try:
            yield host
        finally:
            host.stop()
