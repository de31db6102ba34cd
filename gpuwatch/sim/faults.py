"""The faults a scenario can play: their kinds, and each fault's timing and size."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuwatch.sim.driver import DriverProfile
from gpuwatch.sim.models import GpuModel

# Faults the simulated training job shows in its own reports (and, for nccl_hang,
# idle_with_memory, memory_pressure, cuda_oom and input_bound, in its GPUs' signals too), and
# the two that show only in its GPUs' link counters: its collectives at the NVLink ceiling,
# and its peer traffic staged through host memory over PCIe.
LINK_FAULT_KINDS = ("nvlink_saturated", "p2p_disabled")
JOB_FAULT_KINDS = ("nan_loss", "step_stall", "nccl_hang", "idle_with_memory",
                   "memory_pressure", "cuda_oom", "input_bound", *LINK_FAULT_KINDS)  # fmt: skip
# Every fault kind the simulator plays (docs/simulator.md).
FAULT_KINDS = (
    "xid",
    "nvml_hang",
    "fall_off_bus",
    "thermal_runaway",
    "hw_slowdown",
    "power_brake",
    "ecc_sbe",
    "ecc_dbe",
    "row_remap_pending",
    "row_remap_failure",
    "nvlink_down",
    "nvlink_crc_storm",
    "pcie_replay_storm",
    "recovery_action",
    "retired_pages",
    "nvml_error",
    "event_wait_error",
    "gpu_reset",
    "nvlink_replay",
    "nvlink_recovery",
    "thermal_shutdown",
    "gpu_missing",
    "pcie_aer",
    "pcie_downtrain",
    *JOB_FAULT_KINDS,
    "ib_port_down",
    "ib_port_flap",
    "ib_symbol_errors",
    "ib_rate_drop",
    "ib_rcv_errors",
    "ib_link_integrity_errors",
    "sxid",
    "fabric_unregistered",
    "fabric_degraded",
    "fabric_manager_down",
)
# Faults of the host beside the GPUs, played in the simulated sysfs and kernel log
# (gpuwatch.sim.host): an InfiniBand port (`port`), an NVSwitch (`switch`). They hit no GPU.
IB_FAULT_KINDS = ("ib_port_down", "ib_port_flap", "ib_symbol_errors", "ib_rate_drop",
                  "ib_rcv_errors", "ib_link_integrity_errors")  # fmt: skip
HOST_FAULT_KINDS = (*IB_FAULT_KINDS, "sxid", "fabric_manager_down")
# Faults of a GPU's place in the NVLink fabric: only a node with NVSwitches has one.
FABRIC_FAULT_KINDS = ("fabric_unregistered", "fabric_degraded", "fabric_manager_down")
# What a fabric_degraded fault makes the driver report (`condition:`), nvml.h's health mask.
FABRIC_CONDITIONS = (
    "degraded_bandwidth",
    "route_recovery",
    "route_unhealthy",
    "access_timeout_recovery",
    "incorrect_configuration",
)
ERROR_FAULT_KINDS = ("nvml_error", "event_wait_error")
AER_SEVERITIES = ("correctable", "nonfatal", "fatal")

# How hard the counting faults hit unless a scenario says (`rate:` errors a second while the
# fault lasts, after `count:` at once), so a rule can be tried just under and over its line.
DEFAULT_RATE = {
    "ecc_sbe": 20.0,  # a single-bit storm (XID 92)
    "ecc_dbe": 0.0,
    "pcie_replay_storm": 2.0,  # 120 a minute, above Gen5 x16's expected ~31
    "pcie_aer": 0.0,  # one error, counted at the port above the GPU
    "nvlink_crc_storm": 500.0,  # above DCGM's 100/s failure line
    "nvlink_replay": 0.0,
    "nvlink_recovery": 0.0,
    "ib_symbol_errors": 5.0,  # 300 a minute: far past the ten an operator tolerates
    "ib_rcv_errors": 1.0,  # malformed packets received: 60 a minute
    "ib_link_integrity_errors": 0.05,  # a burst of local physical errors every 20 s
}
DEFAULT_COUNT = {
    **{kind: 1 for kind in DEFAULT_RATE},
    "row_remap_pending": 1,  # rows remapped for uncorrectable errors
    "row_remap_failure": 1,
    "retired_pages": 63,  # DCGM's failure line
}
NVLINK_FAULT_KINDS = ("nvlink_down", "nvlink_crc_storm", "nvlink_replay", "nvlink_recovery")


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    gpu: int
    at: float  # seconds after the scenario starts
    duration: float | None = None  # None: until the end
    code: int | None = None  # XID code, for `xid`
    error: str | None = None  # nvml.h's error name, for nvml_error and event_wait_error
    action: int | None = None  # the driver's recovery action, for recovery_action
    rate: float | None = None  # errors a second while it lasts (None: DEFAULT_RATE)
    count: int | None = None  # errors (rows, pages) at once (None: DEFAULT_COUNT)
    link: int = 0  # the NVLink an NVLink fault hits
    port: int = 0  # the InfiniBand port an ib_* fault hits (the node's ports, from 0)
    switch: int = 0  # the NVSwitch an sxid fault hits
    fatal: bool = True  # whether an sxid is fatal
    condition: str = "degraded_bandwidth"  # what a fabric_degraded fault reports
    severity: str = "fatal"  # a pcie_aer fault's: correctable, nonfatal or fatal
    unit: str = ""  # an NVLink5 XID's (144-150) unit, as the driver names it (sim/xids.py)
    instance: int | None = None  # the MIG GPU instance an xid is attributed to

    @property
    def errors_per_s(self) -> float:
        """The fault's rate; a fault given only a `count` adds that many and no more."""
        if self.rate is not None:
            return self.rate
        return 0.0 if self.count is not None else DEFAULT_RATE.get(self.kind, 0.0)

    @property
    def errors_at_once(self) -> int:
        return DEFAULT_COUNT.get(self.kind, 1) if self.count is None else self.count

    def active(self, elapsed: float) -> bool:
        if elapsed < self.at:
            return False
        return self.duration is None or elapsed < self.at + self.duration


