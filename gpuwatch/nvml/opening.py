"""Opening a GPU: its handle and what identifies it, read once in a worker thread."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from gpuwatch.host.processes import ProcessLookup
from gpuwatch.model import GpuInfo
from gpuwatch.nvml.device import DeviceReader
from gpuwatch.nvml.errors import NvmlModule, as_text, missing_errors
from gpuwatch.nvml.fields import FieldValues

T = TypeVar("T")
VIRTUALIZATION_VGPU = 2  # nvmlGpuVirtualizationMode_t: this is a guest with a vGPU


def open_device(
    nvml: NvmlModule,
    index: int,
    lookup: ProcessLookup | None = None,
    now: Callable[[], float] = time.monotonic,
) -> DeviceReader:
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
        except (nvml.NVMLError, *missing_errors(nvml)):
            return default

    def link_count() -> int:
        fv = nvml.nvmlDeviceGetFieldValues(handle, [nvml.NVML_FI_DEV_NVLINK_LINK_COUNT])[0]
        returned, value = FieldValues(nvml).one(fv)
        if returned == nvml.NVML_SUCCESS:
            return int(value)
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
    vgpu = optional(lambda: nvml.nvmlDeviceGetVirtualizationMode(handle), 0)
    info = GpuInfo(index, uuid, name, pci, serial, vbios, links)
    return DeviceReader(nvml, handle, info, lookup, now=now, vgpu_guest=vgpu == VIRTUALIZATION_VGPU)
