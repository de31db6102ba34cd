"""The simulated NVML library's NVLink fabric calls: a GPU's registration with Fabric Manager
and the driver's health bits for its routes.

Only Hopper and later GPUs on a node with NVSwitches have a fabric; any other answers
NOT_SUPPORTED, as the driver does. A healthy GPU is registered (state completed, status
success) with every health field the branch fills saying all is well; `fabric_unregistered`,
`fabric_degraded` and `fabric_manager_down` change that while they last.
"""

from __future__ import annotations

import ctypes

from gpuwatch.sim import cdefs as c
from gpuwatch.sim.cdefs import ERRORS
from gpuwatch.sim.faults import fabric_manager_down
from gpuwatch.sim.node import SimGpu
from gpuwatch.sim.nvml_core import Answer, LibraryCore

NOT_STARTED, IN_PROGRESS, COMPLETED = 1, 2, 3
HEALTHY, UNHEALTHY, LIMITED_CAPACITY = 1, 2, 3
# nvml.h's health mask fields in its order: (shift, the value meaning all is well).
_FIELDS = (
    ("degraded_bandwidth", 0, 2),  # 2: FALSE
    ("route_recovery", 2, 2),
    ("route_unhealthy", 4, 2),
    ("access_timeout_recovery", 6, 2),
    ("incorrect_configuration", 8, 1),  # 1: NONE, a correct configuration
    ("partition_assigned", 12, 1),  # 1: TRUE
    ("gfm_state", 14, 1),  # 1: CONNECTED
)
_SET = {"incorrect_configuration": 5}  # INSUFFICIENT_NVLINKS; the others: 1, TRUE
_UNHEALTHY = ("route_unhealthy", "incorrect_configuration")
_GFM_DISCONNECTED = 2


class FabricCalls(LibraryCore):
    """nvmlDeviceGetGpuFabricInfo (R525) and nvmlDeviceGetGpuFabricInfoV (R550)."""

    def _fabric(self, handle: int) -> tuple[SimGpu, int, int]:
        """The GPU, its fabric state and the registration's status."""
        gpu = self._whole_gpu(handle)
        if gpu.model.nvlink_generation < 4 or not self.scenario.nvswitches:
            raise Answer(c.ERROR_NOT_SUPPORTED)
        fault = gpu.active("fabric_unregistered", self.clock.now())
        if fault is None:
            return gpu, COMPLETED, c.SUCCESS
        if fault.error is not None:  # registered, and it failed
            return gpu, COMPLETED, ERRORS[fault.error]
        return gpu, IN_PROGRESS, c.SUCCESS

    def _health(self, gpu: SimGpu) -> tuple[int, int]:
        """(health mask, summary) as the node's driver branch fills them."""
        now = self.clock.now()
        degraded = gpu.active("fabric_degraded", now)
        fm_down = fabric_manager_down(self.scenario.faults, now - self.node.start)
        mask, summary = 0, HEALTHY
        for name, shift, good in _FIELDS[: self.profile.fabric_mask_fields]:
            value = good
            if degraded is not None and degraded.condition == name:
                value = _SET.get(name, 1)
                summary = UNHEALTHY if name in _UNHEALTHY else LIMITED_CAPACITY
            if name == "gfm_state" and fm_down:
                value = _GFM_DISCONNECTED
            mask |= value << shift
        return mask, summary

    def nvmlDeviceGetGpuFabricInfo(self, handle: int, out: int) -> int:
        _gpu, state, status = self._fabric(handle)
        info = c.GpuFabricInfo.from_address(out)
        info.state, info.status, info.cliqueId = state, status, 1
        return c.SUCCESS

    def nvmlDeviceGetGpuFabricInfoV(self, handle: int, out: int) -> int:
        if not out:
            return c.ERROR_INVALID_ARGUMENT
        version = ctypes.c_uint.from_address(out).value
        versions = {c.GPU_FABRIC_INFO_V2: 2, c.GPU_FABRIC_INFO_V3: 3}
        if versions.get(version, 99) > self.profile.fabric_struct:
            return c.ERROR_ARGUMENT_VERSION_MISMATCH
        gpu, state, status = self._fabric(handle)
        struct = c.GpuFabricInfoV3 if version == c.GPU_FABRIC_INFO_V3 else c.GpuFabricInfoV2
        info = struct.from_address(out)
        info.state, info.status, info.cliqueId = state, status, 1
        mask, summary = self._health(gpu)
        info.healthMask = mask
        if isinstance(info, c.GpuFabricInfoV3):
            info.healthSummary = summary
        return c.SUCCESS
