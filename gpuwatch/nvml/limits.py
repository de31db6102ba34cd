"""A GPU's fixed limits, as its board reports them through NVML: its temperature limits and
the most its PCIe link can train to.

Every model, and every board of one model, has its own: an A100-SXM4-80GB slows down at
89 °C, an H100 SXM at 89 °C and shuts down at 95 °C, a V100 slows down at 87 °C. A rule with
one fixed number pages too early on one model and after the shutdown on another, so the
rules compare each GPU's temperature with its own limits.

nvmlDeviceGetTemperatureThreshold answers them in degrees Celsius on every driver gpuwatch
supports. nvidia-smi prints them relative to "T.Limit" on Ada and later (`GPU Slowdown
T.Limit Temp: -2 C`), from field values 193-196; the call still answers the absolute
temperature there.

A GPU's PCIe link drops to a lower generation when idle and trains back up under load, so a
link's rate is measured against the most it can reach (nvmlDeviceGetMaxPcieLinkGeneration and
...Width: the lower of what the GPU and the slot support), not against what it runs at now.

The limits are fixed for a board, so they are read once, and again at each recheck.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from gpuwatch import metrics as m
from gpuwatch.nvml.errors import NvmlModule

# nvml.h's nvmlTemperatureThresholds_t: the kind and the series it becomes.
THRESHOLDS = (
    ("NVML_TEMPERATURE_THRESHOLD_GPU_MAX", m.MAX_OPERATING_TEMPERATURE),
    ("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", m.SLOWDOWN_TEMPERATURE),
    ("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", m.SHUTDOWN_TEMPERATURE),
    ("NVML_TEMPERATURE_THRESHOLD_MEM_MAX", m.MEMORY_MAX_TEMPERATURE),
)
PCIE_MAXIMA = (
    ("nvmlDeviceGetMaxPcieLinkGeneration", m.PCIE_MAX_GENERATION),
    ("nvmlDeviceGetMaxPcieLinkWidth", m.PCIE_MAX_WIDTH),
)


class BoardLimits:
    """A GPU's limits, read once they all answered (or the driver said it has none): a read
    that failed for now is tried again at the next slow read, not after the recheck."""

    def __init__(self, nvml: NvmlModule, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle
        self._kept: dict[str, float] | None = None

    def read(self, attempt: Callable[..., Any], failures: Callable[[], int]) -> dict[str, float]:
        """The limits; `failures()` counts the reader's failed calls so far."""
        if self._kept is not None:
            return self._kept
        before = failures()
        limits = read_limits(self._nvml, self._handle, attempt)
        if failures() == before:
            self._kept = limits
        return limits

    def reset(self) -> None:
        self._kept = None


def read_limits(nvml: NvmlModule, handle: Any, attempt: Callable[..., Any]) -> dict[str, float]:
    """Series name -> the limit (°C, a PCIe generation or lane count), for those the GPU
    answers. `attempt(what, call)` is the reader's: it retires what the driver does not
    support."""
    out: dict[str, float] = {}
    calls = [
        (name, partial(nvml.nvmlDeviceGetTemperatureThreshold, handle, getattr(nvml, kind)))
        for kind, name in THRESHOLDS
    ]
    calls += [(name, partial(getattr(nvml, call), handle)) for call, name in PCIE_MAXIMA]
    for name, call in calls:
        value = attempt(name, call)
        if value:  # 0: a board that does not set it
            out[name] = float(value)
    return out