def fabric_manager_down(faults: Iterable[Fault], elapsed: float) -> bool:
    """Whether a fabric_manager_down fault holds `elapsed` seconds in: the command port the
    simulated host plays, and from R615 what the GPUs' driver says of it."""
    return any(f.kind == "fabric_manager_down" and f.active(elapsed) for f in faults)


# Faults of ECC-protected memory: a GPU with ECC off has no such errors, nor events of them.
ECC_FAULT_KINDS = ("ecc_sbe", "ecc_dbe", "row_remap_pending", "row_remap_failure", "retired_pages")


def fault_misfit(
    fault: Fault, driver: DriverProfile, ecc: bool, model: GpuModel
) -> tuple[str, str] | None:
    """(field, why) when a fault cannot happen on this GPU; None when it can."""
    if fault.action is not None and fault.action > driver.recovery_action_max:
        highest = driver.recovery_action_max
        known = f"knows recovery actions 0-{highest}" if highest >= 0 else "has none (field 230)"
        return "action", f"driver {driver.name} {known}"
    if fault.kind == "xid" and fault.unit and model.nvlink_generation < 5:
        return "code", f"{model.name} has no NVLink5, whose errors XIDs 144-150 are"
    if fault.kind in ECC_FAULT_KINDS and not ecc:
        return "kind", f"{fault.kind} needs ECC memory; this node has node.ecc: false"
    if fault.kind.startswith("row_remap") and not model.has_row_remapping:
        return "kind", f"{model.name} retires pages instead of remapping rows (retired_pages)"
    if fault.kind == "retired_pages" and model.has_row_remapping:
        return "kind", f"{model.name} remaps rows instead of retiring pages (row_remap_*)"
    if fault.kind in LINK_FAULT_KINDS and not model.nvlinks:
        return "kind", f"{model.name} has no NVLink: its peer traffic takes PCIe anyway"
    if fault.kind in NVLINK_FAULT_KINDS:
        if not model.nvlinks:
            return "kind", f"{model.name} has no NVLink"
        if fault.link >= model.nvlinks:
            return "link", f"{model.name} has links 0-{model.nvlinks - 1}"
        if fault.kind == "nvlink_replay" and model.nvlink_generation >= 5:
            # nvml.h: the DL replay counter is unsupported from Blackwell on.
            return "kind", f"{model.name} (NVLink5) has no replay counter"
    if fault.kind in FABRIC_FAULT_KINDS and fault.kind != "fabric_manager_down":
        if model.nvlink_generation < 4:
            return "kind", f"{model.name} has no place in an NVLink fabric (Hopper and later)"
        if "nvmlDeviceGetGpuFabricInfo" not in driver.entry_points:
            return "kind", f"driver {driver.name} has no fabric call (R525 and later)"
    if fault.kind == "fabric_degraded":
        filled = FABRIC_CONDITIONS[: driver.fabric_mask_fields]
        if fault.condition not in filled:
            said = ", ".join(filled) if filled else "none"
            return "condition", f"driver {driver.name} reports these fabric conditions: {said}"
    return None
