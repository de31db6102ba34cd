"""Reading one GPU: opened once, then sampled every cycle in an NVML thread (nvml/caller.py).

Fields come in two tiers. The fast tier (temperatures, power, utilization, memory used, clocks,
throttle reasons, energy, processes) is read every cycle. The slow tier (ECC, retired pages, row
remapping, PCIe and NVLink counters and states, limits, MIG instances) moves slowly or is
judged over minutes, and is read only when the caller asks.

Drivers and pynvml releases differ in which calls they have. A value with a newer and an older
call (clock event reasons and throttle reasons, memory v2 and v1, ...) is read through the
first one this pair answers. A value neither answers (NOT_SUPPORTED, FUNCTION_NOT_FOUND, or
pynvml's NVMLLibraryMismatchError, which is not an NVMLError) is absent from the output, never
0 or NaN; it is logged once and asked for again every RECHECK_S, since MIG mode or a
transient state can change the answer. A GpuIsLost from any call propagates:
the whole GPU is lost, not one field. A read whose calls all fail, or any call answering
RESET_REQUIRED, is a GPU that cannot be used: NvmlGpuError. So is a GPU a whole read of which
answered no value at all (each NOT_SUPPORTED, say), until one answers again: it is not watched.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any, cast

from gpuwatch import metrics as m
from gpuwatch.host.processes import ProcessLookup
from gpuwatch.logs import fields as log_fields
from gpuwatch.model import GpuInfo, GpuProcess, MigInstance, Sample, series_text
from gpuwatch.nvml.errors import (
    ERROR_RESET_REQUIRED,
    NvmlGpuError,
    NvmlModule,
    error_code,
    error_text,
    missing_errors,
)
from gpuwatch.nvml.fabric import fabric_calls, fabric_samples
from gpuwatch.nvml.fallbacks import fallback_reader
from gpuwatch.nvml.fields import (
    CLOCK_EVENT_REASONS,
    FieldPlan,
    FieldSet,
    FieldValues,
    per_link_folded,
    plan_fields,
)
from gpuwatch.nvml.limits import BoardLimits
from gpuwatch.nvml.mig import InstanceHandle, find_instances

log = logging.getLogger(__name__)

RECHECK_S = 300.0  # how often values a GPU did not answer are asked for again
# A GPU's processes: with the fast tier, at most this often (every cycle at 1 s). An XID names
# the jobs on its GPU, and a job that fails as it starts is there for seconds.
PROCESSES_EVERY_S = 0.5


class DeviceReader:
    def __init__(
        self,
        nvml: NvmlModule,
        handle: Any,
        info: GpuInfo,
        lookup: ProcessLookup | None = None,
        *,
        now: Callable[[], float] = time.monotonic,
        vgpu_guest: bool = False,
    ) -> None:
        self.nvml = nvml
        self.handle = handle
        self.info = info
        self._now = now
        self._vgpu_guest = vgpu_guest
        self._missing = missing_errors(nvml)
        self._retired: set[str] = set()  # values nothing answers, until the next recheck
        self._choice: dict[str, int] = {}  # which of a value's calls this driver answers
        self._logged_unsupported: set[str] = set()
        self._newly_unsupported: list[str] = []
        self._reported: set[tuple[str, str]] = set()
        self._errors: list[int] = []  # this read's failed calls, by NVML error code
        self._answered = 0  # this read's values that answered
        self._mute = False  # whether the last whole read answered nothing
        self._next_recheck = now() + RECHECK_S
        base = info.labels
        self._labels = base
        self._reason_labels = [
            (bit, (*base, ("reason", reason))) for bit, reason in CLOCK_EVENT_REASONS
        ]
        self._supported_reasons: int | None = None
        plans = plan_fields(nvml, base, info.nvlink_count)
        self._fast_fields = FieldSet(nvml, [f for f in plans if not f.slow])
        self._slow_fields = FieldSet(nvml, [f for f in plans if f.slow])
        self._lookup = lookup if lookup is not None else ProcessLookup()
        self.processes: tuple[GpuProcess, ...] = ()
        self._processes_read, self._next_processes = False, 0.0  # see _read_processes
        self.instances: tuple[MigInstance, ...] = ()
        self._mig_handles: list[InstanceHandle] = []
        self._mig_mode: int | None = None
        self._field_values = FieldValues(nvml)
        self._no_such_field = {
            nvml.NVML_ERROR_NOT_SUPPORTED,
            nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            nvml.NVML_ERROR_INVALID_ARGUMENT,
        }
        # The calls listing compute processes, newest first: drivers before R510 lack _v3,
        # which pynvml's unversioned name calls.
        v2 = getattr(nvml, "nvmlDeviceGetComputeRunningProcesses_v2", None)
        self._processes_calls = (nvml.nvmlDeviceGetComputeRunningProcesses, *([v2] if v2 else []))
        self._fabric_calls = list(fabric_calls(nvml, handle).values())
        self._limits = BoardLimits(nvml, handle)  # read once, and again at each recheck
        sensor = nvml.NVML_TEMPERATURE_GPU
        # nvmlDeviceGetTemperatureV (R570, pynvml 12.570) replaces the call NVML 13 deprecates.
        self._temperature_calls: list[Callable[[], Any]] = [
            partial(getattr(nvml, name), handle, sensor)
            for name in ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature")
            if hasattr(nvml, name)
        ]

    # -- helpers -------------------------------------------------------------------------
    def _retire(self, what: str) -> None:
        self._retired.add(what)
        if what not in self._logged_unsupported:
            self._logged_unsupported.add(what)
            self._newly_unsupported.append(what)

    def _failed(self, what: str, exc: BaseException) -> None:
        self._errors.append(error_code(exc))
        key = (what, type(exc).__name__)
        if key not in self._reported:
            self._reported.add(key)
            nvml_error = isinstance(exc, self.nvml.NVMLError)
            log.warning(
                "GPU %d: %s failed: %s",
                self.info.index,
                what,
                exc,
                exc_info=None if nvml_error else exc,
                extra=log_fields(gpu=self.info.index, uuid=self.info.uuid),
            )

    def _try(self, what: str, *calls: Callable[[], Any], counted: bool = True) -> Any:
        """The first answer among `calls` (one value, newest call first), or None.
        `counted`: whether an answer is a value read (not a call whose parts are)."""
        if what in self._retired:
            return None
        nvml = self.nvml
        chosen = self._choice.get(what, 0)
        for i in range(chosen, len(calls)):
            try:
                value = calls[i]()
            except self._missing:
                continue
            except nvml.NVMLError_GpuIsLost:
                raise
            except Exception as exc:  # this call failed now; next cycle asks again
                self._failed(what, exc)
                return None
            if i != chosen:
                self._choice[what] = i
            self._answered += counted
            return value
        self._retire(what)
        return None

    def _recheck(self) -> None:
        """Ask again for every value the GPU did not answer."""
        self._next_recheck = self._now() + RECHECK_S
        self._retired.clear()
        self._choice.clear()
        self._supported_reasons = None
        self._fast_fields.reset()
        self._slow_fields.reset()
        self._mig_mode = None
        self._limits.reset()

    # -- sampling ------------------------------------------------------------------------
    def read(self, slow: bool = True) -> tuple[list[Sample], list[Sample] | None]:
        """One cycle's samples for this GPU: (fast tier, slow tier or None when `slow` is
        False). Runs in an NVML thread, never two at once for one GPU."""
        if self._now() >= self._next_recheck:
            self._recheck()
        self._errors.clear()
        self._answered = 0
        nvml, h, base = self.nvml, self.handle, self._labels
        out: list[Sample] = [Sample(m.GPU_UP, base, 1.0)]
        slow_out: list[Sample] | None = [] if slow else None

        def add(name: str, value: float | None, scale: float = 1.0) -> None:
            if value is not None:
                out.append(Sample(name, base, float(value) * scale))

        add(m.TEMPERATURE, self._try("temperature", *self._temperature_calls))
        add(m.POWER, self._try("power", lambda: nvml.nvmlDeviceGetPowerUsage(h)), 0.001)
        util = self._try("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            add(m.UTILIZATION, util.gpu, 0.01)
            add(m.MEMORY_BANDWIDTH_UTILIZATION, util.memory, 0.01)
        mem = self._read_memory(h)
        if mem is not None:
            add(m.MEMORY_USED, mem.used)
            if slow_out is not None:
                slow_out.append(Sample(m.MEMORY_TOTAL, base, float(mem.total)))
        add(
            m.SM_CLOCK,
            self._try("sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
            1e6,
        )
        add(
            m.MEMORY_CLOCK,
            self._try("memory_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)),
            1e6,
        )
        self._read_clock_events(out)
        self._read_fields(self._fast_fields, out)
        self._read_processes(out)
        if slow_out is not None:
            self._read_slow(slow_out)
        if self._newly_unsupported:
            log.info(
                "GPU %d: not supported, left out: %s",
                self.info.index,
                "; ".join(per_link_folded(self._newly_unsupported)),
                extra=log_fields(gpu=self.info.index, uuid=self.info.uuid),
            )
            self._newly_unsupported.clear()
        self._check_errors(whole=slow)
        return out, slow_out

    def _check_errors(self, whole: bool) -> None:
        """A GPU whose calls all failed, or that asks for a reset, cannot be used; one that
        answers nothing at all cannot be watched. `whole`: this read asked for both tiers (a
        fast read answering nothing says little: every fast value may be unsupported)."""
        errors = self._errors
        if self._answered:
            self._mute = False
        elif whole and not errors:
            self._mute = True
        if ERROR_RESET_REQUIRED in errors:
            code, what = ERROR_RESET_REQUIRED, ""
        elif errors and self._answered == 0:
            code, what = Counter(errors).most_common(1)[0][0], ""
        elif self._mute:
            code, what = self.nvml.NVML_ERROR_NOT_SUPPORTED, " for every value asked for"
        else:
            return
        raise NvmlGpuError(code, error_text(self.nvml, code) + what)

    def _read_memory(self, h: Any, what: str = "memory") -> Any:
        """nvmlMemory_v2 where the driver has it (R510): its `used` leaves out what the driver
        reserves, which v1 counts (an idle H100 shows ~500 MiB used in v1)."""
        nvml = self.nvml
        v2 = getattr(nvml, "nvmlMemory_v2", None)
        calls = [partial(nvml.nvmlDeviceGetMemoryInfo, h)]
        if v2 is not None:
            calls.insert(0, partial(nvml.nvmlDeviceGetMemoryInfo, h, v2))
        return self._try(what, *calls)

    def _read_slow(self, out: list[Sample]) -> None:
        nvml, h, base = self.nvml, self.handle, self._labels
        for name, what, call, scale in (
            (m.POWER_LIMIT, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, 0.001),
            (m.PCIE_LINK_GENERATION, "pcie_gen", nvml.nvmlDeviceGetCurrPcieLinkGeneration, 1.0),
            (m.PCIE_LINK_WIDTH, "pcie_width", nvml.nvmlDeviceGetCurrPcieLinkWidth, 1.0),
        ):
            value = self._try(what, partial(call, h))
            if value is not None:
                out.append(Sample(name, base, float(value) * scale))
        limits = self._limits.read(self._try, lambda: len(self._errors))
        out.extend(Sample(name, base, value) for name, value in limits.items())
        self._read_fields(self._slow_fields, out)
        fabric = self._try("fabric", *self._fabric_calls)
        if fabric is not None:
            out.extend(fabric_samples(fabric, base))
        self._read_instances(out)

    def _list_processes(self, what: str, handle: Any) -> list[Any] | None:
        calls = (partial(f, handle) for f in self._processes_calls)
        return cast("list[Any] | None", self._try(what, *calls))

    def _read_processes(self, out: list[Sample]) -> None:
        """Between reads the last list stands, and its count goes out every cycle."""
        if (now := self._now()) >= self._next_processes - 0.05:  # ticks jitter
            self._next_processes = now + PROCESSES_EVERY_S
            found = self._list_processes("processes", self.handle)
            self._processes_read = found is not None  # a failed read sends no count
            if found is not None:
                described = (self._lookup.describe(int(p.pid), p.usedGpuMemory) for p in found)
                self.processes = tuple(p for p in described if p is not None)
        if self._processes_read:
            out.append(Sample(m.GPU_PROCESSES, self._labels, float(len(self.processes))))

    def _read_instances(self, out: list[Sample]) -> None:
        """MIG: each GPU instance's memory and processes, through its own handle. The mode
        and the instances are looked up after opening, at every recheck, and when an
        instance stops answering (destroyed): not every cycle, which would cost a call."""
        if self._mig_mode is None:
            mode = self._try("mig_mode", lambda: self.nvml.nvmlDeviceGetMigMode(self.handle))
            self._mig_mode = int(mode[0]) if mode is not None else 0
            self._mig_handles = find_instances(self.nvml, self.handle) if self._mig_mode else []
            self._reported = {k for k in self._reported if not k[0].startswith("MIG ")}
        instances = []
        for inst in self._mig_handles:
            labels = (*self._labels, ("gpu_i_id", str(inst.gpu_instance_id)),
                      ("gpu_i_profile", inst.profile))  # fmt: skip
            mem = self._read_memory(inst.handle, f"MIG {inst.gpu_instance_id} memory")
            found = self._list_processes(f"MIG {inst.gpu_instance_id} processes", inst.handle)
            used = float(mem.used) if mem is not None else None
            total = float(mem.total) if mem is not None else None
            if used is not None and total is not None:
                out.append(Sample(m.INSTANCE_MEMORY_USED, labels, used))
                out.append(Sample(m.INSTANCE_MEMORY_TOTAL, labels, total))
            if mem is None and found is None:
                self._mig_mode = None  # gone, or changed: look again next time
            pids: tuple[int, ...] | None = None
            if found is not None:
                pids = tuple(int(p.pid) for p in found)
                out.append(Sample(m.INSTANCE_PROCESSES, labels, float(len(pids))))
            instances.append(
                MigInstance(inst.gpu_instance_id, inst.profile, inst.uuid, used, total, pids)
            )
        self.instances = tuple(instances)

    def _read_clock_events(self, out: list[Sample]) -> None:
        """Clock event reasons (R535 and later), or the same bits under their older name,
        throttle reasons."""
        nvml, h = self.nvml, self.handle
        if self._supported_reasons is None:
            supported = self._try(
                "clock_event_reasons_supported",
                lambda: nvml.nvmlDeviceGetSupportedClocksEventReasons(h),
                lambda: nvml.nvmlDeviceGetSupportedClocksThrottleReasons(h),
            )
            if supported is None:
                if "clock_event_reasons_supported" not in self._retired:
                    return  # transient failure: ask again next cycle
                supported = 0xFFFFFFFF
            self._supported_reasons = int(supported)
        current = self._try(
            "clock_event_reasons",
            lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(h),
            lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        )
        if current is None:
            return
        for bit, labels in self._reason_labels:
            if self._supported_reasons & bit:
                out.append(Sample(m.CLOCK_EVENT, labels, 1.0 if current & bit else 0.0))

    def _read_fields(self, fields: FieldSet, out: list[Sample]) -> None:
        if fields.plans:
            values = self._try("field_values", partial(fields.request, self.handle), counted=False)
            if values is not None:
                self._read_field_values(fields, values, out)
        for plan, reader in fields.fallbacks:
            value = self._try(f"{series_text(plan.name, plan.labels[2:])} (call)", reader)
            if value is not None:
                out.append(Sample(plan.name, plan.labels, value * plan.scale))

    def _read_field_values(self, fields: FieldSet, values: Any, out: list[Sample]) -> None:
        nvml = self.nvml
        success, lost = nvml.NVML_SUCCESS, nvml.NVML_ERROR_GPU_IS_LOST
        refused: dict[int, tuple[FieldPlan, bool]] = {}  # by identity: __eq__ cost more
        answered = 0
        memory_temperature = m.MEMORY_TEMPERATURE
        entries = self._field_values.entries(values)
        for plan, (ret, value, narrow) in zip(fields.plans, entries, strict=True):
            if ret == success and not (narrow and plan.wide):
                answered += 1
                if plan.one_hot:
                    for i, state in enumerate(plan.one_hot):
                        labels = (*plan.labels, ("action", state))
                        out.append(Sample(plan.name, labels, 1.0 if int(value) == i else 0.0))
                elif plan.name == memory_temperature and value == 0 and self._vgpu_guest:
                    continue  # a vGPU guest answers 0 where it has no sensor to read
                else:
                    out.append(Sample(plan.name, plan.labels, value * plan.scale))
            elif ret in self._no_such_field or ret == success:  # or a counter that wraps
                refused[id(plan)] = (plan, ret == success)
            elif ret == lost:
                raise nvml.NVMLError(ret)
            else:
                self._failed(f"field {plan.request} ({plan.name})", nvml.NVMLError(ret))
        self._answered += answered
        if refused:  # stop asking for these
            fields.keep([p for p in fields.plans if id(p) not in refused])
            for plan, narrow in refused.values():
                self._refused(fields, plan, narrow)

    def _refused(self, fields: FieldSet, plan: FieldPlan, narrow: bool) -> None:
        """No such field (or a counter in 32 bits, which wraps): read it by its call, if any."""
        if narrow:
            return self._retire(f"{plan.what} (32 bits: wraps between reads)")
        reader = fallback_reader(self.nvml, self.handle, plan.request)
        if reader is not None:
            fields.fallbacks.append((plan, reader))
            return
        self._retire(plan.what)
