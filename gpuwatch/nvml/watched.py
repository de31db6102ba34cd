"""What the NVML source keeps of each GPU between cycles, and why NVML could not start."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatch.model import GpuInfo, GpuProcess, GpuStatus, MigInstance, Sample
from gpuwatch.nvml.caller import LaneStuckError, NvmlTimeoutError
from gpuwatch.nvml.device import DeviceReader
from gpuwatch.nvml.errors import NvmlModule

INIT_DEADLINE_S = 30.0  # nvmlInit and opening handles are slow without persistence mode


def init_failure_reason(nvml: NvmlModule, exc: BaseException) -> str:
    """The operator-facing reason NVML could not start."""
    if isinstance(exc, nvml.NVMLError_LibraryNotFound):
        return "NVML: driver library not found"
    if isinstance(exc, nvml.NVMLError_DriverNotLoaded):
        return "NVML: driver not loaded"
    if isinstance(exc, nvml.NVMLError_LibRmVersionMismatch):
        return "NVML: library and kernel driver versions differ (reload the driver or reboot)"
    if isinstance(exc, nvml.NVMLError_NoPermission):
        return "NVML: insufficient permissions"
    if isinstance(exc, NvmlTimeoutError | LaneStuckError):
        return f"NVML: nvmlInit did not answer within {INIT_DEADLINE_S:g}s"
    return f"NVML: {exc}"


@dataclass
class WatchedGpu:
    """What the source keeps of one GPU between cycles."""

    index: int
    info: GpuInfo
    reader: DeviceReader | None
    status: GpuStatus
    reason: str = ""
    next_open: float = 0.0
    late_since: float | None = None  # when its calls began to miss the deadline
    last_samples: list[Sample] | None = None  # the last cycle's fast tier, kept while late
    slow: list[Sample] | None = None  # the last slow tier read; None once the GPU failed
    next_slow: float = 0.0  # when its slow tier is next due
    slow_now: bool = False  # a fault event came, or it failed: read its slow tier, off turn

    @property
    def part(self) -> str:
        """The batch part (and store timeline) of its slow tier."""
        return f"slow/gpu{self.index}"

    @property
    def processes(self) -> tuple[GpuProcess, ...]:
        return self.reader.processes if self.reader is not None else ()

    @property
    def instances(self) -> tuple[MigInstance, ...]:
        return self.reader.instances if self.reader is not None else ()

    @property
    def lane(self) -> str:
        return f"gpu{self.index}"
