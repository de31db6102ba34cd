"""The calls that read what a field id reads, for drivers that answer NotSupported to the field.
NVLink throughput and line rate, NVLink5's counters and the PCIe byte counters have no such
call: they stay absent.

Field ids came in over several driver branches (remapped rows 142-145 and the recovery action
230 are recent), while the per-purpose calls are older. The source asks for fields in one
batch and falls back to these calls only for fields the driver refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Reader = Callable[[], float]


def fallback_reader(nvml: Any, handle: Any, request: int | tuple[int, int]) -> Reader | None:
    """A call reading the same value as field `request`, or None where there is none."""
    field_id, link = request if isinstance(request, tuple) else (request, 0)
    n = nvml
    ecc = {
        n.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
        n.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (
            n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            n.NVML_VOLATILE_ECC,
        ),
        n.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_AGGREGATE_ECC),
        n.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (
            n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            n.NVML_AGGREGATE_ECC,
        ),
    }
    if field_id in ecc:
        error_type, counter = ecc[field_id]
        return lambda: float(n.nvmlDeviceGetTotalEccErrors(handle, error_type, counter))
    remapped = {
        n.NVML_FI_DEV_REMAPPED_COR: 0,
        n.NVML_FI_DEV_REMAPPED_UNC: 1,
        n.NVML_FI_DEV_REMAPPED_PENDING: 2,
        n.NVML_FI_DEV_REMAPPED_FAILURE: 3,
    }
    if field_id in remapped:
        slot = remapped[field_id]
        return lambda: float(n.nvmlDeviceGetRemappedRows(handle)[slot])
    retired = {
        n.NVML_FI_DEV_RETIRED_SBE: n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        n.NVML_FI_DEV_RETIRED_DBE: n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    }
    if field_id in retired:
        cause = retired[field_id]
        return lambda: float(len(n.nvmlDeviceGetRetiredPages(handle, cause)))
    if field_id == n.NVML_FI_DEV_RETIRED_PENDING:
        return lambda: float(n.nvmlDeviceGetRetiredPagesPendingStatus(handle))
    if field_id == n.NVML_FI_DEV_ENERGY:  # field 191 came with R535; the call with Volta
        return lambda: float(n.nvmlDeviceGetTotalEnergyConsumption(handle))
    if field_id == n.NVML_FI_DEV_PCIE_REPLAY_COUNTER:
        return lambda: float(n.nvmlDeviceGetPcieReplayCounter(handle))
    if field_id == n.NVML_FI_DEV_NVLINK_GET_STATE:
        return lambda: float(n.nvmlDeviceGetNvLinkState(handle, link))
    link_errors = {
        n.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: n.NVML_NVLINK_ERROR_DL_REPLAY,
        n.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: n.NVML_NVLINK_ERROR_DL_RECOVERY,
        n.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: n.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    }
    if field_id in link_errors:
        counter = link_errors[field_id]
        return lambda: float(n.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter))
    # The CRC data counters have one field id per link (links 0-5, then 6-11).
    for first, base_link in (
        (n.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0, 0),
        (n.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6, 6),
    ):
        if first <= field_id < first + 6:
            data_link = base_link + field_id - first
            crc_data = n.NVML_NVLINK_ERROR_DL_CRC_DATA
            return lambda: float(n.nvmlDeviceGetNvLinkErrorCounter(handle, data_link, crc_data))
    return None
