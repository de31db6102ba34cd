"""A GPU's place in the NVLink fabric (Hopper and later, on NVSwitch systems): whether Fabric
Manager has registered it, and the driver's health bits for its routes.

The structs are nvml.h's, declared here rather than taken from pynvml: nvidia-ml-py 12.550.52
(the lowest release gpuwatch allows) declares `clusterUuid` 80 bytes long where the driver
writes 16, so every field after it would read past what the driver wrote; and no release
before 13.580 has the v3 struct with the health summary. The newest struct the driver takes
is asked for first: nvmlDeviceGetGpuFabricInfoV with v3 (R580), with v2 (R550), then the
unversioned call (R525, no health bits).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from ctypes import byref, c_int, c_ubyte, c_uint, sizeof
from dataclasses import dataclass
from typing import Any

from gpuwatch import metrics as m
from gpuwatch.model import Labels, Sample

UUID_LEN = 16
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_ARGUMENT_VERSION_MISMATCH = 25  # pynvml 12.550 has no name (nor exception) for it

STATES = {1: "not_started", 2: "in_progress", 3: "completed"}  # 0: not supported
COMPLETED = 3
SUMMARIES = {1: "healthy", 2: "unhealthy", 3: "limited_capacity"}  # 0: not supported

# nvml.h's health mask: (condition, shift, width, the values that mean the condition holds).
# Each field's 0 is "not supported": that condition is left out. The widths are the header's
# (one early header had 0x11 for the first; the driver writes 2 bits).
CONDITIONS: tuple[tuple[str, int, int, frozenset[int]], ...] = (
    ("degraded_bandwidth", 0, 0x3, frozenset({1})),
    ("route_recovery", 2, 0x3, frozenset({1})),
    ("route_unhealthy", 4, 0x3, frozenset({1})),
    ("access_timeout_recovery", 6, 0x3, frozenset({1})),
    # 1 is a correct configuration; 2-8 name what is wrong (system GUID, chassis serial,
    # partition, too few NVLinks, GPU firmware, location, GPU state).
    ("incorrect_configuration", 8, 0xF, frozenset(range(2, 16))),
    ("fabric_manager_disconnected", 14, 0x3, frozenset({2})),
)


class FabricInfoV1(ctypes.Structure):
    _fields_ = [
        ("clusterUuid", c_ubyte * UUID_LEN),
        ("status", c_int),
        ("cliqueId", c_uint),
        ("state", c_ubyte),
    ]


class FabricInfoV2(ctypes.Structure):
    _fields_ = [
        ("version", c_uint),
        ("clusterUuid", c_ubyte * UUID_LEN),
        ("status", c_int),
        ("cliqueId", c_uint),
        ("state", c_ubyte),
        ("healthMask", c_uint),
    ]


class FabricInfoV3(FabricInfoV2):
    _fields_ = [("healthSummary", c_ubyte)]  # after v2's fields, as ctypes extends a struct


# NVML_STRUCT_VERSION: the struct's size, and its version in the top byte.
VERSION_2 = sizeof(FabricInfoV2) | 2 << 24  # 0x02000024
VERSION_3 = sizeof(FabricInfoV3) | 3 << 24  # 0x03000028


@dataclass(frozen=True, slots=True)
class Fabric:
    state: int  # STATES' keys; 0 not supported
    status: int  # NVML's return code for the registration; meaningful once completed
    health_mask: int | None  # None: the driver's call has no health bits
    summary: int | None  # None: the driver takes no v3 struct


def fabric_calls(nvml: Any, handle: Any) -> dict[str, Callable[[], Fabric]]:
    """The calls that read the GPU's fabric info by struct, newest first (DeviceReader tries
    them in order); a call the driver or pynvml lacks raises what a missing call raises."""

    def versioned(struct: type[FabricInfoV2], version: int) -> Fabric:
        info = struct()
        info.version = version
        try:
            nvml.nvmlDeviceGetGpuFabricInfoV(handle, byref(info))
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == ERROR_ARGUMENT_VERSION_MISMATCH:
                raise nvml.NVMLError(ERROR_FUNCTION_NOT_FOUND) from exc  # an older struct
            raise
        summary = info.healthSummary if isinstance(info, FabricInfoV3) else None
        return Fabric(info.state, info.status, info.healthMask, summary)

    def unversioned() -> Fabric:
        info = FabricInfoV1()
        nvml.nvmlDeviceGetGpuFabricInfo(handle, byref(info))
        return Fabric(info.state, info.status, None, None)

    calls: dict[str, Callable[[], Fabric]] = {}
    if hasattr(nvml, "nvmlDeviceGetGpuFabricInfoV"):
        calls["v3"] = lambda: versioned(FabricInfoV3, VERSION_3)
        calls["v2"] = lambda: versioned(FabricInfoV2, VERSION_2)
    if hasattr(nvml, "nvmlDeviceGetGpuFabricInfo"):
        calls["v1"] = unversioned
    return calls


def fabric_samples(fabric: Fabric, labels: Labels) -> list[Sample]:
    """The GPU's fabric series: none where the GPU has no fabric (state not supported)."""
    if fabric.state not in STATES:
        return []
    out = [
        Sample(m.FABRIC_STATE, (*labels, ("state", name)), float(fabric.state == state))
        for state, name in STATES.items()
    ]
    if fabric.state == COMPLETED:
        out.append(Sample(m.FABRIC_STATUS, labels, float(fabric.status)))
    mask = fabric.health_mask
    if mask is not None:
        for condition, shift, width, holds in CONDITIONS:
            value = mask >> shift & width
            if value:
                labelled = (*labels, ("condition", condition))
                out.append(Sample(m.FABRIC_CONDITION, labelled, float(value in holds)))
    if fabric.summary in SUMMARIES:
        out.extend(
            Sample(m.FABRIC_HEALTH, (*labels, ("summary", name)), float(fabric.summary == key))
            for key, name in SUMMARIES.items()
        )
    return out
