"""A simulated GPU node: coupled signals per GPU and the faults of a scenario, as functions of time.

Utilization follows the workload; power follows utilization and clocks; temperature follows
power through a first-order thermal lag; energy and NVLink byte counters integrate power and
traffic. Faults change clocks, cooling or the GPU's answers. Everything is deterministic for a
given seed, so tests can assert exact behaviour.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from gpuwatch.clock import Clock
from gpuwatch.sim import driver as d
from gpuwatch.sim.cdefs import ERRORS
from gpuwatch.sim.faults import JOB_FAULT_KINDS, Fault
from gpuwatch.sim.models import GpuModel
from gpuwatch.sim.noise import smooth_noise
from gpuwatch.sim.reading import (
    REASON_GPU_IDLE,
    REASON_HW_POWER_BRAKE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
    Reading,
    mig_instances,
    pcie_bytes_per_s,
)
from gpuwatch.sim.scenario import Scenario

AMBIENT_C = 28.0
THERMAL_TAU_S = 25.0
CHECKPOINT_EVERY_S = 600.0
CHECKPOINT_LENGTH_S = 20.0
MAX_STEP_S = 1.0
READING_RESOLUTION_S = 0.05  # calls closer together than this see the same reading
NVLINK_SHARE = 0.3  # fraction of link bandwidth a data-parallel job keeps busy
# NCCL's data rate on links at their ceiling, of the line rate NVML reports: about 370 GB/s a
# direction over H100's 18 links of 26.562 GB/s, the rest protocol (nvlink_saturated;
# docs/simulator.md names the sources).
NVLINK_SATURATED = 0.77
# Peer traffic staged through host memory, each direction, of the PCIe link's rate: a copy
# between GPUs without peer access moves about 22 GB/s, 70% of Gen4 x16 (p2p_disabled).
PCIE_STAGED = 0.7
INPUT_PCIE_SHARE = 0.02  # of the PCIe link's rate: the input batches copied to a training GPU
EDGE_OF_MEMORY = 0.992  # of total memory a job at its limit holds (memory_pressure, cuda_oom)
XID_FELL_OFF_BUS = 79
OFF_BUS_KINDS = ("fall_off_bus", "thermal_shutdown", "gpu_missing")


class SimGpu:
    def __init__(self, node: SimNode, index: int) -> None:
        self.node = node
        self.index = index
        self.model: GpuModel = node.scenario.models[index]
        mine = [f for f in node.scenario.faults if f.gpu == index]
        self.resets = sorted(f.at for f in mine if f.kind == "gpu_reset")
        # A reset ends every fault that began before it (and clears what it left behind:
        # volatile counters, a pending remap, the driver's recovery action, a lost GPU).
        self.faults = [(f, self._end(f)) for f in mine if f.kind != "gpu_reset"]
        # Most GPUs have no fault of most kinds, and the library asks of every kind at every
        # call (each field, each handle): a miss is answered without looking through faults.
        self.fault_kinds = frozenset(f.kind for f, _ in self.faults)
        self._util: tuple[float, float] = (math.nan, 0.0)  # (t, utilization at t)
        self.instances = mig_instances(index, node.scenario.mig.get(index, ()))
        self._lock = threading.Lock()
        self._t = node.start
        self._temp = AMBIENT_C
        self._climb: tuple[float, float] | None = None  # thermal_shutdown: (from when, from °C)
        self._energy_mj = 0.0
        self._tx = [0.0] * self.model.nvlinks
        self._rx = [0.0] * self.model.nvlinks
        self._pcie_tx = self._pcie_rx = 0.0  # bytes
        # Start at thermal steady state for the workload's initial power.
        self._temp = self._target_temp(node.start, self._power_w(node.start, self._temp)[0])
        self._reading = self._read(node.start)

    def _end(self, fault: Fault) -> float:
        """When a fault stops (seconds into the scenario): its duration's end or the first
        reset after it began. A thermal shutdown's duration is the climb; the GPU stays off.
        A row-remap failure outlives resets (NVML: a remapping has failed in the past), so
        does a GPU missing from the bus (nothing there to reset), and the training job's
        faults are the job's, not the GPU's."""
        end = math.inf
        if fault.duration is not None and fault.kind != "thermal_shutdown":
            end = fault.at + fault.duration
        if fault.kind in ("row_remap_failure", "gpu_missing", *JOB_FAULT_KINDS):
            return end
        return min([end, *(r for r in self.resets if r > fault.at)])

    # -- faults --------------------------------------------------------------------------
    def active(self, kind: str, t: float) -> Fault | None:
        if kind not in self.fault_kinds:
            return None
        elapsed = t - self.node.start
        for f, end in self.faults:
            if f.kind == kind and f.at <= elapsed < end:
                return f
        return None

    def fault_count(
        self, kind: str, *, volatile: bool = False, link: int | None = None, severity: str = ""
    ) -> int:
        """Errors (rows, pages) that faults of `kind` (on `link`, of `severity`) have produced
        by now: `count` at once, then `rate` a second while the fault lasts. Counters only
        grow, as the hardware's do; a volatile one starts again from 0 at a GPU reset."""
        if kind not in self.fault_kinds:
            return 0
        elapsed = self.node.clock.now() - self.node.start
        since = max((r for r in self.resets if r <= elapsed), default=-math.inf)
        total = 0.0
        for f, end in self.faults:
            if f.kind != kind or elapsed < f.at or (link is not None and f.link != link):
                continue
            if (volatile and f.at < since) or (severity and f.severity != severity):
                continue
            total += f.errors_at_once + f.errors_per_s * (min(elapsed, end) - f.at)
        return int(total)

    def fault_now(self, kind: str, link: int | None = None) -> bool:
        f = self.active(kind, self.node.clock.now())
        return f is not None and (link is None or f.link == link)

    def lost_since(self, t: float) -> float | None:
        """Since when the GPU has been off the bus (fallen off it, shut down for heat, or
        gone at a reboot), so that a handle to it answers GpuIsLost: None while it answers."""
        if self.fault_kinds.isdisjoint(OFF_BUS_KINDS):
            return None
        elapsed = t - self.node.start
        since: float | None = None
        for f, end in self.faults:
            off = f.at + (f.duration or 0.0) if f.kind == "thermal_shutdown" else f.at
            if f.kind in OFF_BUS_KINDS and off <= elapsed < end and (since is None or off < since):
                since = off
        return None if since is None else self.node.start + since

    def lost(self, t: float) -> bool:
        return self.lost_since(t) is not None

    def missing(self, t: float) -> bool:
        """Not enumerated by the driver: gone from the bus at a reboot (gpu_missing)."""
        return self.active("gpu_missing", t) is not None

    def error_now(self, kind: str = "nvml_error") -> int | None:
        """The NVML error an nvml_error (or event_wait_error) fault makes its calls answer."""
        f = self.active(kind, self.node.clock.now())
        return ERRORS[f.error] if f is not None and f.error else None

    def recovery_action(self) -> int:
        """The driver's recovery action now (nvmlDeviceGpuRecoveryAction_t); 0 is none."""
        f = self.active("recovery_action", self.node.clock.now())
        return 0 if f is None or f.action is None else f.action

    def hang_until(self, t: float) -> float | None:
        if "nvml_hang" not in self.fault_kinds:
            return None
        elapsed = t - self.node.start
        for f, end in self.faults:
            if f.kind == "nvml_hang" and f.at <= elapsed < end:
                return self.node.start + end
        return None

    # -- signals -------------------------------------------------------------------------
    def utilization(self, t: float) -> float:
        """Asked several times for one instant as a reading is made: worked out once."""
        at, util = self._util
        if at != t:
            util = self._utilization(t)
            self._util = (t, util)
        return util

    def _utilization(self, t: float) -> float:
        if self.active("nccl_hang", t):
            return 1.0  # spinning in a collective that never completes
        if self.active("idle_with_memory", t):
            return 0.0
        elapsed = t - self.node.start
        if self.active("input_bound", t):
            # The rank waits on its data loader between steps: kernels run a third of the
            # time, in bursts (docs/simulator.md names the sources).
            return 0.3 + 0.1 * smooth_noise(self.node.scenario.seed, self.index, elapsed, 2.0)
        seed, i = self.node.scenario.seed, self.index
        workload = self.node.scenario.workload
        if workload == "idle":
            return 0.0
        if workload == "inference":
            return 0.15 + 0.7 * smooth_noise(seed, i * 16 + 1, elapsed, 15.0)
        # Data-parallel training: all GPUs in step, a checkpoint pause every ten minutes.
        in_checkpoint = (
            elapsed > CHECKPOINT_EVERY_S and elapsed % CHECKPOINT_EVERY_S < CHECKPOINT_LENGTH_S
        )
        if in_checkpoint:
            return 0.03
        return 0.93 + 0.07 * smooth_noise(seed, i * 16 + 1, elapsed, 3.0)

    def _clock_factor(self, t: float, temp: float) -> tuple[float, int]:
        factor, reasons = 1.0, 0
        if self.active("hw_slowdown", t):
            factor, reasons = min(factor, 0.5), reasons | REASON_HW_SLOWDOWN
        if self.active("power_brake", t):
            factor = min(factor, 0.2)
            reasons |= REASON_HW_POWER_BRAKE | REASON_HW_SLOWDOWN
        if temp >= self.model.max_operating_temp_c:  # nvml.h: "can be throttled below base clock"
            reasons |= REASON_SW_THERMAL
            factor = min(factor, 0.8)
        if temp >= self.model.slowdown_temp_c:
            reasons |= REASON_HW_THERMAL
            factor = min(factor, 0.6)
        return factor, reasons

    def _power_w(self, t: float, temp: float) -> tuple[float, float, int]:
        m = self.model
        util = self.utilization(t)
        factor, reasons = self._clock_factor(t, temp)
        noise = smooth_noise(self.node.scenario.seed, self.index * 16 + 2, t - self.node.start, 2.0)
        work = 0.05 if self.active("nccl_hang", t) else util  # busy-waiting draws little
        demand = (
            m.idle_power_w
            + (m.power_limit_w - m.idle_power_w) * work * (0.86 + 0.12 * noise) * factor
        )
        if demand > m.power_limit_w:
            demand, reasons = m.power_limit_w, reasons | REASON_SW_POWER_CAP
        if util < 0.05:
            reasons |= REASON_GPU_IDLE
        return demand, factor, reasons

    def _target_temp(self, t: float, power_w: float) -> float:
        resistance = self.model.thermal_resistance
        runaway = self.active("thermal_runaway", t)
        if runaway is not None:
            since = t - (self.node.start + runaway.at)
            resistance *= 1 + min(3.0, 0.03 * since)
        return AMBIENT_C + resistance * power_w

    def _step(self, t: float) -> None:
        dt = t - self._t
        if dt <= 0:
            return
        power, _, _ = self._power_w(t, self._temp)
        target = self._target_temp(t, power)
        self._temp = target + (self._temp - target) * math.exp(-dt / THERMAL_TAU_S)
        shutdown = self.active("thermal_shutdown", t)
        if shutdown is None:
            self._climb = None
        else:
            # Cooling gone: a straight climb to the shutdown temperature over the fault's
            # duration, so a scenario says when the GPU switches itself off.
            if self._climb is None:
                self._climb = (self.node.start + shutdown.at, self._temp)
            since, start_c = self._climb
            span = shutdown.duration or 0.0
            share = 1.0 if span <= 0 else min(1.0, (t - since) / span)
            self._temp = start_c + (self.model.shutdown_temp_c - start_c) * share
        self._energy_mj += power * dt * 1000.0
        self._traffic(t, dt)
        self._t = t

    def _traffic(self, t: float, dt: float) -> None:
        """NVLink data (KiB, per link) and PCIe bytes moved over `dt` seconds."""
        m = self.model
        traffic = self._traffic_share(t)
        link_rate = m.nvlink_speed_mbps * 1e6  # bytes/s, one direction
        share = traffic * NVLINK_SHARE
        if self.active("p2p_disabled", t):
            share = 0.0
        elif self.active("nvlink_saturated", t) and traffic > 0.05:
            share = NVLINK_SATURATED
        for link in range(m.nvlinks):
            self._tx[link] += share * link_rate / 1024 * dt
            self._rx[link] += share * link_rate / 1024 * dt * 0.98
        tx, rx = self.pcie_rates(t)
        self._pcie_tx += tx * dt
        self._pcie_rx += rx * dt

    def _traffic_share(self, t: float) -> float:
        return 0.0 if self.active("nccl_hang", t) else self.utilization(t)

    def pcie_rates(self, t: float) -> tuple[float, float]:
        """PCIe bytes/s out and in at `t`: input batches, peer traffic staged via the host."""
        m = self.model
        traffic = self._traffic_share(t)
        pcie_rate = pcie_bytes_per_s(m.pcie_generation, m.pcie_width)
        staged = traffic * PCIE_STAGED if self.active("p2p_disabled", t) else 0.0
        input_rate = INPUT_PCIE_SHARE * traffic if self.node.scenario.workload == "training" else 0
        return (staged + input_rate * 0.1) * pcie_rate, (staged + input_rate) * pcie_rate

    def _read(self, t: float) -> Reading:
        m = self.model
        seed, i = self.node.scenario.seed, self.index
        elapsed = t - self.node.start
        power, factor, reasons = self._power_w(t, self._temp)
        util = self.utilization(t)
        workload = self.node.scenario.workload
        share = {"training": 0.9, "inference": 0.55, "idle": 0.006}[workload]
        used = m.memory_bytes * (share + 0.03 * smooth_noise(seed, i * 16 + 3, elapsed, 60.0))
        if self.active("memory_pressure", t) or self.active("cuda_oom", t):
            # The caching allocator holds all but the last sliver: what the process has in
            # use as PyTorch reports an out-of-memory error.
            used = m.memory_bytes * (EDGE_OF_MEMORY + 0.003 * smooth_noise(seed, i, elapsed, 20.0))
        if util < 0.05:
            sm_clock = m.idle_sm_clock_mhz
        else:
            sm_clock = (
                m.max_sm_clock_mhz
                * factor
                * (0.97 + 0.03 * smooth_noise(seed, i * 16 + 4, elapsed, 5.0))
            )
        mem_util = (
            util * 0.55 + 0.1 * smooth_noise(seed, i * 16 + 5, elapsed, 4.0) if util > 0.05 else 0.0
        )
        return Reading(
            temperature_c=round(self._temp),
            memory_temperature_c=round(
                self._temp + 4 + 2 * smooth_noise(seed, i * 16 + 6, elapsed, 30.0)
            ),
            power_mw=round(power * 1000),
            power_limit_mw=round(m.power_limit_w * 1000),
            energy_mj=int(self._energy_mj),
            utilization_pct=round(util * 100),
            memory_utilization_pct=round(mem_util * 100),
            memory_used=int(used),
            memory_total=m.memory_bytes,
            sm_clock_mhz=round(sm_clock),
            memory_clock_mhz=round(m.memory_clock_mhz),
            clock_reasons=reasons,
            nvlink_tx_kib=tuple(int(v) for v in self._tx),
            nvlink_rx_kib=tuple(int(v) for v in self._rx),
            pcie_tx_bytes=int(self._pcie_tx),
            pcie_rx_bytes=int(self._pcie_rx),
        )

    def reading(self) -> Reading:
        """The GPU's signals now, integrating the physics since the last reading."""
        t = self.node.clock.now()
        with self._lock:
            if t > self._t + READING_RESOLUTION_S:
                while self._t + MAX_STEP_S < t:
                    self._step(self._t + MAX_STEP_S)
                self._step(t)
                self._reading = self._read(t)
            return self._reading


