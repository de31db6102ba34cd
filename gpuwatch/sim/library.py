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
from typing import Any

from gpuwatch.sim import cdefs as c
from gpuwatch.sim.nvml_core import Device, put, put_text
from gpuwatch.sim.nvml_devices import DeviceCalls
from gpuwatch.sim.nvml_fabric import FabricCalls
from gpuwatch.sim.nvml_pcie import PcieCalls
from gpuwatch.sim.nvml_readings import ReadingCalls


class SimulatedNvml(ReadingCalls, DeviceCalls, FabricCalls, PcieCalls):
    """libnvidia-ml.so.1 over one simulated node. `install()` puts it under pynvml; its entry
    points are grouped by what they answer (nvml_readings.py, nvml_devices.py,
    nvml_fabric.py)."""

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
        put_text(out, length, self.profile.driver_version)
        return c.SUCCESS

    def nvmlSystemGetNVMLVersion(self, out: int, length: int) -> int:
        self._check_init()
        put_text(out, length, self.profile.nvml_version)
        return c.SUCCESS

    def _listed(self) -> list[Device]:
        """The GPUs the driver enumerates now, in bus order: a missing one leaves a gap that
        the later ones close, as after a reboot (indices shift; UUIDs do not)."""
        now = self.clock.now()
        return [dev for dev in self._gpus if not dev.gpu.missing(now)]

    def nvmlDeviceGetCount_v2(self, out: int) -> int:
        self._check_init()
        put(ctypes.c_uint, out, len(self._listed()))
        return c.SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: int, out: int) -> int:
        self._check_init()
        listed = self._listed()
        if not 0 <= index < len(listed):
            return c.ERROR_INVALID_ARGUMENT
        put(ctypes.c_void_p, out, listed[index].address)
        return c.SUCCESS
