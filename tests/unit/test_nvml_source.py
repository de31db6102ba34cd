"""The NVML source over the simulator: lost GPUs, XIDs, and fields that are not supported."""

from __future__ import annotations

import asyncio
from typing import Any

import pynvml

from gpuwatch import metrics as m
from gpuwatch.clock import ScaledClock
from gpuwatch.config import SamplingConfig
from gpuwatch.model import Event, GpuStatus
from gpuwatch.nvml.device import open_device
from gpuwatch.nvml.source import NvmlSource
from gpuwatch.sim.fake_pynvml import FakeNvml
from gpuwatch.sim.scenario import load_scenario

SPEED = 20.0


def _source(scenario: str, nvml: Any = None) -> tuple[NvmlSource, list[Event], ScaledClock]:
    clock = ScaledClock(SPEED)
    nvml = nvml or FakeNvml(load_scenario(scenario), clock)
    events: list[Event] = []
    return NvmlSource(nvml, clock, SamplingConfig(), events.append), events, clock


def _values(batch: Any, name: str) -> dict[str, float]:
    return {dict(s.labels).get("gpu", ""): s.value for s in batch.samples if s.name == name}


async def test_a_gpu_that_falls_off_the_bus_is_lost_and_the_others_carry_on() -> None:
    source, events, _ = _source("fall_off_bus")
    await source.start()
    first = await source.collect()
    assert all(g.status == GpuStatus.OK for g in first.gpus)
    await asyncio.sleep(12 / SPEED)  # 12 simulated seconds: past the fault at 10 s
    batch = await source.collect()
    await asyncio.sleep(0.05)  # the XID arrives through the event thread
    batch = await source.collect()
    await source.stop()
    assert [g.status for g in batch.gpus] == [GpuStatus.OK, GpuStatus.LOST] + [GpuStatus.OK] * 6
    assert _values(batch, m.GPU_UP)["1"] == 0.0
    assert "1" not in _values(batch, m.TEMPERATURE)
    assert len(_values(batch, m.TEMPERATURE)) == 7
    assert _values(batch, m.XID_ERRORS) == {"1": 1.0}
    kinds = [(e.kind, e.gpu) for e in events]
    assert ("gpu_lost", 1) in kinds and ("xid", 1) in kinds


class _FlakyNvml(FakeNvml):
    """A driver where power readings fail transiently and memory temperature is unsupported."""

    fail_power = True

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        if self.fail_power:
            raise pynvml.NVMLError_Unknown()
        return super().nvmlDeviceGetPowerUsage(handle)

    def _field(self, gpu: Any, reading: Any, field_id: int, scope: int) -> int | None:
        if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
            return None
        return super()._field(gpu, reading, field_id, scope)


def test_unsupported_fields_are_absent_and_transient_errors_retry() -> None:
    clock = ScaledClock(1.0)
    nvml = _FlakyNvml(load_scenario("healthy"), clock)
    nvml.nvmlInit()
    reader = open_device(nvml, 0)
    assert reader.info.nvlink_count == 18
    assert reader.info.pci_bus_id == "00000000:18:00.0"
    names = {s.name for s in reader.read()}
    assert m.POWER not in names  # failed this cycle: absent, not 0
    assert m.MEMORY_TEMPERATURE not in names  # not supported: absent, and not asked again
    assert m.TEMPERATURE in names
    nvml.fail_power = False
    names = {s.name for s in reader.read()}
    assert m.POWER in names
    assert m.MEMORY_TEMPERATURE not in names
    calls_before = next(nvml.calls)
    reader.read()
    assert next(nvml.calls) - calls_before > 1


async def test_no_driver_is_reported_not_faked() -> None:
    class NoDriver:
        def __getattr__(self, name: str) -> Any:
            return getattr(pynvml, name)

        def nvmlInit(self) -> None:
            raise pynvml.NVMLError_DriverNotLoaded()

    source, _, _ = _source("healthy", NoDriver())
    await source.start()
    batch = await source.collect()
    await source.stop()
    assert batch.backend.up is False
    assert batch.backend.reason == "NVML: driver not loaded"
    assert [(s.name, s.value) for s in batch.samples] == [(m.UP, 0.0)]
    assert batch.gpus == []