# What a real GPU reports when each fault begins: the XID it logs, and the NVML event type it
# raises besides, with that event's data. nvml.h: eventData is the XID for an XID event and 0
# for every other type (the recovery action itself is read from field 230).
FAULT_EVENTS: dict[str, tuple[tuple[int, int], ...]] = {
    "fall_off_bus": ((d.EVENT_XID, XID_FELL_OFF_BUS),),
    "ecc_sbe": ((d.EVENT_XID, 92), (d.EVENT_SBE_STORM, 0)),  # excessive single-bit ECC rate
    "ecc_dbe": ((d.EVENT_XID, 48), (d.EVENT_DBE, 0)),
    "row_remap_pending": ((d.EVENT_XID, 63), (d.EVENT_DRAM_RETIREMENT, 0)),
    "row_remap_failure": ((d.EVENT_XID, 64), (d.EVENT_DRAM_RETIREMENT_FAILURE, 0)),
    "nvlink_down": ((d.EVENT_XID, 74),),
    "recovery_action": ((d.EVENT_XID, 154), (d.EVENT_RECOVERY_ACTION, 0)),
    # On pre-Ampere parts: a page retirement recorded.
    "retired_pages": ((d.EVENT_XID, 63), (d.EVENT_DRAM_RETIREMENT, 0)),
}


