"""A GPU's temperature limits and PCIe maxima are read once they all answer: a read that
failed for now (a call timed out, the driver busy) is tried again at the next slow read, not
five minutes on, which would leave the slowdown page without its threshold meanwhile."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuwatch import metrics as m
from gpuwatch.nvml.limits import BoardLimits


class _Nvml:
    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
    NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2
    NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3

    def __init__(self) -> None:
        self.busy = True  # the slowdown threshold's call fails while busy
        self.calls = 0

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, kind: int) -> int:
        self.calls += 1
        if kind == 1 and self.busy:
            raise TimeoutError
        return {0: 95, 1: 89, 2: 0, 3: 87}[kind]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        self.calls += 1
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        self.calls += 1
        return 16


def test_limits_that_failed_to_read_are_read_again_and_kept_once_they_answer() -> None:
    nvml, failed = _Nvml(), [0]

    def attempt(what: str, call: Callable[[], Any]) -> Any:  # as DeviceReader._try does
        try:
            return call()
        except TimeoutError:
            failed[0] += 1
            return None

    limits = BoardLimits(nvml, "handle")
    first = limits.read(attempt, lambda: failed[0])
    pcie = {m.PCIE_MAX_GENERATION: 5.0, m.PCIE_MAX_WIDTH: 16.0}
    assert first == {m.MAX_OPERATING_TEMPERATURE: 87.0, m.SHUTDOWN_TEMPERATURE: 95.0, **pcie}
    nvml.busy = False
    expected = {m.MAX_OPERATING_TEMPERATURE: 87.0, m.SLOWDOWN_TEMPERATURE: 89.0,
                m.SHUTDOWN_TEMPERATURE: 95.0, **pcie}  # fmt: skip
    assert limits.read(attempt, lambda: failed[0]) == expected  # 0: a board without one
    calls = nvml.calls
    assert limits.read(attempt, lambda: failed[0]) == expected
    assert nvml.calls == calls  # kept: fixed for a board
    limits.reset()
    assert limits.read(attempt, lambda: failed[0]) == expected and nvml.calls == calls + 6
