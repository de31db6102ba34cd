"""A simulated libnvidia-ml.so.1 beneath the real pynvml.

pynvml finds every entry point with `getattr(pynvml.nvmlLib, name)` and calls it through
ctypes. Here `nvmlLib` is an object whose attributes are C function pointers (`CFUNCTYPE`)
over a simulated node, one for each entry point the node's driver profile exports; pynvml's
own wrappers, structs, version handling and error mapping run exactly as over a driver. A
symbol the profile lacks is missing (pynvml: FUNCTION_NOT_FOUND), and every answer is written
into the caller's memory in nvml.h's layout (gpuwatch.sim.cdefs), whatever pynvml expects.

Why not a C library built against nvml.h: it would need a compiler on every machine that runs
the tests or the demo, and the node's physics and faults live in Python anyway; a C shim would
only call back into them. The cost of this choice is that pynvml and this library share one
process, so only one simulated node can be installed at a time (pynvml keeps one `nvmlLib`).
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import logging
import threading
import time
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.clock import Clock
from gpuwatch.sim import cdefs as c
from gpuwatch.sim.driver import ECC_EVENTS
from gpuwatch.sim.node import RESERVED_FRACTION, SimEvent, SimGpu, SimInstance, SimNode, hash01
from gpuwatch.sim.scenario import Scenario

log = logging.getLogger(__name__)

RETIRED_DBE_PAGES = 3  # of a retired_pages fault's pages, retired for double-bit errors
VIRTUALIZATION_VGPU = 2  # nvmlGpuVirtualizationMode_t: a guest with a vGPU
SUPPORTED_REASONS = 0xFF  # idle, app clocks, sw power cap, hw slowdown, sync boost, thermal, brake

# nvml.h field ids.
FI_ECC_SBE_VOL, FI_ECC_DBE_VOL, FI_ECC_SBE_AGG, FI_ECC_DBE_AGG = 3, 4, 5, 6
FI_RETIRED_SBE, FI_RETIRED_DBE, FI_RETIRED_PENDING = 29, 30, 31
FI_NVLINK_CRC_DATA_L0_5 = range(39, 45)
FI_NVLINK_CRC_DATA_L6_11 = range(102, 108)
FI_MEMORY_TEMP = 82
FI_NVLINK_LINK_COUNT = 91
FI_PCIE_REPLAY = 94
FI_NVLINK_TX, FI_NVLINK_RX = 138, 139
FI_REMAPPED_COR, FI_REMAPPED_UNC, FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE = 142, 143, 144, 145
FI_NVLINK_DL_REPLAY, FI_NVLINK_DL_RECOVERY, FI_NVLINK_DL_CRC = 161, 162, 163
FI_NVLINK_STATE = 165
FI_ENERGY = 191
FI_NVLINK5_RECOVERY_FAILED, FI_NVLINK5_RECOVERY = 214, 215
FI_NVLINK5_EFFECTIVE_ERRORS, FI_NVLINK5_SYMBOL_ERRORS = 219, 221
FI_RECOVERY_ACTION = 230
_ECC = (FI_ECC_SBE_VOL, FI_ECC_DBE_VOL, FI_ECC_SBE_AGG, FI_ECC_DBE_AGG)
_REMAP = (FI_REMAPPED_COR, FI_REMAPPED_UNC, FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE)
_RETIRED = (FI_RETIRED_SBE, FI_RETIRED_DBE, FI_RETIRED_PENDING)
_NVLINK5 = (
    FI_NVLINK5_RECOVERY_FAILED,
    FI_NVLINK5_RECOVERY,
    FI_NVLINK5_EFFECTIVE_ERRORS,
    FI_NVLINK5_SYMBOL_ERRORS,
)
_PER_LINK = (
    FI_NVLINK_TX,
    FI_NVLINK_RX,
    FI_NVLINK_STATE,
    FI_NVLINK_DL_REPLAY,
    FI_NVLINK_DL_RECOVERY,
    FI_NVLINK_DL_CRC,
    *_NVLINK5,
)
# nvmlDeviceGetNvLinkErrorCounter's counters (nvmlNvLinkErrorCounter_t) -> their field id.
_LINK_COUNTERS = {0: FI_NVLINK_DL_REPLAY, 1: FI_NVLINK_DL_RECOVERY, 2: FI_NVLINK_DL_CRC}
_LINK_COUNTER_CRC_DATA = 3
_MEMORY_TYPE_CORRECTED = 0
_VOLATILE_ECC = 0
_RETIREMENT_CAUSE_SBE = 0
_TEMPERATURE_GPU = 0
_CLOCK_SM, _CLOCK_MEM = 1, 2
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


class _Answer(Exception):  # noqa: N818 - not an error: the return code to hand back
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def node_salt(node: str) -> int:
    """A number from a node's name that makes its simulated identities its own: two simulated
    nodes with the same scenario must not share GPU UUIDs (one Prometheus scrapes both).
    0 for no name, which keeps the identities a scenario has always had."""
    if not node:
        return 0
    return int.from_bytes(hashlib.blake2b(node.encode(), digest_size=8).digest(), "big")


def uuid_of(seed: int, index: int, prefix: str = "GPU", salt: int = 0) -> str:
    parts = (seed, index) if not salt else (seed, salt, index)
    digits = "".join(f"{int(hash01(*parts, k) * 2**32):08x}" for k in range(4))
    return f"{prefix}-{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:32]}"


def bus_id(index: int) -> str:
    bus = _HGX_BUSES[index] if index < len(_HGX_BUSES) else 0x100 + index
    return f"00000000:{bus:02X}:00.0"


@dataclass(eq=False)
class _Device:
    """What a handle points at: a GPU, or one of its MIG instances."""

    gpu: SimGpu
    instance: SimInstance | None = None
    # The handle is the address of this buffer: unique while the library lives.
    memory: ctypes.Array[ctypes.c_char] = field(
        default_factory=lambda: ctypes.create_string_buffer(8)
    )

    @property
    def address(self) -> int:
        return ctypes.addressof(self.memory)


@dataclass(eq=False)
class _EventSet:
    masks: dict[int, int] = field(default_factory=dict)  # GPU index -> registered types
    delivered: int = 0  # how many of the node's events this set has gone past
    memory: ctypes.Array[ctypes.c_char] = field(
        default_factory=lambda: ctypes.create_string_buffer(8)
    )


def _put(ctype: Any, address: int | None, value: Any) -> None:
    if not address:
        raise _Answer(c.ERROR_INVALID_ARGUMENT)
    ctype.from_address(address).value = value


def _put_text(address: int | None, length: int, text: str) -> None:
    data = text.encode() + b"\0"
    if not address:
        raise _Answer(c.ERROR_INVALID_ARGUMENT)
    if len(data) > length:
        raise _Answer(c.ERROR_INSUFFICIENT_SIZE)
    ctypes.memmove(address, data, len(data))


class SimulatedNvml:
    """libnvidia-ml.so.1 over one simulated node. `install()` puts it under pynvml."""

    def __init__(
        self, scenario: Scenario, clock: Clock, *, account_cpu: bool = False, node: str = ""
    ) -> None:
        self.node = SimNode(scenario, clock)
        self._salt = node_salt(node)
        # The CPU time spent inside this library's entry points (benches: what a real
        # driver's C code would cost instead), when asked for.
        self.account_cpu = account_cpu
        self.cpu_seconds = 0.0
        self.scenario = scenario
        self.profile = scenario.driver
        self.clock = clock
        self.calls = itertools.count()  # entry-point calls made (tests and benches read it)
        self.called: Counter[str] = Counter()  # the same, by entry point (approximate)
        self._lock = threading.Lock()
        self._initialized = 0
        self._gpus = [_Device(gpu) for gpu in self.node.gpus]
        self._instances = {
            (gpu.index, inst.index): _Device(gpu, inst)
            for gpu in self.node.gpus
            for inst in gpu.instances
        }
        self._devices = {dev.address: dev for dev in (*self._gpus, *self._instances.values())}
        self._event_sets: dict[int, _EventSet] = {}
        self._error_texts: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self.library = types.SimpleNamespace(
            **{name: self._entry_point(name) for name in sorted(self.profile.entry_points)}
        )

    def install(self) -> Any:
        """Make the real pynvml call into this library; returns the pynvml module."""
        import pynvml

        with pynvml.libLoadLock:
            pynvml.nvmlLib = self.library
            pynvml._nvmlGetFunctionPointer_cache.clear()  # pointers into an earlier library
        return pynvml

    @staticmethod
    def uninstall() -> None:
        """Leave pynvml as it was before any install: it will look for the real library."""
        import pynvml

        with pynvml.libLoadLock:
            pynvml.nvmlLib = None
            pynvml._nvmlGetFunctionPointer_cache.clear()

    # -- plumbing --------------------------------------------------------------------------
    def _entry_point(self, name: str) -> Any:
        impl: Callable[..., int | None] = getattr(self, name)
        restype = ctypes.c_void_p if name == "nvmlErrorString" else ctypes.c_int
        prototype = ctypes.CFUNCTYPE(restype, *c.SIGNATURES[name])

        called = self.called

        def call(*args: Any) -> int | None:
            next(self.calls)
            called[name] += 1
            try:
                return impl(*args)
            except _Answer as answer:
                return answer.code
            except Exception:  # a simulator bug must not look like a driver answer of 0
                log.exception("simulated %s failed", name)
                return c.ERROR_UNKNOWN

        def accounted(*args: Any) -> int | None:
            start = time.thread_time()
            try:
                return call(*args)
            finally:
                spent = time.thread_time() - start
                with self._lock:
                    self.cpu_seconds += spent

        return prototype(accounted if self.account_cpu else call)

    def _check_init(self) -> None:
        if not self._initialized:
            raise _Answer(c.ERROR_UNINITIALIZED)

    def _device(self, handle: int | None) -> _Device:
        """The device behind a handle, after playing its GPU's faults: a hang blocks, a lost
        GPU answers GPU_IS_LOST, an nvml_error fault answers its error."""
        self._check_init()
        dev = self._devices.get(handle or 0)
        if dev is None:
            raise _Answer(c.ERROR_INVALID_ARGUMENT)
        gpu = dev.gpu
        now = self.clock.now()
        until = gpu.hang_until(now)
        if until is not None:
            self.clock.block(until - now)
        if gpu.lost(self.clock.now()):
            raise _Answer(c.ERROR_GPU_IS_LOST)
        error = gpu.error_now()
        if error is not None:
            raise _Answer(error)
        return dev

    def _whole_gpu(self, handle: int | None) -> SimGpu:
        """A GPU handle for a call MIG instances do not answer."""
        dev = self._device(handle)
        if dev.instance is not None:
            raise _Answer(c.ERROR_NOT_SUPPORTED)
        return dev.gpu

    @property
    def _vgpu(self) -> bool:
        return self.scenario.virtualization == "vgpu_guest"

    def _not_in_vgpu_guest(self) -> None:
        if self._vgpu:
            raise _Answer(c.ERROR_NOT_SUPPORTED)

    # -- library ---------------------------------------------------------------------------
    def nvmlInit_v2(self) -> int:
        with self._lock:
            self._initialized += 1
        return c.SUCCESS

    def nvmlInitWithFlags(self, _flags: int) -> int:
        return self.nvmlInit_v2()

    def nvmlShutdown(self) -> int:
        with self._lock:
            if not self._initialized:
                return c.ERROR_UNINITIALIZED
            self._initialized -= 1
        return c.SUCCESS

    def nvmlErrorString(self, code: int) -> int:
        text = self._error_texts.get(code)
        if text is None:
            name = next((k for k, v in c.ERRORS.items() if v == code), f"error {code}")
            text = self._error_texts[code] = ctypes.create_string_buffer(
                name.replace("_", " ").capitalize().encode()
            )
        return ctypes.addressof(text)

    def nvmlSystemGetDriverVersion(self, out: int, length: int) -> int:
        self._check_init()
        _put_text(out, length, self.profile.driver_version)
        return c.SUCCESS

    def nvmlSystemGetNVMLVersion(self, out: int, length: int) -> int:
        self._check_init()
        _put_text(out, length, self.profile.nvml_version)
        return c.SUCCESS

    def _listed(self) -> list[_Device]:
        """The GPUs the driver enumerates now, in bus order: a missing one leaves a gap that
        the later ones close, as after a reboot (indices shift; UUIDs do not)."""
        now = self.clock.now()
        return [dev for dev in self._gpus if not dev.gpu.missing(now)]

    def nvmlDeviceGetCount_v2(self, out: int) -> int:
        self._check_init()
        _put(ctypes.c_uint, out, len(self._listed()))
        return c.SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: int, out: int) -> int:
        self._check_init()
        listed = self._listed()
        if not 0 <= index < len(listed):
            return c.ERROR_INVALID_ARGUMENT
        _put(ctypes.c_void_p, out, listed[index].address)
        return c.SUCCESS

    # -- identity --------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: int, out: int, length: int) -> int:
        dev = self._device(handle)
        seed, salt = self.scenario.seed, self._salt
        if dev.instance is None:
            text = uuid_of(seed, dev.gpu.index, salt=salt)
        else:
            text = uuid_of(seed, 1000 + dev.gpu.index * 16 + dev.instance.index, "MIG", salt)
        _put_text(out, length, text)
        return c.SUCCESS

    def nvmlDeviceGetName(self, handle: int, out: int, length: int) -> int:
        dev = self._device(handle)
        name = dev.gpu.model.name
        if dev.instance is not None:  # as the driver names a MIG device
            name = f"{name} MIG {dev.instance.profile}"
        _put_text(out, length, name)
        return c.SUCCESS

    def nvmlDeviceGetSerial(self, handle: int, out: int, length: int) -> int:
        gpu = self._whole_gpu(handle)
        board = (self._salt % 10**9 or self.scenario.seed) * 1000 + gpu.index
        _put_text(out, length, f"{1650000000000 + board}")
        return c.SUCCESS

    def nvmlDeviceGetVbiosVersion(self, handle: int, out: int, length: int) -> int:
        _put_text(out, length, self._whole_gpu(handle).model.vbios)
        return c.SUCCESS

    def nvmlDeviceGetPciInfo_v3(self, handle: int, out: int) -> int:
        gpu = self._device(handle).gpu
        if not out:
            return c.ERROR_INVALID_ARGUMENT
        info = c.PciInfo.from_address(out)
        text = bus_id(gpu.index)
        info.busId = text.encode()
        info.busIdLegacy = text[4:].encode()
        info.bus = int(text.split(":")[1], 16)
        info.pciDeviceId = 0x233010DE
        return c.SUCCESS

    def nvmlDeviceGetVirtualizationMode(self, handle: int, out: int) -> int:
        self._device(handle)
        _put(ctypes.c_uint, out, VIRTUALIZATION_VGPU if self._vgpu else 0)
        return c.SUCCESS

    # -- sampling --------------------------------------------------------------------------
    def nvmlDeviceGetTemperature(self, handle: int, sensor: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        if sensor != _TEMPERATURE_GPU:
            return c.ERROR_NOT_SUPPORTED
        _put(ctypes.c_uint, out, gpu.reading().temperature_c)
        return c.SUCCESS

    def nvmlDeviceGetTemperatureV(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        if not out:
            return c.ERROR_INVALID_ARGUMENT
        temp = c.TemperatureV1.from_address(out)
        if temp.version != c.TEMPERATURE_V1_VERSION:
            return 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        if temp.sensorType != _TEMPERATURE_GPU:
            return c.ERROR_NOT_SUPPORTED
        temp.temperature = gpu.reading().temperature_c
        return c.SUCCESS

    def nvmlDeviceGetPowerUsage(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        _put(ctypes.c_uint, out, gpu.reading().power_mw)
        return c.SUCCESS

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        _put(ctypes.c_uint, out, gpu.reading().power_limit_mw)
        return c.SUCCESS

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        _put(ctypes.c_ulonglong, out, gpu.reading().energy_mj)
        return c.SUCCESS

    def nvmlDeviceGetUtilizationRates(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        if gpu.instances:  # a GPU in MIG mode has no utilization of its own
            return c.ERROR_NOT_SUPPORTED
        if not out:
            return c.ERROR_INVALID_ARGUMENT
        r = gpu.reading()
        util = c.Utilization.from_address(out)
        util.gpu, util.memory = r.utilization_pct, r.memory_utilization_pct
        return c.SUCCESS

    def _memory(self, dev: _Device) -> tuple[int, int, int]:
        """(total, reserved, allocated) in bytes."""
        gpu = dev.gpu
        r = gpu.reading()
        share = r.memory_used / r.memory_total
        if dev.instance is not None:
            total = dev.instance.memory_total
            return total, 0, int(total * share) if dev.instance.index == 0 else 0
        reserved = int(r.memory_total * RESERVED_FRACTION)
        if gpu.instances:  # the parent of MIG instances: what they hold together
            first = gpu.instances[0]
            return r.memory_total, reserved, int(first.memory_total * share)
        return r.memory_total, reserved, r.memory_used

    def nvmlDeviceGetMemoryInfo(self, handle: int, out: int) -> int:
        total, reserved, allocated = self._memory(self._device(handle))
        if not out:
            return c.ERROR_INVALID_ARGUMENT
        mem = c.Memory.from_address(out)
        mem.total, mem.used = total, allocated + reserved
        mem.free = total - mem.used
        return c.SUCCESS

    def nvmlDeviceGetMemoryInfo_v2(self, handle: int, out: int) -> int:
        total, reserved, allocated = self._memory(self._device(handle))
        if not out:
            return c.ERROR_INVALID_ARGUMENT
        mem = c.MemoryV2.from_address(out)
        if mem.version != c.MEMORY_V2_VERSION:
            return 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        mem.total, mem.reserved, mem.used = total, reserved, allocated
        mem.free = total - reserved - allocated
        return c.SUCCESS

    def nvmlDeviceGetClockInfo(self, handle: int, clock_type: int, out: int) -> int:
        r = self._whole_gpu(handle).reading()
        if clock_type == _CLOCK_SM:
            _put(ctypes.c_uint, out, r.sm_clock_mhz)
        elif clock_type == _CLOCK_MEM:
            _put(ctypes.c_uint, out, r.memory_clock_mhz)
        else:
            return c.ERROR_NOT_SUPPORTED
        return c.SUCCESS

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: int, out: int) -> int:
        self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        _put(ctypes.c_ulonglong, out, SUPPORTED_REASONS)
        return c.SUCCESS

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        _put(ctypes.c_ulonglong, out, gpu.reading().clock_reasons)
        return c.SUCCESS

    # The same calls under their names before R535.
    nvmlDeviceGetSupportedClocksThrottleReasons = nvmlDeviceGetSupportedClocksEventReasons
    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        _put(ctypes.c_uint, out, gpu.model.pcie_generation)
        return c.SUCCESS

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        _put(ctypes.c_uint, out, gpu.model.pcie_width)
        return c.SUCCESS

    # -- field values ------------------------------------------------------------------------
    def nvmlDeviceGetFieldValues(self, handle: int, count: int, values: int) -> int:
        dev = self._device(handle)
        if count < 0 or not values:
            return c.ERROR_INVALID_ARGUMENT
        timestamp = int(self.clock.now() * 1e6)
        for slot in (c.FieldValue * count).from_address(values):
            slot.timestamp = timestamp
            try:
                value = self._field(dev, slot.fieldId, slot.scopeId)
            except _Answer as answer:
                slot.nvmlReturn = answer.code
                continue
            slot.nvmlReturn = c.SUCCESS
            slot.valueType = c.VALUE_TYPE_UNSIGNED_LONG_LONG
            slot.value.ullVal = value
        return c.SUCCESS

    def _field(self, dev: _Device, field_id: int, scope: int, by_id: bool = True) -> int:
        """One field's value, or _Answer with the code its slot gets. `by_id`: asked for by
        field id (which the driver may not have), not through a per-purpose call."""
        if by_id and field_id >= self.profile.field_id_max:
            raise _Answer(c.ERROR_INVALID_ARGUMENT)  # this driver has no such field id
        if dev.instance is not None:
            raise _Answer(c.ERROR_NOT_SUPPORTED)  # MIG devices answer fields on the parent
        gpu, m = dev.gpu, dev.gpu.model
        if field_id in _ECC:
            if not self.scenario.ecc or self._vgpu:
                raise _Answer(c.ERROR_NOT_SUPPORTED)
            volatile = field_id in (FI_ECC_SBE_VOL, FI_ECC_DBE_VOL)
            kind = "ecc_sbe" if field_id in (FI_ECC_SBE_VOL, FI_ECC_SBE_AGG) else "ecc_dbe"
            return gpu.fault_count(kind, volatile=volatile)
        if field_id in _REMAP:
            if not m.has_row_remapping or self._vgpu:
                raise _Answer(c.ERROR_NOT_SUPPORTED)
            return self._remap(gpu, field_id)
        if field_id in _RETIRED:
            if m.has_row_remapping or self._vgpu:
                raise _Answer(c.ERROR_NOT_SUPPORTED)
            return self._retired(gpu, field_id)
        if field_id == FI_MEMORY_TEMP:
            # A vGPU guest answers 0 (seen on GRID A100 guests through dcgm-exporter).
            return 0 if self._vgpu else gpu.reading().memory_temperature_c
        if field_id == FI_ENERGY:
            self._not_in_vgpu_guest()
            return gpu.reading().energy_mj
        if field_id == FI_PCIE_REPLAY:
            self._not_in_vgpu_guest()
            return gpu.fault_count("pcie_replay_storm")
        if field_id == FI_RECOVERY_ACTION:
            return gpu.recovery_action()
        if field_id == FI_NVLINK_LINK_COUNT:
            if not m.nvlinks or self._vgpu:
                raise _Answer(c.ERROR_NOT_SUPPORTED)
            return m.nvlinks
        if field_id in _PER_LINK:
            return self._link_field(gpu, field_id, scope)
        if field_id in FI_NVLINK_CRC_DATA_L0_5 or field_id in FI_NVLINK_CRC_DATA_L6_11:
            if not m.has_nvlink_crc_data:
                raise _Answer(c.ERROR_NOT_SUPPORTED)
            return 0
        raise _Answer(c.ERROR_NOT_SUPPORTED)

    def _link_field(self, gpu: SimGpu, field_id: int, link: int) -> int:
        m = gpu.model
        if self._vgpu or not 0 <= link < m.nvlinks:
            raise _Answer(c.ERROR_NOT_SUPPORTED)
        blackwell = m.nvlink_generation >= 5
        if field_id in _NVLINK5 and not blackwell:
            raise _Answer(c.ERROR_NOT_SUPPORTED)
        if blackwell and field_id in (FI_NVLINK_DL_REPLAY, FI_NVLINK_DL_RECOVERY, FI_NVLINK_DL_CRC):
            raise _Answer(c.ERROR_NOT_SUPPORTED)  # nvml.h: unsupported for Blackwell and later
        r = gpu.reading()
        if field_id == FI_NVLINK_TX:
            return r.nvlink_tx_kib[link]
        if field_id == FI_NVLINK_RX:
            return r.nvlink_rx_kib[link]
        if field_id == FI_NVLINK_STATE:
            return 0 if gpu.fault_now("nvlink_down", link) else 1
        if field_id in (FI_NVLINK_DL_CRC, FI_NVLINK5_EFFECTIVE_ERRORS):
            return gpu.fault_count("nvlink_crc_storm", link=link)
        if field_id == FI_NVLINK5_SYMBOL_ERRORS:
            return 4 * gpu.fault_count("nvlink_crc_storm", link=link)
        if field_id == FI_NVLINK_DL_REPLAY:
            return gpu.fault_count("nvlink_replay", link=link)
        if field_id == FI_NVLINK_DL_RECOVERY:
            return gpu.fault_count("nvlink_recovery", link=link)
        if field_id == FI_NVLINK5_RECOVERY:
            # NVLink5 counts every recovery, the failed ones (a link that went down) too.
            recovered = gpu.fault_count("nvlink_recovery", link=link)
            return recovered + gpu.fault_count("nvlink_down", link=link)
        if field_id == FI_NVLINK5_RECOVERY_FAILED:
            return gpu.fault_count("nvlink_down", link=link)
        return 0

    @staticmethod
    def _remap(gpu: SimGpu, field_id: int) -> int:
        """Rows remapped for uncorrectable errors: a pending remap's rows and a failed one's
        (it used the spare rows up); a reset applies the pending remap, the rows stay."""
        if field_id == FI_REMAPPED_UNC:
            pending = gpu.fault_count("row_remap_pending")
            return pending + gpu.fault_count("row_remap_failure")
        if field_id == FI_REMAPPED_PENDING:
            return int(gpu.fault_now("row_remap_pending"))
        if field_id == FI_REMAPPED_FAILURE:
            return int(gpu.fault_now("row_remap_failure"))
        return 0

    @staticmethod
    def _retired(gpu: SimGpu, field_id: int) -> int:
        """retired_pages: `count` pages retired (by default DCGM's limit of 63), a few of them
        for double-bit errors, and one pending until a reset."""
        pages = gpu.fault_count("retired_pages")
        dbe = min(RETIRED_DBE_PAGES, pages)
        if field_id == FI_RETIRED_SBE:
            return pages - dbe
        if field_id == FI_RETIRED_DBE:
            return dbe
        return int(gpu.fault_now("retired_pages"))

    # -- the per-purpose calls older drivers offer where they lack a field id ----------------
    def _by_field(self, handle: int, field_id: int, scope: int = 0) -> int:
        return self._field(self._device(handle), field_id, scope, by_id=False)

    def nvmlDeviceGetTotalEccErrors(
        self, handle: int, error_type: int, counter_type: int, out: int
    ) -> int:
        corrected = error_type == _MEMORY_TYPE_CORRECTED
        volatile = counter_type == _VOLATILE_ECC
        field_id = {
            (True, True): FI_ECC_SBE_VOL,
            (False, True): FI_ECC_DBE_VOL,
            (True, False): FI_ECC_SBE_AGG,
            (False, False): FI_ECC_DBE_AGG,
        }[(corrected, volatile)]
        _put(ctypes.c_ulonglong, out, self._by_field(handle, field_id))
        return c.SUCCESS

    def nvmlDeviceGetRemappedRows(self, handle: int, cor: int, unc: int, pending: int,
                                  failure: int) -> int:  # fmt: skip
        values = [self._by_field(handle, f) for f in _REMAP]
        for address, value in zip((cor, unc, pending, failure), values, strict=True):
            _put(ctypes.c_uint, address, value)
        return c.SUCCESS

    def nvmlDeviceGetRetiredPages(self, handle: int, cause: int, count: int, pages: int) -> int:
        field_id = FI_RETIRED_SBE if cause == _RETIREMENT_CAUSE_SBE else FI_RETIRED_DBE
        n = self._by_field(handle, field_id)
        if not count:
            return c.ERROR_INVALID_ARGUMENT
        room = ctypes.c_uint.from_address(count)
        if room.value < n or (n and not pages):
            room.value = n
            return c.ERROR_INSUFFICIENT_SIZE
        for i in range(n):
            ctypes.c_ulonglong.from_address(pages + 8 * i).value = 0x1000 * (i + 1)
        room.value = n
        return c.SUCCESS

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int, out: int) -> int:
        _put(ctypes.c_int, out, self._by_field(handle, FI_RETIRED_PENDING))
        return c.SUCCESS

    def nvmlDeviceGetPcieReplayCounter(self, handle: int, out: int) -> int:
        _put(ctypes.c_uint, out, self._by_field(handle, FI_PCIE_REPLAY))
        return c.SUCCESS

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int, out: int) -> int:
        _put(ctypes.c_int, out, self._by_field(handle, FI_NVLINK_STATE, link))
        return c.SUCCESS

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int,
                                        out: int) -> int:  # fmt: skip
        if counter == _LINK_COUNTER_CRC_DATA and link < 12:
            first = FI_NVLINK_CRC_DATA_L0_5 if link < 6 else FI_NVLINK_CRC_DATA_L6_11
            value = self._by_field(handle, first[link % 6])
        elif counter in _LINK_COUNTERS:
            value = self._by_field(handle, _LINK_COUNTERS[counter], link)
        else:
            return c.ERROR_NOT_SUPPORTED
        _put(ctypes.c_ulonglong, out, value)
        return c.SUCCESS

    # -- processes -------------------------------------------------------------------------
    def _processes(self, dev: _Device) -> list[tuple[int, int, int, int]]:
        """(pid, used memory, GPU instance id, compute instance id) of each process."""
        pids = list(self.node.pids)
        if not pids:
            return []
        gpu = dev.gpu
        instance = dev.instance
        if gpu.instances and instance is None:
            instance = gpu.instances[0]  # the parent lists its instances' processes
        elif instance is not None and instance.index != 0:
            return []
        _, _, allocated = self._memory(dev if dev.instance else _Device(gpu, instance))
        shares = [0.9] + [0.1 / (len(pids) - 1)] * (len(pids) - 1) if len(pids) > 1 else [1.0]
        gi, ci = (instance.gpu_instance_id, 0) if instance else (c.NO_INSTANCE, c.NO_INSTANCE)
        return [(pid, int(allocated * s), gi, ci) for pid, s in zip(pids, shares, strict=True)]

    def _write_processes(self, handle: int, count: int, infos: int, struct: Any) -> int:
        found = self._processes(self._device(handle))
        if not count:
            return c.ERROR_INVALID_ARGUMENT
        room = ctypes.c_uint.from_address(count)
        if room.value < len(found) or (found and not infos):
            room.value = len(found)
            return c.ERROR_INSUFFICIENT_SIZE
        size = ctypes.sizeof(struct)
        for i, (pid, used, gi, ci) in enumerate(found):
            info = struct.from_address(infos + i * size)
            info.pid, info.usedGpuMemory = pid, used
            if hasattr(info, "gpuInstanceId"):
                info.gpuInstanceId, info.computeInstanceId = gi, ci
        room.value = len(found)
        return c.SUCCESS

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int, count: int, infos: int) -> int:
        return self._write_processes(handle, count, infos, c.ProcessInfoV1)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: int, count: int, infos: int) -> int:
        return self._write_processes(handle, count, infos, c.ProcessInfoV2)

    # R510 and later: the same 24-byte struct as _v2 (nvmlProcessInfo_t).
    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses_v2

    # -- MIG -------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: int, current: int, pending: int) -> int:
        gpu = self._whole_gpu(handle)
        if not gpu.model.mig_capable:
            return c.ERROR_NOT_SUPPORTED
        mode = 1 if gpu.instances else 0
        _put(ctypes.c_uint, current, mode)
        _put(ctypes.c_uint, pending, mode)
        return c.SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        if not gpu.model.mig_capable:
            return c.ERROR_NOT_SUPPORTED
        _put(ctypes.c_uint, out, 7)
        return c.SUCCESS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, index: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        if not gpu.instances:
            return c.ERROR_NOT_SUPPORTED if not gpu.model.mig_capable else c.ERROR_INVALID_ARGUMENT
        dev = self._instances.get((gpu.index, index))
        if dev is None:
            return c.ERROR_NOT_FOUND
        _put(ctypes.c_void_p, out, dev.address)
        return c.SUCCESS

    def nvmlDeviceIsMigDeviceHandle(self, handle: int, out: int) -> int:
        _put(ctypes.c_uint, out, int(self._device(handle).instance is not None))
        return c.SUCCESS

    def nvmlDeviceGetGpuInstanceId(self, handle: int, out: int) -> int:
        dev = self._device(handle)
        if dev.instance is None:
            return c.ERROR_NOT_SUPPORTED
        _put(ctypes.c_uint, out, dev.instance.gpu_instance_id)
        return c.SUCCESS

    def nvmlDeviceGetComputeInstanceId(self, handle: int, out: int) -> int:
        if self._device(handle).instance is None:
            return c.ERROR_NOT_SUPPORTED
        _put(ctypes.c_uint, out, 0)
        return c.SUCCESS

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: int, out: int) -> int:
        dev = self._device(handle)
        if dev.instance is None:
            return c.ERROR_NOT_SUPPORTED
        _put(ctypes.c_void_p, out, self._gpus[dev.gpu.index].address)
        return c.SUCCESS

    # -- events ----------------------------------------------------------------------------
    def nvmlEventSetCreate(self, out: int) -> int:
        self._check_init()
        now = self.clock.now()  # a new set gets the events from now on
        event_set = _EventSet(delivered=sum(1 for e in self.node.events if e.time <= now))
        with self._lock:
            self._event_sets[ctypes.addressof(event_set.memory)] = event_set
        _put(ctypes.c_void_p, out, ctypes.addressof(event_set.memory))
        return c.SUCCESS

    def _event_set(self, address: int | None) -> _EventSet:
        self._check_init()
        event_set = self._event_sets.get(address or 0)
        if event_set is None:
            raise _Answer(c.ERROR_INVALID_ARGUMENT)
        return event_set

    def _event_types(self) -> int:
        types = self.profile.event_types
        return types if self.scenario.ecc else types & ~ECC_EVENTS

    def nvmlDeviceGetSupportedEventTypes(self, handle: int, out: int) -> int:
        self._whole_gpu(handle)
        _put(ctypes.c_ulonglong, out, self._event_types())
        return c.SUCCESS

    def nvmlDeviceRegisterEvents(self, handle: int, event_types: int, address: int) -> int:
        gpu = self._whole_gpu(handle)
        event_set = self._event_set(address)
        if event_types & ~self._event_types():
            # nvml.h: NOT_SUPPORTED if some requested type is not; none of them is registered.
            return c.ERROR_NOT_SUPPORTED
        with self._lock:
            event_set.masks[gpu.index] = event_set.masks.get(gpu.index, 0) | event_types
        return c.SUCCESS

    def nvmlEventSetWait_v2(self, address: int, out: int, timeout_ms: int) -> int:
        event_set = self._event_set(address)
        if not out:
            return c.ERROR_INVALID_ARGUMENT
        deadline = self.clock.now() + timeout_ms / 1000.0
        while True:
            # As a driver does (and NVIDIA's own mock NVML models): events up to a GPU's loss
            # are delivered, its XID 79 among them; from then on the wait answers
            # GPU_IS_LOST at once, for every GPU of the set, while the lost one is in it.
            error, since = self._wait_error(event_set)
            event = self._next_event(event_set, until=since)
            if event is not None:
                data = c.EventData.from_address(out)
                data.device = self._gpus[event.gpu].address
                data.eventType, data.eventData = event.event_type, event.data
                data.gpuInstanceId = data.computeInstanceId = c.NO_INSTANCE
                return c.SUCCESS
            if error is not None:
                return error
            now = self.clock.now()
            if now >= deadline:
                return c.ERROR_TIMEOUT
            # Sleep until the next scheduled event or the timeout, like a blocking wait.
            self.clock.block(min(deadline, self._next_event_time(event_set)) - now)

    def _wait_error(self, event_set: _EventSet) -> tuple[int | None, float]:
        """The error the wait answers (GPU_IS_LOST while a GPU of the set is lost; an
        event_wait_error fault's error), and since when: (None, inf) when none."""
        now = self.clock.now()
        found: tuple[int | None, float] = (None, float("inf"))
        for index in list(event_set.masks):
            gpu = self.node.gpus[index]
            lost = gpu.lost_since(now)
            fault = gpu.active("event_wait_error", now)
            if lost is not None:
                candidate = (c.ERROR_GPU_IS_LOST, lost)
            elif fault is not None and fault.error:
                candidate = (c.ERRORS[fault.error], self.node.start + fault.at)
            else:
                continue
            if candidate[1] < found[1]:
                found = candidate
        return found

    def _next_event(self, event_set: _EventSet, until: float) -> SimEvent | None:
        """The set's next event due by now and no later than `until`, consumed."""
        limit = min(self.clock.now(), until)
        with self._lock:
            while event_set.delivered < len(self.node.events):
                event = self.node.events[event_set.delivered]
                if event.time > limit:
                    return None
                event_set.delivered += 1
                if event_set.masks.get(event.gpu, 0) & event.event_type:
                    return event
        return None

    def _next_event_time(self, event_set: _EventSet) -> float:
        with self._lock:
            pending = self.node.events[event_set.delivered :]
        return pending[0].time if pending else float("inf")

    def nvmlEventSetFree(self, address: int) -> int:
        event_set = self._event_set(address)
        with self._lock:
            event_set.masks.clear()
            self._event_sets.pop(address, None)
        return c.SUCCESS
