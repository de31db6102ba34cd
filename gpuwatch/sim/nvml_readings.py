"""The simulated NVML library's calls that read a GPU: sensors, clocks, field values, and the
per-purpose calls older drivers offer where they lack a field id (PCIe's: sim/nvml_pcie.py)."""

from __future__ import annotations

import ctypes

from gpuwatch.sim import cdefs as c
from gpuwatch.sim.node import SimGpu
from gpuwatch.sim.nvml_core import (
    _CLOCK_MEM,
    _CLOCK_SM,
    _ECC,
    _LINK_COUNTER_CRC_DATA,
    _LINK_COUNTERS,
    _MEMORY_TYPE_CORRECTED,
    _NVLINK5,
    _PER_LINK,
    _REMAP,
    _RETIRED,
    _RETIREMENT_CAUSE_SBE,
    _TEMPERATURE_GPU,
    _VOLATILE_ECC,
    FI_ECC_DBE_AGG,
    FI_ECC_DBE_VOL,
    FI_ECC_SBE_AGG,
    FI_ECC_SBE_VOL,
    FI_ENERGY,
    FI_MEMORY_TEMP,
    FI_NVLINK5_EFFECTIVE_ERRORS,
    FI_NVLINK5_RECOVERY,
    FI_NVLINK5_RECOVERY_FAILED,
    FI_NVLINK5_SYMBOL_ERRORS,
    FI_NVLINK_CRC_DATA_L0_5,
    FI_NVLINK_CRC_DATA_L6_11,
    FI_NVLINK_DL_CRC,
    FI_NVLINK_DL_RECOVERY,
    FI_NVLINK_DL_REPLAY,
    FI_NVLINK_LINK_COUNT,
    FI_NVLINK_RX,
    FI_NVLINK_SPEED_COMMON,
    FI_NVLINK_STATE,
    FI_NVLINK_TX,
    FI_PCIE_REPLAY,
    FI_PCIE_RX_BYTES,
    FI_PCIE_TX_BYTES,
    FI_RECOVERY_ACTION,
    FI_REMAPPED_FAILURE,
    FI_REMAPPED_PENDING,
    FI_REMAPPED_UNC,
    FI_RETIRED_DBE,
    FI_RETIRED_PENDING,
    FI_RETIRED_SBE,
    RETIRED_DBE_PAGES,
    SUPPORTED_REASONS,
    Answer,
    Device,
    LibraryCore,
    put,
)

# Field ids a real driver answers as an unsigned int (nvmlValueType_t 1), not a 64-bit count:
# memory temperature, PCIe replays, the PCIe byte counters and the recovery action, as an H200
# on R580 answered them (tests/fixtures/nvml/h200-r580.159.04.json). The rest answer 64 bits.
UINT_FIELDS = frozenset({FI_MEMORY_TEMP, FI_PCIE_REPLAY, FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES,
                         FI_RECOVERY_ACTION})  # fmt: skip


