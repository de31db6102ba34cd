"""A fake `pynvml` module backed by a simulated node.

It offers the functions the NVML source calls, under the same names and signatures, returning
pynvml's own ctypes structs and raising pynvml's own `NVMLError_*` classes. Constants, structs
and error classes are pynvml's (looked up on the real module); a function the fake does not
implement raises `NVMLError_FunctionNotFound`, as an old driver would.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import types
from typing import Any

import pynvml

from gpuwatch.clock import Clock
from gpuwatch.sim.node import SimEvent, SimGpu, SimNode, hash01
from gpuwatch.sim.scenario import Scenario

DRIVER_VERSION = "550.127.05"
NVML_VERSION = "12.550.127.05"

# Per-GPU fields the simulated parts support; anything else answers NotSupported.
_ECC_FIELDS = {
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
}
_REMAP_FIELDS = {
    pynvml.NVML_FI_DEV_REMAPPED_COR,
    pynvml.NVML_FI_DEV_REMAPPED_UNC,
    pynvml.NVML_FI_DEV_REMAPPED_PENDING,
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
}
_RETIRED_FIELDS = {
    pynvml.NVML_FI_DEV_RETIRED_SBE,
    pynvml.NVML_FI_DEV_RETIRED_DBE,
    pynvml.NVML_FI_DEV_RETIRED_PENDING,
}
_CRC_DATA_LINK_FIELDS = {
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0 + i for i in range(6)
} | {pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6 + i for i in range(6)}
_LINK_SCOPED_FIELDS = {
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    pynvml.NVML_FI_DEV_NVLINK_GET_STATE,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
}
# How hard the simulated faults hit: rates per second once a fault starts, and where.
ECC_SBE_PER_S = 20.0  # a single-bit storm (XID 92)
PCIE_REPLAYS_PER_S = 2.0  # 120 a minute, above Gen5 x16's expected ~31
NVLINK_CRC_PER_S = 500.0  # above DCGM's 100/s failure line
FAULTY_LINK = 0  # the NVLink that nvlink_down and nvlink_crc_storm break
RECOVERY_GPU_RESET = 1  # NVML's recovery action: GPU reset required
RETIRED_SBE_PAGES, RETIRED_DBE_PAGES = 60, 3  # 63 in all: DCGM's failure line


def _ecc(gpu: SimGpu, field_id: int) -> int:
    if field_id in (pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL):
        return gpu.fault_count("ecc_sbe", ECC_SBE_PER_S)
    return gpu.fault_count("ecc_dbe", 0.0)


def _retired(gpu: SimGpu, field_id: int) -> int:
    """retired_pages: the GPU reaches DCGM's limit of 63 retired pages, one retirement pending."""
    if not gpu.fault_count("retired_pages", 0.0):
        return 0
    if field_id == pynvml.NVML_FI_DEV_RETIRED_SBE:
        return RETIRED_SBE_PAGES
    if field_id == pynvml.NVML_FI_DEV_RETIRED_DBE:
        return RETIRED_DBE_PAGES
    return int(gpu.fault_now("retired_pages"))


def _remap(gpu: SimGpu, field_id: int) -> int:
    if field_id == pynvml.NVML_FI_DEV_REMAPPED_UNC:
        return gpu.fault_count("row_remap_pending", 0.0) + gpu.fault_count("row_remap_failure", 0.0)
    if field_id == pynvml.NVML_FI_DEV_REMAPPED_PENDING:
        return int(gpu.fault_now("row_remap_pending"))
    if field_id == pynvml.NVML_FI_DEV_REMAPPED_FAILURE:
        return int(gpu.fault_now("row_remap_failure"))
    return 0


# Field-value slots are filled through the ctypes descriptors: pynvml's struct __setattr__
# override (string encoding) would otherwise cost more than the simulation itself.
_FV = pynvml.c_nvmlFieldValue_t
_SET_FIELD_ID = _FV.fieldId.__set__
_SET_SCOPE_ID = _FV.scopeId.__set__
_SET_TIMESTAMP = _FV.timestamp.__set__
_SET_RETURN = _FV.nvmlReturn.__set__
_SET_VALUE_TYPE = _FV.valueType.__set__
_GET_VALUE = _FV.value.__get__
_SUPPORTED_REASONS = 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x80
# What a Hopper part on a current driver reports (P-state and clock changes are left out).
_SUPPORTED_EVENTS = int(
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccErrorStorm
    | pynvml.nvmlEventTypeDramRetirementEvent
    | pynvml.nvmlEventTypeDramRetirementFailure
    | pynvml.nvmlEventTypeGpuRecoveryAction
)


def _uuid(seed: int, index: int) -> str:
    digits = "".join(f"{int(hash01(seed, index, k) * 2**32):08x}" for k in range(4))
    return f"GPU-{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:32]}"


_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def _bus_id(index: int) -> str:
    bus = _HGX_BUSES[index] if index < len(_HGX_BUSES) else 0x100 + index
    return f"00000000:{bus:02X}:00.0"


class _EventSet:
    def __init__(self) -> None:
        self.masks: dict[int, int] = {}
        self.delivered = 0


