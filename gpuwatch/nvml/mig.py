"""MIG: the GPU instances of a GPU in MIG mode, each read through its own device handle.

A MIG device handle answers memory and processes for its instance; temperature, power, ECC
and the other fields stay on the parent. The instance's profile (`3g.40gb`, dcgm-exporter's
GPU_I_PROFILE) is the tail of the name the driver gives the MIG device:
"NVIDIA H100 80GB HBM3 MIG 3g.40gb".
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

_PROFILE = re.compile(r"MIG (\S+)$")


@dataclass(frozen=True, slots=True)
class InstanceHandle:
    handle: Any
    gpu_instance_id: int
    profile: str
    uuid: str


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def find_instances(nvml: Any, parent: Any) -> list[InstanceHandle]:
    """The GPU instances of a GPU in MIG mode. A lost GPU propagates; an instance that cannot
    be read is left out (logged)."""
    try:
        count = int(nvml.nvmlDeviceGetMaxMigDeviceCount(parent))
    except nvml.NVMLError_GpuIsLost:
        raise
    except nvml.NVMLError as exc:
        log.warning("MIG devices cannot be counted: %s", exc)
        return []
    found = []
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
        except nvml.NVMLError_GpuIsLost:
            raise
        except nvml.NVMLError:
            continue  # no MIG device at this index (NOT_FOUND)
        try:
            gi = int(nvml.nvmlDeviceGetGpuInstanceId(handle))
            name = _text(nvml.nvmlDeviceGetName(handle))
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError_GpuIsLost:
            raise
        except nvml.NVMLError as exc:
            log.warning("MIG device %d cannot be read: %s", index, exc)
            continue
        match = _PROFILE.search(name)
        found.append(InstanceHandle(handle, gi, match.group(1) if match else "", uuid))
    return found