class ReadingCalls(LibraryCore):
    """Entry points that read a GPU's state and counters."""

    # -- sampling --------------------------------------------------------------------------
    def nvmlDeviceGetTemperature(self, handle: int, sensor: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        if sensor != _TEMPERATURE_GPU:
            return c.ERROR_NOT_SUPPORTED
        put(ctypes.c_uint, out, gpu.reading().temperature_c)
        return c.SUCCESS

    def nvmlDeviceGetTemperatureV(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        if not out:
            return c.ERROR_INVALID_ARGUMENT
        temp = c.TemperatureV1.from_address(out)
        if temp.version != c.TEMPERATURE_V1_VERSION:
            return c.ERROR_ARGUMENT_VERSION_MISMATCH
        if temp.sensorType != _TEMPERATURE_GPU:
            return c.ERROR_NOT_SUPPORTED
        temp.temperature = gpu.reading().temperature_c
        return c.SUCCESS

    def nvmlDeviceGetTemperatureThreshold(self, handle: int, kind: int, out: int) -> int:
        """nvml.h's thresholds 0-3: shutdown, slowdown, memory maximum, GPU maximum."""
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        m = gpu.model
        limits = (m.shutdown_temp_c, m.slowdown_temp_c, m.memory_max_temp_c,
                  m.max_operating_temp_c)  # fmt: skip
        if not 0 <= kind < len(limits) or not limits[kind]:
            return c.ERROR_NOT_SUPPORTED
        put(ctypes.c_uint, out, int(limits[kind]))
        return c.SUCCESS

    def nvmlDeviceGetPowerUsage(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        put(ctypes.c_uint, out, gpu.reading().power_mw)
        return c.SUCCESS

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        put(ctypes.c_uint, out, gpu.reading().power_limit_mw)
        return c.SUCCESS

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        put(ctypes.c_ulonglong, out, gpu.reading().energy_mj)
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
            return c.ERROR_ARGUMENT_VERSION_MISMATCH
        mem.total, mem.reserved, mem.used = total, reserved, allocated
        mem.free = total - reserved - allocated
        return c.SUCCESS

    def nvmlDeviceGetClockInfo(self, handle: int, clock_type: int, out: int) -> int:
        r = self._whole_gpu(handle).reading()
        if clock_type == _CLOCK_SM:
            put(ctypes.c_uint, out, r.sm_clock_mhz)
        elif clock_type == _CLOCK_MEM:
            put(ctypes.c_uint, out, r.memory_clock_mhz)
        else:
            return c.ERROR_NOT_SUPPORTED
        return c.SUCCESS

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: int, out: int) -> int:
        self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        put(ctypes.c_ulonglong, out, SUPPORTED_REASONS)
        return c.SUCCESS

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        put(ctypes.c_ulonglong, out, gpu.reading().clock_reasons)
        return c.SUCCESS

    # The same calls under their names before R535.
    nvmlDeviceGetSupportedClocksThrottleReasons = nvmlDeviceGetSupportedClocksEventReasons
    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

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
            except Answer as answer:
                slot.nvmlReturn = answer.code
                continue
            slot.nvmlReturn = c.SUCCESS
            if slot.fieldId in UINT_FIELDS:  # a 32-bit count wraps, as the driver's does
                slot.valueType = c.VALUE_TYPE_UNSIGNED_INT
                slot.value.uiVal = value & 0xFFFFFFFF
            else:
                slot.valueType = c.VALUE_TYPE_UNSIGNED_LONG_LONG
                slot.value.ullVal = value
        return c.SUCCESS

    def _field(self, dev: Device, field_id: int, scope: int, by_id: bool = True) -> int:
        """One field's value, or Answer with the code its slot gets. `by_id`: asked for by
        field id (which the driver may not have), not through a per-purpose call."""
        if by_id and field_id >= self.profile.field_id_max:
            raise Answer(c.ERROR_INVALID_ARGUMENT)  # this driver has no such field id
        if dev.instance is not None:
            raise Answer(c.ERROR_NOT_SUPPORTED)  # MIG devices answer fields on the parent
        gpu, m = dev.gpu, dev.gpu.model
        if field_id in _ECC:
            if not self.scenario.ecc or self._vgpu:
                raise Answer(c.ERROR_NOT_SUPPORTED)
            volatile = field_id in (FI_ECC_SBE_VOL, FI_ECC_DBE_VOL)
            kind = "ecc_sbe" if field_id in (FI_ECC_SBE_VOL, FI_ECC_SBE_AGG) else "ecc_dbe"
            return gpu.fault_count(kind, volatile=volatile)
        if field_id in _REMAP:
            if not m.has_row_remapping or self._vgpu:
                raise Answer(c.ERROR_NOT_SUPPORTED)
            return self._remap(gpu, field_id)
        if field_id in _RETIRED:
            if m.has_row_remapping or self._vgpu:
                raise Answer(c.ERROR_NOT_SUPPORTED)
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
        if field_id in (FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES):
            self._not_in_vgpu_guest()
            reading = gpu.reading()
            return reading.pcie_tx_bytes if field_id == FI_PCIE_TX_BYTES else reading.pcie_rx_bytes
        if field_id in (FI_NVLINK_LINK_COUNT, FI_NVLINK_SPEED_COMMON):
            if not m.nvlinks or self._vgpu:
                raise Answer(c.ERROR_NOT_SUPPORTED)
            return m.nvlinks if field_id == FI_NVLINK_LINK_COUNT else m.nvlink_speed_mbps
        if field_id in _PER_LINK:
            return self._link_field(gpu, field_id, scope)
        if field_id in FI_NVLINK_CRC_DATA_L0_5 or field_id in FI_NVLINK_CRC_DATA_L6_11:
            if not m.has_nvlink_crc_data:
                raise Answer(c.ERROR_NOT_SUPPORTED)
            return 0
        raise Answer(c.ERROR_NOT_SUPPORTED)

    def _link_field(self, gpu: SimGpu, field_id: int, link: int) -> int:
        m = gpu.model
        if self._vgpu or not 0 <= link < m.nvlinks:
            raise Answer(c.ERROR_NOT_SUPPORTED)
        blackwell = m.nvlink_generation >= 5
        if field_id in _NVLINK5 and not blackwell:
            raise Answer(c.ERROR_NOT_SUPPORTED)
        if blackwell and field_id in (FI_NVLINK_DL_REPLAY, FI_NVLINK_DL_RECOVERY, FI_NVLINK_DL_CRC):
            raise Answer(c.ERROR_NOT_SUPPORTED)  # nvml.h: unsupported for Blackwell and later
        if field_id == FI_NVLINK_TX:
            return gpu.reading().nvlink_tx_kib[link]
        if field_id == FI_NVLINK_RX:
            return gpu.reading().nvlink_rx_kib[link]
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
        put(ctypes.c_ulonglong, out, self._by_field(handle, field_id))
        return c.SUCCESS

    def nvmlDeviceGetRemappedRows(
        self, handle: int, cor: int, unc: int, pending: int, failure: int
    ) -> int:
        values = [self._by_field(handle, f) for f in _REMAP]
        for address, value in zip((cor, unc, pending, failure), values, strict=True):
            put(ctypes.c_uint, address, value)
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
        put(ctypes.c_int, out, self._by_field(handle, FI_RETIRED_PENDING))
        return c.SUCCESS

    def nvmlDeviceGetPcieReplayCounter(self, handle: int, out: int) -> int:
        put(ctypes.c_uint, out, self._by_field(handle, FI_PCIE_REPLAY))
        return c.SUCCESS

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int, out: int) -> int:
        put(ctypes.c_int, out, self._by_field(handle, FI_NVLINK_STATE, link))
        return c.SUCCESS

    def nvmlDeviceGetNvLinkErrorCounter(
        self, handle: int, link: int, counter: int, out: int
    ) -> int:
        if counter == _LINK_COUNTER_CRC_DATA and link < 12:
            first = FI_NVLINK_CRC_DATA_L0_5 if link < 6 else FI_NVLINK_CRC_DATA_L6_11
            value = self._by_field(handle, first[link % 6])
        elif counter in _LINK_COUNTERS:
            value = self._by_field(handle, _LINK_COUNTERS[counter], link)
        else:
            return c.ERROR_NOT_SUPPORTED
        put(ctypes.c_ulonglong, out, value)
        return c.SUCCESS
