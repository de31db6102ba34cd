"""What a simulated GPU reads as at an instant, in NVML's units, and its MIG instances."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatch.sim.mig import MIG_PROFILE, instance_ids
from gpuwatch.sim.models import GIB

# Clock-event reason bits, as NVML reports them.
REASON_GPU_IDLE = 0x1


REASON_SW_POWER_CAP = 0x4


REASON_HW_SLOWDOWN = 0x8


REASON_SW_THERMAL = 0x20


REASON_HW_THERMAL = 0x40


REASON_HW_POWER_BRAKE = 0x80


@dataclass(frozen=True, slots=True)
class Reading:
    """One GPU's signals at an instant, in the units NVML reports."""

    temperature_c: int
    memory_temperature_c: int
    power_mw: int
    power_limit_mw: int
    energy_mj: int
    utilization_pct: int
    memory_utilization_pct: int
    memory_used: int
    memory_total: int
    sm_clock_mhz: int
    memory_clock_mhz: int
    clock_reasons: int
    nvlink_tx_kib: tuple[int, ...]
    nvlink_rx_kib: tuple[int, ...]
    pcie_tx_bytes: int
    pcie_rx_bytes: int


def pcie_bytes_per_s(generation: int, width: int) -> float:
    """A PCIe link's rate in one direction, in bytes/s: 2.5 and 5 GT/s a lane at Gen1 and 2
    (8b/10b encoded), 8 GT/s at Gen3 doubling with each generation after (128b/130b), as the
    PCIe base specification gives them."""
    if generation < 3:
        return 2.5e9 * generation * 0.8 / 8 * width
    return 8e9 * 2.0 ** (generation - 3) * 128 / 130 / 8 * width


RESERVED_FRACTION = 0.006  # of total memory the driver and firmware keep (nvmlMemory_v2)


@dataclass(frozen=True, slots=True)
class SimInstance:
    """One MIG GPU instance (with one compute instance spanning it)."""

    parent: int
    index: int  # its MIG device index on the parent
    profile: str  # as nvidia-smi names it: 3g.40gb
    gpu_instance_id: int
    memory_total: int


def mig_instances(gpu: int, profiles: tuple[str, ...]) -> tuple[SimInstance, ...]:
    out = []
    for index, (profile, gi_id) in enumerate(zip(profiles, instance_ids(profiles), strict=True)):
        match = MIG_PROFILE.match(profile)
        gigabytes = int(match.group(2)) if match else 10
        out.append(SimInstance(gpu, index, profile, gi_id, gigabytes * GIB))
    return tuple(out)
