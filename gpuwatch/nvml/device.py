"""Reading one GPU: opened once, then sampled every cycle inside its NVML worker thread.

Fields come in two tiers. The fast tier (temperatures, power, utilization, memory used, clocks,
throttle reasons, energy) is read every cycle. The slow tier (ECC, retired pages, row
remapping, PCIe and NVLink counters and states, limits, processes) moves slowly or is judged
over minutes, and is read only when the caller asks: at 10 Hz it is most of the fields, and
reading it every cycle would cost several times the fast tier for nothing anyone could see.

A value NVML does not support on this GPU (NotSupported, FunctionNotFound) is absent from the
output, never 0 or NaN; it is logged once and not asked for again. A GpuIsLost from any call
propagates: the whole GPU is lost, not one field.
"""

from __future__ import annotations

import ctypes
import logging
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from gpuwatch import metrics as m
from gpuwatch.model import GpuInfo, Labels, Sample
from gpuwatch.nvml.fallbacks import Reader, fallback_reader
from gpuwatch.processes import GpuProcess, ProcessLookup

log = logging.getLogger(__name__)
T = TypeVar("T")

NvmlModule = Any  # the pynvml module, or the simulator's FakeNvml: same names, same behaviour

CLOCK_EVENT_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clock_setting"),
)
RECOVERY_ACTIONS = ("none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset")
# Legacy per-link CRC data counters exist for links 0-11 only; NVLink4+ parts do not report them.
LEGACY_LINKS = 12


def handle_key(handle: Any) -> int:
    """A stable identity for an NVML device handle (a ctypes pointer), as events carry it."""
    return ctypes.addressof(handle.contents)


def as_text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def value_members(nvml: NvmlModule) -> dict[int, str]:
    """NVML value type -> the member of the nvmlValue_t union that holds it."""
    return {
        nvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
    }


class FieldValues:
    """Reads entries of an nvmlFieldValue_t array.

    pynvml's structs override __getattribute__ (to decode strings); reading through the ctypes
    field descriptors skips that, which matters at ~150 fields per GPU per cycle.
    """

    def __init__(self, nvml: NvmlModule) -> None:
        cls = nvml.c_nvmlFieldValue_t
        self._return = cls.nvmlReturn.__get__
        self._type = cls.valueType.__get__
        self._value = cls.value.__get__
        self._members = value_members(nvml)

    def returned(self, fv: Any) -> int:
        return int(self._return(fv))

    def value(self, fv: Any) -> float:
        return float(getattr(self._value(fv), self._members.get(self._type(fv), "ullVal")))


@dataclass(frozen=True, slots=True)
class _FieldPlan:
    """One requested field value and how it becomes a sample (or several, for one-hot fields)."""

    request: int | tuple[int, int]
    name: str
    labels: Labels
    scale: float = 1.0
    one_hot: tuple[str, ...] = ()
    slow: bool = True  # read only in the slow tier (most fields: counters and states)