@dataclass(frozen=True, slots=True)
class SimEvent:
    time: float  # when NVML hands it out
    gpu: int
    event_type: int  # an nvmlEventType bit
    data: int  # the XID for an XID event, else 0
    printed: float  # when the driver printed it to the kernel log
    fault: Fault  # the fault that raised it (what the driver prints says more of it)


class SimNode:
    def __init__(self, scenario: Scenario, clock: Clock) -> None:
        self.scenario = scenario
        self.clock = clock
        self.start = clock.now()
        self.gpus = [SimGpu(self, i) for i in range(scenario.gpus)]
        # Processes on every GPU: the simulated training job's, once started, and any a test
        # adds. On a MIG GPU they run in its first instance.
        self.pids: list[int] = []
        events = []
        for gpu in self.gpus:
            for f, end in gpu.faults:
                at = f.at  # seconds into the scenario
                if f.kind == "xid" and f.code is not None:
                    raised: tuple[tuple[int, int], ...] = ((d.EVENT_XID, f.code),)
                elif f.kind == "thermal_shutdown":
                    # The GPU switches off at the end of the climb and leaves the bus.
                    at += f.duration or 0.0
                    raised = FAULT_EVENTS["fall_off_bus"] if at < end else ()  # unless reset
                else:
                    raised = FAULT_EVENTS.get(f.kind, ())
                # A GPU whose NVML calls hang hands out no event until the hang ends; the
                # driver has printed it to the kernel log at once.
                when = self.start + at
                delivered = gpu.hang_until(when) or when
                for event_type, data in raised:
                    events.append(SimEvent(delivered, f.gpu, event_type, data, when, f))
        self.events: tuple[SimEvent, ...] = tuple(sorted(events, key=lambda e: e.time))
