"""The simulated NVML library's calls about a GPU's PCIe link: its generation and width, the
most it trains to, and the traffic over it."""

from __future__ import annotations

import ctypes

from gpuwatch.sim import cdefs as c
from gpuwatch.sim.nvml_core import (
    PCIE_THROUGHPUT_WINDOW_S,
    PCIE_UTIL_RX,
    PCIE_UTIL_TX,
    LibraryCore,
    put,
)


class PcieCalls(LibraryCore):
    """Entry points that read a GPU's PCIe link."""

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        put(ctypes.c_uint, out, gpu.model.pcie_generation)
        return c.SUCCESS

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        width = gpu.model.pcie_width
        if gpu.active("pcie_downtrain", self.clock.now()):
            # The link trained to half its lanes (a riser, a slot, a cable), as `nvidia-smi
            # -q` shows it: "Link Width  Max : 16x  Current : 8x".
            width //= 2
        put(ctypes.c_uint, out, width)
        return c.SUCCESS

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        put(ctypes.c_uint, out, gpu.model.pcie_width)
        return c.SUCCESS

    def nvmlDeviceGetPcieThroughput(self, handle: int, counter: int, out: int) -> int:
        """KB/s over a 20 ms window the call waits out (nvml.h; 21 ms a call on an H200)."""
        gpu = self._whole_gpu(handle)
        self._not_in_vgpu_guest()
        if counter not in (PCIE_UTIL_TX, PCIE_UTIL_RX):
            return c.ERROR_INVALID_ARGUMENT
        start = self.clock.now()
        self.clock.block(PCIE_THROUGHPUT_WINDOW_S)
        tx, rx = gpu.pcie_rates(start + PCIE_THROUGHPUT_WINDOW_S / 2)
        put(ctypes.c_uint, out, int((tx if counter == PCIE_UTIL_TX else rx) / 1024))
        return c.SUCCESS

    # The link trains to its top generation under load, which is all the simulator plays.
    nvmlDeviceGetMaxPcieLinkGeneration = nvmlDeviceGetCurrPcieLinkGeneration