def open_device(nvml: NvmlModule, index: int, lookup: ProcessLookup | None = None) -> DeviceReader:
    """Open GPU `index` and read what identifies it. Runs in a worker thread. `lookup` is
    shared between a node's GPUs: one process often holds several."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    uuid = as_text(nvml.nvmlDeviceGetUUID(handle))
    name = as_text(nvml.nvmlDeviceGetName(handle))

    def optional(fn: Callable[[], T], default: T) -> T:
        """What fn() reads, or `default` when NVML cannot say; a lost GPU still propagates."""
        try:
            return fn()
        except nvml.NVMLError_GpuIsLost:
            raise
        except nvml.NVMLError:
            return default

    def link_count() -> int:
        fv = nvml.nvmlDeviceGetFieldValues(handle, [nvml.NVML_FI_DEV_NVLINK_LINK_COUNT])[0]
        read = FieldValues(nvml)
        if read.returned(fv) == nvml.NVML_SUCCESS:
            return int(read.value(fv))
        # An older driver without the field: count the links that have a state.
        count = 0
        while count < nvml.NVML_NVLINK_MAX_LINKS:
            try:
                nvml.nvmlDeviceGetNvLinkState(handle, count)
            except nvml.NVMLError_GpuIsLost:
                raise
            except nvml.NVMLError:
                break
            count += 1
        return count

    pci = optional(lambda: as_text(nvml.nvmlDeviceGetPciInfo(handle).busId), "")
    serial = optional(lambda: as_text(nvml.nvmlDeviceGetSerial(handle)), "")
    vbios = optional(lambda: as_text(nvml.nvmlDeviceGetVbiosVersion(handle)), "")
    links = optional(link_count, 0)
    info = GpuInfo(index, uuid, name, pci, serial, vbios, links)
    return DeviceReader(nvml, handle, info, lookup)


_LINK_LABEL = re.compile(r"'link': '\d+', ")


def _per_link_folded(items: list[str]) -> list[str]:
    """The same value on 18 links is one entry with a count, not 18."""
    counts = Counter(_LINK_LABEL.sub("", item) for item in items)
    return [f"{item} on {n} links" if n > 1 else item for item, n in counts.items()]


class _FieldSet:
    """One tier's fields, asked for in one nvmlDeviceGetFieldValues call. A field the driver
    refuses moves to `fallbacks` (read through its older call) or is dropped."""

    __slots__ = ("fallbacks", "plans", "requests")

    def __init__(self, plans: list[_FieldPlan]) -> None:
        self.plans = plans
        self.requests = [f.request for f in plans]
        self.fallbacks: list[tuple[_FieldPlan, Reader]] = []

    def keep(self, plans: list[_FieldPlan]) -> None:
        self.plans = plans
        self.requests = [f.request for f in plans]


class DeviceReader:
    def __init__(
        self, nvml: NvmlModule, handle: Any, info: GpuInfo, lookup: ProcessLookup | None = None
    ) -> None:
        self.nvml = nvml
        self.handle = handle
        self.info = info
        self._unsupported: set[str] = set()
        self._newly_unsupported: list[str] = []
        self._reported: set[tuple[str, str]] = set()
        base = info.labels
        self._labels = base
        self._reason_labels = [
            (bit, (*base, ("reason", reason))) for bit, reason in CLOCK_EVENT_REASONS
        ]
        self._supported_reasons: int | None = None
        plans = self._plan_fields(nvml, base, info.nvlink_count)
        self._fast_fields = _FieldSet([f for f in plans if not f.slow])
        self._slow_fields = _FieldSet([f for f in plans if f.slow])
        self._lookup = lookup if lookup is not None else ProcessLookup()
        self.processes: tuple[GpuProcess, ...] = ()
        self._field_values = FieldValues(nvml)
        self._no_such_field = {
            nvml.NVML_ERROR_NOT_SUPPORTED,
            nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            nvml.NVML_ERROR_INVALID_ARGUMENT,
        }

    @staticmethod
    def _plan_fields(nvml: NvmlModule, base: Labels, links: int) -> list[_FieldPlan]:
        ecc, retired, remap = m.ECC_ERRORS, m.RETIRED_PAGES, m.REMAPPED_ROWS
        plan = [
            _FieldPlan(
                nvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
                ecc,
                (*base, ("type", "corrected"), ("scope", "volatile")),
            ),
            _FieldPlan(
                nvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
                ecc,
                (*base, ("type", "uncorrected"), ("scope", "volatile")),
            ),
            _FieldPlan(
                nvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
                ecc,
                (*base, ("type", "corrected"), ("scope", "aggregate")),
            ),
            _FieldPlan(
                nvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
                ecc,
                (*base, ("type", "uncorrected"), ("scope", "aggregate")),
            ),
            _FieldPlan(nvml.NVML_FI_DEV_RETIRED_SBE, retired, (*base, ("cause", "sbe"))),
            _FieldPlan(nvml.NVML_FI_DEV_RETIRED_DBE, retired, (*base, ("cause", "dbe"))),
            _FieldPlan(nvml.NVML_FI_DEV_RETIRED_PENDING, m.RETIRED_PAGES_PENDING, base),
            _FieldPlan(nvml.NVML_FI_DEV_REMAPPED_COR, remap, (*base, ("type", "correctable"))),
            _FieldPlan(nvml.NVML_FI_DEV_REMAPPED_UNC, remap, (*base, ("type", "uncorrectable"))),
            _FieldPlan(nvml.NVML_FI_DEV_REMAPPED_PENDING, m.ROW_REMAP_PENDING, base),
            _FieldPlan(nvml.NVML_FI_DEV_REMAPPED_FAILURE, m.ROW_REMAP_FAILED, base),
            _FieldPlan(nvml.NVML_FI_DEV_MEMORY_TEMP, m.MEMORY_TEMPERATURE, base, slow=False),
            _FieldPlan(nvml.NVML_FI_DEV_ENERGY, m.ENERGY, base, scale=0.001, slow=False),
            _FieldPlan(nvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, m.PCIE_REPLAYS, base),
            _FieldPlan(
                nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
                m.RECOVERY_ACTION,
                base,
                one_hot=RECOVERY_ACTIONS,
            ),
        ]
        for link in range(links):
            lb = (*base, ("link", str(link)))
            plan += [
                _FieldPlan(
                    (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link),
                    m.NVLINK_BYTES,
                    (*lb, ("direction", "tx")),
                    scale=1024.0,
                ),
                _FieldPlan(
                    (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link),
                    m.NVLINK_BYTES,
                    (*lb, ("direction", "rx")),
                    scale=1024.0,
                ),
                _FieldPlan((nvml.NVML_FI_DEV_NVLINK_GET_STATE, link), m.NVLINK_LINK_UP, lb),
                _FieldPlan(
                    (nvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, link),
                    m.NVLINK_ERRORS,
                    (*lb, ("type", "replay")),
                ),
                _FieldPlan(
                    (nvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, link),
                    m.NVLINK_ERRORS,
                    (*lb, ("type", "recovery")),
                ),
                _FieldPlan(
                    (nvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, link),
                    m.NVLINK_ERRORS,
                    (*lb, ("type", "crc_flit")),
                ),
            ]
            if link < LEGACY_LINKS:
                first = (
                    nvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0
                    if link < 6
                    else nvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6 - 6
                )
                plan.append(_FieldPlan(first + link, m.NVLINK_ERRORS, (*lb, ("type", "crc_data"))))
        return plan

    # -- helpers -------------------------------------------------------------------------
    def _unsupported_now(self, what: str) -> None:
        self._unsupported.add(what)
        self._newly_unsupported.append(what)

    def _failed(self, what: str, exc: Exception) -> None:
        key = (what, type(exc).__name__)
        if key not in self._reported:
            self._reported.add(key)
            log.warning("gpu=%d uuid=%s %s failed: %s", self.info.index, self.info.uuid, what, exc)

    def _try(self, what: str, fn: Callable[[], Any]) -> Any:
        """fn() or None; NotSupported/FunctionNotFound retire the call, GpuIsLost propagates."""
        if what in self._unsupported:
            return None
        nvml = self.nvml
        try:
            return fn()
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            self._unsupported_now(what)
        except nvml.NVMLError_GpuIsLost:
            raise
        except nvml.NVMLError as exc:
            self._failed(what, exc)
        return None

    # -- sampling ------------------------------------------------------------------------
    def read(self, slow: bool = True) -> tuple[list[Sample], list[Sample] | None]:
        """One cycle's samples for this GPU: (fast tier, slow tier or None when `slow` is
        False). Runs in the GPU's worker thread."""
        nvml, h, base = self.nvml, self.handle, self._labels
        out: list[Sample] = [Sample(m.GPU_UP, base, 1.0)]
        slow_out: list[Sample] | None = [] if slow else None

        def add(name: str, value: float | None, scale: float = 1.0) -> None:
            if value is not None:
                out.append(Sample(name, base, float(value) * scale))

        add(
            m.TEMPERATURE,
            self._try(
                "temperature", lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
            ),
        )
        add(m.POWER, self._try("power", lambda: nvml.nvmlDeviceGetPowerUsage(h)), 0.001)
        util = self._try("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            add(m.UTILIZATION, util.gpu, 0.01)
            add(m.MEMORY_BANDWIDTH_UTILIZATION, util.memory, 0.01)
        mem = self._try("memory", lambda: nvml.nvmlDeviceGetMemoryInfo(h))
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
        if slow_out is not None:
            self._read_slow(slow_out)
        if self._newly_unsupported:
            log.info(
                "gpu=%d uuid=%s not supported, left out: %s",
                self.info.index,
                self.info.uuid,
                "; ".join(_per_link_folded(self._newly_unsupported)),
            )
            self._newly_unsupported.clear()
        return out, slow_out

    def _read_slow(self, out: list[Sample]) -> None:
        nvml, h, base = self.nvml, self.handle, self._labels
        for name, what, call, scale in (
            (m.POWER_LIMIT, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, 0.001),
            (m.PCIE_LINK_GENERATION, "pcie_generation", nvml.nvmlDeviceGetCurrPcieLinkGeneration,
             1.0),
            (m.PCIE_LINK_WIDTH, "pcie_width", nvml.nvmlDeviceGetCurrPcieLinkWidth, 1.0),
        ):  # fmt: skip
            value = self._try(what, partial(call, h))
            if value is not None:
                out.append(Sample(name, base, float(value) * scale))
        self._read_fields(self._slow_fields, out)
        self._read_processes(out)

    def _read_processes(self, out: list[Sample]) -> None:
        nvml, h = self.nvml, self.handle
        found = self._try("processes", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(h))
        if found is None:
            return
        described = (self._lookup.describe(int(p.pid), p.usedGpuMemory) for p in found)
        self.processes = tuple(p for p in described if p is not None)
        out.append(Sample(m.GPU_PROCESSES, self._labels, float(len(self.processes))))

    def _read_clock_events(self, out: list[Sample]) -> None:
        nvml, h = self.nvml, self.handle
        if self._supported_reasons is None:
            supported = self._try(
                "clock_event_reasons_supported",
                lambda: nvml.nvmlDeviceGetSupportedClocksEventReasons(h),
            )
            if supported is None:
                if "clock_event_reasons_supported" not in self._unsupported:
                    return  # transient failure: ask again next cycle
                supported = 0xFFFFFFFF
            self._supported_reasons = int(supported)
        current = self._try(
            "clock_event_reasons", lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        )
        if current is None:
            return
        for bit, labels in self._reason_labels:
            if self._supported_reasons & bit:
                out.append(Sample(m.CLOCK_EVENT, labels, 1.0 if current & bit else 0.0))

    def _read_fields(self, fields: _FieldSet, out: list[Sample]) -> None:
        nvml = self.nvml
        if fields.plans:
            requests = fields.requests
            values = self._try(
                "field_values", lambda: nvml.nvmlDeviceGetFieldValues(self.handle, requests)
            )
            if values is not None:
                self._read_field_values(fields, values, out)
        for plan, reader in fields.fallbacks:
            value = self._try(f"{plan.name}{dict(plan.labels[2:]) or ''} (call)", reader)
            if value is not None:
                out.append(Sample(plan.name, plan.labels, value * plan.scale))

    def _read_field_values(self, fields: _FieldSet, values: Any, out: list[Sample]) -> None:
        nvml = self.nvml
        keep: list[_FieldPlan] = []
        success, lost, read = nvml.NVML_SUCCESS, nvml.NVML_ERROR_GPU_IS_LOST, self._field_values
        for plan, fv in zip(fields.plans, values, strict=True):
            ret = read.returned(fv)
            if ret == success:
                keep.append(plan)
                value = read.value(fv)
                if plan.one_hot:
                    for i, state in enumerate(plan.one_hot):
                        out.append(
                            Sample(
                                plan.name,
                                (*plan.labels, ("action", state)),
                                1.0 if int(value) == i else 0.0,
                            )
                        )
                else:
                    out.append(Sample(plan.name, plan.labels, value * plan.scale))
            elif ret in self._no_such_field:
                self._refused(fields, plan)
            elif ret == lost:
                raise nvml.NVMLError(ret)
            else:
                keep.append(plan)
                self._failed(f"field {plan.request} ({plan.name})", nvml.NVMLError(ret))
        if len(keep) != len(fields.plans):  # some fields turned out unsupported: stop asking
            fields.keep(keep)

    def _refused(self, fields: _FieldSet, plan: _FieldPlan) -> None:
        """The driver has no such field: read it through its call where there is one."""
        reader = fallback_reader(self.nvml, self.handle, plan.request)
        if reader is not None:
            fields.fallbacks.append((plan, reader))
            return
        self._unsupported_now(f"{plan.name}{dict(plan.labels[2:]) or ''} (field {plan.request})")