class FakeNvml:
    """The pynvml API over one simulated node. Hand an instance to the NVML source as `nvml`."""

    def __init__(self, scenario: Scenario, clock: Clock) -> None:
        self.node = SimNode(scenario, clock)
        self.clock = clock
        self._initialized = 0
        self._lock = threading.Lock()
        # Handles are real pynvml device pointers, so event data carries them as NVML does.
        self._structs = [pynvml.struct_c_nvmlDevice_t() for _ in self.node.gpus]
        self._handles = [ctypes.pointer(s) for s in self._structs]
        self._by_address = {
            ctypes.addressof(s): gpu for s, gpu in zip(self._structs, self.node.gpus, strict=True)
        }
        self._uuids = [_uuid(scenario.seed, g.index) for g in self.node.gpus]
        self.calls = itertools.count()  # how many NVML calls were made (tests and benches)

    def __getattr__(self, name: str) -> Any:
        value = getattr(pynvml, name)
        if isinstance(value, types.FunctionType):

            def missing(*_args: Any, **_kwargs: Any) -> Any:
                raise pynvml.NVMLError_FunctionNotFound()

            value = missing
        setattr(self, name, value)  # later lookups skip __getattr__
        return value

    # -- plumbing -----------------------------------------------------------------------
    def _check_init(self) -> None:
        next(self.calls)
        if not self._initialized:
            raise pynvml.NVMLError_Uninitialized()

    def _gpu(self, handle: Any) -> SimGpu:
        """The GPU behind a handle, after playing its faults: a hang blocks, a lost GPU raises."""
        self._check_init()
        try:
            gpu = self._by_address[ctypes.addressof(handle.contents)]
        except (AttributeError, KeyError, ValueError):
            raise pynvml.NVMLError_InvalidArgument() from None
        now = self.clock.now()
        until = gpu.hang_until(now)
        if until is not None:
            self.clock.block(until - now)
        if gpu.lost(self.clock.now()):
            raise pynvml.NVMLError_GpuIsLost()
        return gpu

    # -- library -------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        with self._lock:
            self._initialized += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        with self._lock:
            if not self._initialized:
                raise pynvml.NVMLError_Uninitialized()
            self._initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return DRIVER_VERSION

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check_init()
        return NVML_VERSION

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.node.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check_init()
        if not 0 <= index < len(self._handles):
            raise pynvml.NVMLError_InvalidArgument()
        return self._handles[index]

    # -- identity ------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._uuids[self._gpu(handle).index]

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle).model.name

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        gpu = self._gpu(handle)
        return f"{1650000000000 + self.node.scenario.seed * 1000 + gpu.index}"

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        return self._gpu(handle).model.vbios

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._gpu(handle)
        info = pynvml.nvmlPciInfo_t()
        info.busId = _bus_id(gpu.index).encode()
        return info

    # -- sampling ------------------------------------------------------------------------
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_NotSupported()
        return self._gpu(handle).reading().temperature_c

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu(handle).reading().power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._gpu(handle).reading().power_limit_mw

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        r = self._gpu(handle).reading()
        out = pynvml.c_nvmlUtilization_t()
        out.gpu, out.memory = r.utilization_pct, r.memory_utilization_pct
        return out

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        r = self._gpu(handle).reading()
        out = pynvml.c_nvmlMemory_t()
        out.total, out.used, out.free = (
            r.memory_total,
            r.memory_used,
            r.memory_total - r.memory_used,
        )
        return out

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        r = self._gpu(handle).reading()
        if clock_type == pynvml.NVML_CLOCK_SM:
            return r.sm_clock_mhz
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return r.memory_clock_mhz
        raise pynvml.NVMLError_NotSupported()

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: Any) -> int:
        self._gpu(handle)
        return _SUPPORTED_REASONS

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu(handle).reading().clock_reasons

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle).model.pcie_generation

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle).model.pcie_width

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> Any:
        gpu = self._gpu(handle)
        reading = gpu.reading()
        values = (_FV * len(field_ids))()
        timestamp = int(self.clock.now() * 1e6)
        for slot, request in zip(values, field_ids, strict=True):
            field_id, scope = request if isinstance(request, tuple) else (request, 0)
            _SET_FIELD_ID(slot, field_id)
            _SET_SCOPE_ID(slot, scope)
            _SET_TIMESTAMP(slot, timestamp)
            value = self._field(gpu, reading, field_id, scope)
            if value is None:
                _SET_RETURN(slot, pynvml.NVML_ERROR_NOT_SUPPORTED)
                continue
            _SET_RETURN(slot, pynvml.NVML_SUCCESS)
            _SET_VALUE_TYPE(slot, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)
            _GET_VALUE(slot).ullVal = value
        return values

    def _field(self, gpu: SimGpu, reading: Any, field_id: int, scope: int) -> int | None:
        m = gpu.model
        if field_id in _ECC_FIELDS:
            return _ecc(gpu, field_id)
        if field_id in _REMAP_FIELDS:
            return _remap(gpu, field_id) if m.has_row_remapping else None
        if field_id in _RETIRED_FIELDS:
            return None if m.has_row_remapping else _retired(gpu, field_id)
        if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
            return int(reading.memory_temperature_c)
        if field_id == pynvml.NVML_FI_DEV_ENERGY:
            return int(reading.energy_mj)
        if field_id == pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER:
            return gpu.fault_count("pcie_replay_storm", PCIE_REPLAYS_PER_S)
        if field_id == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
            return RECOVERY_GPU_RESET if gpu.fault_now("recovery_action") else 0
        if field_id == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
            return m.nvlinks if m.nvlinks else None
        if field_id in _LINK_SCOPED_FIELDS:
            if not 0 <= scope < m.nvlinks:
                return None
            if field_id == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
                return int(reading.nvlink_tx_kib[scope])
            if field_id == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
                return int(reading.nvlink_rx_kib[scope])
            faulty_link = scope == FAULTY_LINK
            if field_id == pynvml.NVML_FI_DEV_NVLINK_GET_STATE:
                return 0 if faulty_link and gpu.fault_now("nvlink_down") else 1
            if field_id == pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC and faulty_link:
                return gpu.fault_count("nvlink_crc_storm", NVLINK_CRC_PER_S)
            return 0
        if field_id in _CRC_DATA_LINK_FIELDS:
            return 0 if m.has_nvlink_crc_data else None
        return None

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """The simulated training job's process on every GPU of a training node, holding the
        GPU's used memory, as pynvml returns them (friendly objects with pid, usedGpuMemory)."""
        gpu = self._gpu(handle)
        if self.node.job_pid is None:
            return []
        info = pynvml.c_nvmlProcessInfo_v3_t()
        info.pid, info.usedGpuMemory = self.node.job_pid, gpu.reading().memory_used
        info.gpuInstanceId = info.computeInstanceId = 0xFFFFFFFF
        return [pynvml.nvmlStructToFriendlyObject(info)]

    # -- the per-purpose calls older drivers offer where they lack a field id ---------------
    def _by_field(self, handle: Any, field_id: int, scope: int = 0) -> int:
        gpu = self._gpu(handle)
        value = self._field(gpu, gpu.reading(), field_id, scope)
        if value is None:
            raise pynvml.NVMLError_NotSupported()
        return value

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        corrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        volatile = counter_type == pynvml.NVML_VOLATILE_ECC
        field_id = {
            (True, True): pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
            (False, True): pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
            (True, False): pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
            (False, False): pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        }[(corrected, volatile)]
        return self._by_field(handle, field_id)

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        fields = (
            pynvml.NVML_FI_DEV_REMAPPED_COR,
            pynvml.NVML_FI_DEV_REMAPPED_UNC,
            pynvml.NVML_FI_DEV_REMAPPED_PENDING,
            pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
        )
        cor, unc, pending, failure = (self._by_field(handle, f) for f in fields)
        return cor, unc, pending, failure

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]:
        single = cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        field_id = pynvml.NVML_FI_DEV_RETIRED_SBE if single else pynvml.NVML_FI_DEV_RETIRED_DBE
        return [0x1000 * (page + 1) for page in range(self._by_field(handle, field_id))]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        return self._by_field(handle, pynvml.NVML_FI_DEV_RETIRED_PENDING)

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._by_field(handle, pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER)

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        return self._by_field(handle, pynvml.NVML_FI_DEV_NVLINK_GET_STATE, link)

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        field_id = {
            pynvml.NVML_NVLINK_ERROR_DL_REPLAY: pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
            pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
            pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
        }.get(counter)
        if counter == pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA and link < 6:
            return self._by_field(handle, pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0 + link)
        if field_id is None:
            raise pynvml.NVMLError_NotSupported()
        return self._by_field(handle, field_id, link)

    # -- events --------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> Any:
        self._check_init()
        return _EventSet()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._gpu(handle)
        return _SUPPORTED_EVENTS

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: _EventSet) -> None:
        gpu = self._gpu(handle)
        event_set.masks[gpu.index] = event_types

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> Any:
        self._check_init()
        deadline = self.clock.now() + timeout_ms / 1000.0
        while True:
            event = self._next_event(event_set)
            if event is not None:
                data = pynvml.c_nvmlEventData_t()
                data.device = self._handles[event.gpu]
                data.eventType = getattr(pynvml, event.event_type)
                data.eventData = event.data
                return data
            now = self.clock.now()
            if now >= deadline:
                raise pynvml.NVMLError_Timeout()
            # Sleep until the next scheduled event or the timeout, like a blocking wait.
            self.clock.block(min(deadline, self._next_event_time(event_set)) - now)

    def _next_event(self, event_set: _EventSet) -> SimEvent | None:
        now = self.clock.now()
        with self._lock:
            while event_set.delivered < len(self.node.events):
                event = self.node.events[event_set.delivered]
                if event.time > now:
                    return None
                event_set.delivered += 1
                if event_set.masks.get(event.gpu, 0) & getattr(pynvml, event.event_type):
                    return event
        return None

    def _next_event_time(self, event_set: _EventSet) -> float:
        with self._lock:
            pending = self.node.events[event_set.delivered :]
        return pending[0].time if pending else float("inf")

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        event_set.masks.clear()
