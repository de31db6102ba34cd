"""The NVML source over the simulator: lost and missing GPUs, fault events, and fields that
are not supported."""

from __future__ import annotations

import asyncio
import collections
import ctypes
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuwatch import metrics as m
from gpuwatch.clock import ManualClock, ScaledClock
from gpuwatch.model import Event, GpuInfo, GpuStatus, MissingGpu, Sample
from gpuwatch.nvml.config import SamplingConfig
from gpuwatch.nvml.device import DeviceReader
from gpuwatch.nvml.fields import FieldRequest, FieldValues
from gpuwatch.nvml.opening import open_device
from gpuwatch.nvml.source import RETRY_S, NvmlSource
from gpuwatch.sim import cdefs
from gpuwatch.sim.library import SimulatedNvml
from gpuwatch.sim.reading import pcie_bytes_per_s
from gpuwatch.sim.scenario import load_scenario
from gpuwatch.state.inventory import Inventory
from tests.conftest import Simulate

SPEED = 20.0


def _source(
    simulate: Simulate | None, scenario: str, nvml: Any = None, slow_interval: float = 5.0
) -> tuple[NvmlSource, list[Event], ScaledClock]:
    """`scenario`: a built-in one's name, or a file's path."""
    clock = ScaledClock(SPEED)
    if simulate is not None:
        simulate(load_scenario(scenario), clock)
    events: list[Event] = []
    # A 20 s interval gives each GPU's calls a 20 s deadline: a second of real time at this
    # speed, so a loaded machine does not make a healthy GPU look unresponsive.
    sampling = SamplingConfig(interval=20.0, slow_interval=slow_interval)
    source = NvmlSource(nvml or pynvml, clock, sampling, events.append)
    return source, events, clock


def _two_gpus(tmp_path: Path, fault: str) -> str:
    """A file for a scenario of two H100s with one fault."""
    path = tmp_path / "scenario.yaml"
    path.write_text(f"node: {{gpus: 2, model: H100}}\nfaults: [{fault}]\n")
    return str(path)


def _slow_parts(batch: Any) -> list[str]:
    """The slow tiers read this cycle, by part (PCIe throughput reads come on their own)."""
    return [part for part, _ in batch.slow_read if part.startswith("slow/")]


def _values(batch: Any, name: str) -> dict[str, float]:
    return {dict(s.labels).get("gpu", ""): s.value for s in batch.samples if s.name == name}


async def test_a_gpu_that_falls_off_the_bus_is_lost_and_the_others_carry_on(
    simulate: Simulate,
) -> None:
    source, events, _ = _source(simulate, "fall_off_bus")
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
    kinds = [(e.kind, e.gpu) for e in events]
    assert ("gpu_lost", 1) in kinds and ("xid", 1) in kinds


async def test_a_gpu_lost_before_the_daemon_came_is_recovered_once_it_opens(
    tmp_path: Path, simulate: Simulate
) -> None:
    fault = "{kind: fall_off_bus, gpu: 1, at: 0s, duration: 5s}"
    source, events, _ = _source(simulate, _two_gpus(tmp_path, fault))
    await source.start()
    first = await source.collect()
    assert [g.status for g in first.gpus] == [GpuStatus.OK, GpuStatus.LOST]
    await asyncio.sleep((RETRY_S + 1) / SPEED)  # back on the bus; opened at the next try
    after = await source.collect()
    await source.stop()
    assert [g.status for g in after.gpus] == [GpuStatus.OK, GpuStatus.OK]
    assert after.gpus[1].info.uuid
    assert [(e.kind, e.gpu) for e in events] == [("gpu_lost", 1), ("gpu_recovered", 1)]


async def _events_of(simulate: Simulate, scenario: str) -> list[Event]:
    source, events, _ = _source(simulate, scenario)
    await source.start()
    await asyncio.sleep(11 / SPEED)  # past the fault at 10 simulated seconds
    await source.collect()
    await asyncio.sleep(0.05)
    await source.stop()
    return events


async def test_each_nvml_event_type_becomes_its_own_journal_entry(simulate: Simulate) -> None:
    dbe = await _events_of(simulate, "ecc_dbe")
    assert [(e.kind, e.gpu, e.data.get("xid"), e.data.get("type")) for e in dbe] == [
        ("xid", 1, 48, None),
        ("ecc", 1, None, "dbe"),
    ]
    assert dbe[1].message == "GPU 1: uncorrectable (double-bit) ECC error"
    storm = await _events_of(simulate, "ecc_sbe")
    assert storm[1].data == {"type": "sbe_storm"}
    failed = await _events_of(simulate, "row_remap_failure")
    assert [(e.kind, e.data.get("outcome")) for e in failed][1] == ("memory_retirement", "failed")
    recovery = await _events_of(simulate, "recovery_action")
    assert recovery[1].kind == "recovery_action"
    assert recovery[1].message == "GPU 1: the driver asks for gpu_reset"


async def test_a_gpu_the_node_had_before_and_no_longer_lists_is_reported(
    tmp_path: Path, simulate: Simulate
) -> None:
    clock = ScaledClock(SPEED)
    eight = load_scenario("healthy")
    simulate(eight, clock)
    before = NvmlSource(pynvml, clock, SamplingConfig(), [].append, Inventory(tmp_path))
    await before.start()
    await before.stop()
    assert before.backend.missing == ()
    events: list[Event] = []
    simulate(eight.with_gpus(7), clock)
    after = NvmlSource(pynvml, clock, SamplingConfig(), events.append, Inventory(tmp_path))
    await after.start()
    await after.stop()
    assert [(g.index, g.pci_bus_id) for g in after.backend.missing] == [(7, "00000000:DB:00.0")]
    assert [e.kind for e in events] == ["gpu_missing"]
    assert "last seen as GPU 7" in events[0].message


async def test_a_gpu_that_cannot_be_opened_yet_is_not_reported_missing(
    tmp_path: Path, simulate: Simulate
) -> None:
    clock = ManualClock()
    eight = load_scenario("healthy")
    simulate(eight, clock)
    before = NvmlSource(pynvml, clock, SamplingConfig(), [].append, Inventory(tmp_path))
    await before.start()
    await before.stop()
    flaky = tmp_path / "flaky.yaml"
    flaky.write_text(
        "node: {gpus: 8, model: H100, seed: 1}\n"
        "faults: [{kind: nvml_error, gpu: 3, at: 0s, duration: 20s, error: UNKNOWN}]\n"
    )
    simulate(load_scenario(str(flaky)), clock)
    events: list[Event] = []
    after = NvmlSource(pynvml, clock, SamplingConfig(), events.append, Inventory(tmp_path))
    await after.start()
    try:
        await after.collect()
        assert after.backend.missing == ()  # GPU 3 is listed: it may be the one it had
        clock.advance(30)
        await after.collect()  # GPU 3 opens: every GPU the node had is there
        assert after.backend.missing == ()
        assert "gpu_missing" not in [e.kind for e in events]
    finally:
        await after.stop()


def test_a_gpu_replaced_in_its_slot_is_forgotten_not_missing(tmp_path: Path) -> None:
    def gpu(uuid: str, slot: str) -> GpuInfo:
        return GpuInfo(0, uuid, "NVIDIA H100 80GB HBM3", slot, "1650", "96.00", 0)

    Inventory(tmp_path).update([gpu("GPU-old", "00000000:18:00.0"), gpu("GPU-2", "0000:2A")])
    after_rma = Inventory(tmp_path)
    assert after_rma.update([gpu("GPU-new", "00000000:18:00.0")]) == (
        MissingGpu("GPU-2", 0, "NVIDIA H100 80GB HBM3", "1650", "0000:2A"),
    )
    assert set(Inventory(tmp_path).known) == {"GPU-new", "GPU-2"}


def _read_all(reader: DeviceReader) -> list[Sample]:
    """Both tiers of one reading."""
    fast, slow = reader.read(slow=True)
    assert slow is not None
    return fast + slow


class _FlakyNvml(SimulatedNvml):
    """A driver where power readings fail transiently and memory temperature is unsupported."""

    fail_power = True

    def nvmlDeviceGetPowerUsage(self, handle: int, out: int) -> int:
        if self.fail_power:
            return cdefs.ERROR_UNKNOWN
        return super().nvmlDeviceGetPowerUsage(handle, out)

    def _field(self, dev: Any, field_id: int, scope: int) -> int:
        if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
            return super()._field(dev, -1, scope)  # no such field: NOT_SUPPORTED
        return super()._field(dev, field_id, scope)


def test_unsupported_fields_are_absent_and_transient_errors_retry(simulate: Simulate) -> None:
    clock = ScaledClock(1.0)
    nvml = simulate(load_scenario("healthy"), clock, _FlakyNvml)
    pynvml.nvmlInit()
    reader = open_device(pynvml, 0)
    assert reader.info.nvlink_count == 18
    assert reader.info.pci_bus_id == "00000000:18:00.0"
    names = {s.name for s in _read_all(reader)}
    assert m.POWER not in names  # failed this cycle: absent, not 0
    assert m.MEMORY_TEMPERATURE not in names  # not supported: absent, and not asked again
    assert m.TEMPERATURE in names
    nvml.fail_power = False
    names = {s.name for s in _read_all(reader)}
    assert m.POWER in names
    assert m.MEMORY_TEMPERATURE not in names
    calls_before = next(nvml.calls)
    _read_all(reader)
    assert next(nvml.calls) - calls_before > 1


async def test_no_driver_is_reported_not_faked() -> None:
    class NoDriver:
        def __getattr__(self, name: str) -> Any:
            return getattr(pynvml, name)

        def nvmlInit(self) -> None:
            raise pynvml.NVMLError_DriverNotLoaded()

    source, _, _ = _source(None, "healthy", NoDriver())
    await source.start()
    batch = await source.collect()
    await source.stop()
    assert batch.backend.up is False
    assert batch.backend.reason == "NVML: driver not loaded"
    assert [(s.name, s.value) for s in batch.samples] == [(m.UP, 0.0)]
    assert batch.gpus == []


class _OldDriverNvml(SimulatedNvml):
    """A driver without the newer field ids: each answers NotSupported, but the older
    per-purpose calls (nvmlDeviceGetRemappedRows, nvmlDeviceGetTotalEccErrors, ...) work."""

    def nvmlDeviceGetFieldValues(self, handle: int, count: int, values: int) -> int:
        ret = super().nvmlDeviceGetFieldValues(handle, count, values)
        for slot in (cdefs.FieldValue * count).from_address(values):
            if slot.fieldId not in (pynvml.NVML_FI_DEV_ENERGY, pynvml.NVML_FI_DEV_MEMORY_TEMP):
                slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return ret


SCENARIO = """
node: {{gpus: 1, model: {model}}}
faults:
  - {{kind: {fault}, gpu: 0, at: 1s}}
  - {{kind: ecc_dbe, gpu: 0, at: 1s}}
  - {{kind: nvlink_crc_storm, gpu: 0, at: 1s}}
  - {{kind: pcie_replay_storm, gpu: 0, at: 1s}}
"""


@pytest.mark.parametrize(
    ("model", "fault"), [("H100", "row_remap_pending"), ("V100", "retired_pages")]
)
def test_an_older_driver_without_field_ids_gives_the_same_fault_metrics(
    model: str, fault: str, tmp_path: Path, simulate: Simulate
) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(SCENARIO.format(model=model, fault=fault))
    readings = []
    for kind in (SimulatedNvml, _OldDriverNvml):
        clock = ManualClock()
        simulate(load_scenario(str(path)), clock, kind)
        pynvml.nvmlInit()
        reader = open_device(pynvml, 0)
        _read_all(reader)  # the first read finds out which fields the driver refuses
        clock.advance(30.0)
        # The recovery action, NVLink throughput and line rate and the PCIe byte counters
        # have no older call: absent on old drivers.
        no_call = (m.RECOVERY_ACTION, m.NVLINK_BYTES, m.NVLINK_SPEED, m.PCIE_BYTES)
        readings.append(
            {(s.name, s.labels): s.value for s in _read_all(reader) if s.name not in no_call}
        )
    new, old = readings
    assert old == new
    faults = {name for name, _ in new if "remap" in name or "retired" in name or "ecc" in name}
    assert len(faults) >= 3
    dbe = (*reader.info.labels, ("type", "uncorrected"), ("scope", "volatile"))
    assert new[(m.ECC_ERRORS, dbe)] == 1.0


class SlowGpu(SimulatedNvml):
    """GPU 2 answers its utilization `delay` real seconds late, while `delay` is set."""

    delay = 0.0

    def nvmlDeviceGetUtilizationRates(self, handle: int, out: int) -> int:
        if self.delay and self._device(handle).gpu.index == 2:
            time.sleep(self.delay)
        return super().nvmlDeviceGetUtilizationRates(handle, out)


async def test_a_late_answer_is_not_an_unresponsive_gpu_until_it_has_been_late_for_2_s(
    simulate: Simulate,
) -> None:
    """A busy host can make a call miss the cycle's deadline once without the GPU being
    wrong, so the GPU keeps its last values until its calls have been late for 2 s. (The
    deadline here is half a second, not 10 Hz's 100 ms: other GPUs on a loaded test machine
    must not miss it.)"""
    clock = ScaledClock(1.0)  # real time: the deadline is a real half second
    nvml = simulate(load_scenario("healthy"), clock, SlowGpu)
    events: list[Event] = []
    source = NvmlSource(pynvml, clock, SamplingConfig(interval=0.5), events.append)
    await source.start()
    first = await source.collect()
    nvml.delay = 0.8  # one late answer: past the deadline, within the grace
    late = await source.collect()
    nvml.delay = 0.0
    await asyncio.sleep(0.5)  # the late call finishes; its lane is free again
    back = await source.collect()
    assert [g.status for g in late.gpus] == [GpuStatus.OK] * 8
    assert _values(late, m.UTILIZATION)["2"] == _values(first, m.UTILIZATION)["2"]
    assert [g.status for g in back.gpus] == [GpuStatus.OK] * 8
    nvml.delay = 4.0  # now it hangs: unresponsive once its calls have been late for 2 s
    statuses = []
    for _ in range(3):
        batch = await source.collect()
        statuses.append(batch.gpus[2].status)
        await asyncio.sleep(1.1)
    await source.stop()
    assert statuses == [GpuStatus.OK, GpuStatus.OK, GpuStatus.UNRESPONSIVE]
    assert [(e.kind, e.gpu) for e in events] == [("gpu_unresponsive", 2)]


async def test_the_slow_fields_are_read_once_a_second_by_each_gpu_in_turn(
    simulate: Simulate,
) -> None:
    """At 10 Hz the fast fields come every cycle; the slow ones (error counters, link states,
    limits) once a second per GPU, the GPUs spread over the second (the first second too),
    and each GPU's last ones stand in every batch between its reads."""
    clock = ManualClock()
    simulate(load_scenario("healthy"), clock)
    sampling = SamplingConfig(interval=0.1, slow_interval=1.0)
    source = NvmlSource(pynvml, clock, sampling, lambda _: None)
    await source.start()
    reads: list[list[str]] = []
    for cycle in range(31):
        batch = await source.collect()
        reads.append(_slow_parts(batch))
        assert len(_values(batch, m.TEMPERATURE)) == 8  # fast: every GPU, every cycle
        assert m.ECC_ERRORS not in {s.name for s in batch.samples}
        if cycle >= 10:  # after the first second, every GPU's slow fields are in every batch
            dbe = {
                dict(s.labels)["gpu"]
                for s in batch.slow_samples
                if s.name == m.ECC_ERRORS and ("type", "uncorrected") in s.labels
            }
            assert len(dbe) == 8 and {s.name for s in batch.slow_samples} >= {
                m.NVLINK_ERRORS,
                m.POWER_LIMIT,
                m.PCIE_LINK_WIDTH,
            }
        clock.advance(0.1)
    await source.stop()
    first_second = {part for parts in reads[:10] for part in parts}
    assert first_second == {f"slow/gpu{i}" for i in range(8)}  # the whole node's, at start
    per_gpu = collections.Counter(part for parts in reads[11:] for part in parts)
    assert per_gpu == {f"slow/gpu{i}": 2 for i in range(8)}  # then once a second each
    assert max(len(parts) for parts in reads) <= 2  # never all 8 in one cycle


async def test_a_fault_event_reads_its_gpus_slow_fields_in_the_next_cycle(
    simulate: Simulate,
) -> None:
    """Error counters read once every ten minutes still show an ECC error in the cycle after
    its event: the alerts on them are not a slow interval late."""
    clock = ScaledClock(SPEED)
    simulate(load_scenario("ecc_dbe"), clock)  # GPU 1, at 10 s
    ecc = asyncio.Event()  # the event comes on the loop, from the event thread

    def on_event(event: Event) -> None:
        if event.kind == "ecc":
            ecc.set()

    sampling = SamplingConfig(interval=20.0, slow_interval=600.0)
    source = NvmlSource(pynvml, clock, sampling, on_event)
    await source.start()
    first = await source.collect()
    assert len(_slow_parts(first)) == 8  # every GPU's at start; GPU 1's next turn is minutes away
    await asyncio.wait_for(ecc.wait(), 10.0)
    after = await source.collect()
    again = await source.collect()
    await source.stop()
    assert _slow_parts(after) == ["slow/gpu1"]
    dbe = {
        dict(s.labels)["gpu"]: s.value
        for s in after.slow_samples
        if s.name == m.ECC_ERRORS
        and ("type", "uncorrected") in s.labels
        and ("scope", "volatile") in s.labels
    }
    assert dbe["1"] == 1.0
    assert _slow_parts(again) == []  # then back on its turn


def _on_manual_clock(
    simulate: Simulate, scenario: str, on_event: Callable[[Event], None] = lambda _: None
) -> tuple[NvmlSource, ManualClock]:
    """A source whose slow tier's turn is minutes away, on a clock the test moves: a fault is
    never missed, or seen early, because the machine is busy."""
    clock = ManualClock()
    simulate(load_scenario(scenario), clock)
    sampling = SamplingConfig(interval=1.0, slow_interval=600.0)
    return NvmlSource(pynvml, clock, sampling, on_event), clock


@pytest.mark.parametrize(("xid", "read"), [(43, []), (13, []), (94, ["slow/gpu1"])])
async def test_a_programs_own_xid_does_not_read_the_slow_fields(
    tmp_path: Path, simulate: Simulate, xid: int, read: list[str]
) -> None:
    """XIDs 13 and 43 are a program's own faults: no counter or state of the GPU changes, and
    a job can raise one a second on every GPU, which would read every slow tier every cycle.
    XID 94, a contained memory error, comes with an ECC count: read at once."""
    events: list[Event] = []
    fault = f"{{kind: xid, gpu: 1, at: 2s, code: {xid}}}"
    source, clock = _on_manual_clock(simulate, _two_gpus(tmp_path, fault), events.append)
    await source.start()
    first = await source.collect()
    clock.advance(3.0)
    for _ in range(200):  # the XID comes through the event thread
        await asyncio.sleep(0.05)
        if events:
            break
    after = await source.collect()
    await source.stop()
    assert len(first.slow_read) == 2
    assert [(e.kind, e.data.get("xid")) for e in events] == [("xid", xid)]
    assert [part for part, _ in after.slow_read] == read


async def test_a_gpu_that_answers_again_reads_its_slow_fields_at_once(
    tmp_path: Path, simulate: Simulate
) -> None:
    """Its counters went stale when it failed; they are back in the cycle it answers again,
    not on its turn, which is minutes away here."""
    fault = "{kind: nvml_error, gpu: 1, at: 2s, duration: 10s, error: UNKNOWN}"
    source, clock = _on_manual_clock(simulate, _two_gpus(tmp_path, fault))
    await source.start()
    first = await source.collect()
    clock.advance(4.0)
    failing = await source.collect()
    clock.advance(10.0)
    back = await source.collect()
    clock.advance(1.0)
    again = await source.collect()
    await source.stop()
    assert len(first.slow_read) == 2
    assert (failing.gpus[1].status, failing.slow_read) == (GpuStatus.FAILING, [("slow/gpu1", [])])
    assert back.gpus[1].status == GpuStatus.OK
    assert [part for part, samples in back.slow_read if samples] == ["slow/gpu1"]
    assert again.slow_read == []


async def test_at_the_defaults_each_gpu_reads_its_slow_tier_every_5s_in_turn(
    simulate: Simulate,
) -> None:
    """Each GPU's processes, though, every cycle: a job that starts shows at once."""
    clock = ManualClock()
    library = simulate(load_scenario("healthy"), clock)
    source = NvmlSource(pynvml, clock, SamplingConfig(), lambda _: None)
    await source.start()
    reads: list[list[str]] = []
    for cycle in range(11):
        if cycle == 3:
            library.node.pids.append(os.getpid())  # a job starts on every GPU
        batch = await source.collect()
        reads.append(_slow_parts(batch))
        assert len(_values(batch, m.TEMPERATURE)) == 8  # fast: every GPU, every cycle
        processes = set(_values(batch, m.GPU_PROCESSES).values())
        assert processes == ({1.0} if cycle >= 3 else {0.0}), cycle
        clock.advance(1.0)
    await source.stop()
    assert len(reads[0]) == 8  # the whole node's at start
    per_gpu = collections.Counter(part for parts in reads[1:] for part in parts)
    assert per_gpu == {f"slow/gpu{i}": 2 for i in range(8)}  # then twice each in 10 s
    assert max(len(parts) for parts in reads[1:]) <= 2


async def test_pcie_throughput_is_read_in_each_gpus_lane_on_its_turn_without_the_cycle(
    simulate: Simulate,
) -> None:
    """nvmlDeviceGetPcieThroughput waits out a 20 ms window per direction. On a clock that
    moves only between cycles, a cycle that waited for it would never end: the reads come back
    in later cycles, each GPU's about once per slow interval, the GPUs in turn, and say what
    each GPU moves: GPU 1's peer traffic staged through the host from 60 s, 70% of its link
    each way; the others only their input, one way."""
    clock = ManualClock()
    library = simulate(load_scenario("p2p_disabled"), clock)
    source = NvmlSource(pynvml, clock, SamplingConfig(), lambda _: None)
    await source.start()
    reads: list[list[str]] = []
    for _ in range(90):
        batch = await asyncio.wait_for(source.collect(), 30.0)  # a cycle that waited: hung
        reads.append([part for part, _ in batch.slow_read if part.startswith("pcie/")])
        clock.advance(1.0)
        await asyncio.sleep(0.002)  # the reads' threads answer once the clock has moved
    await source.stop()
    per_gpu = collections.Counter(part for parts in reads[30:] for part in parts)
    assert set(per_gpu) == {f"pcie/gpu{i}" for i in range(8)}
    assert all(9 <= n <= 15 for n in per_gpu.values()), per_gpu  # 60 s at one per 5 +-1 s
    rate = pcie_bytes_per_s(5, 16)
    util = {i: library.node.gpus[i].utilization(clock.now()) for i in range(8)}
    got = {
        (dict(s.labels)["gpu"], dict(s.labels)["direction"]): s.value / rate
        for s in batch.slow_samples
        if s.name == m.PCIE_THROUGHPUT
    }
    assert len(got) == 16
    assert got[("1", "tx")] == pytest.approx(0.7 * util[1], abs=0.05)
    assert got[("1", "rx")] == pytest.approx(0.72 * util[1], abs=0.05)
    assert got[("0", "rx")] == pytest.approx(0.02 * util[0], abs=0.005)
    assert got[("0", "tx")] == pytest.approx(0.002 * util[0], abs=0.001)


class _PcieStuckOnGpu1(SimulatedNvml):
    """A driver whose PCIe throughput call never returns on GPU 1, until `freed`; its other
    calls answer."""

    freed = threading.Event()

    def nvmlDeviceGetPcieThroughput(self, handle: int, counter: int, out: int) -> int:
        if self._whole_gpu(handle).index == 1:
            self.freed.wait(60.0)
        return super().nvmlDeviceGetPcieThroughput(handle, counter, out)


async def test_a_pcie_read_stuck_in_the_driver_makes_its_gpu_unresponsive_until_it_returns(
    simulate: Simulate,
) -> None:
    """As any NVML call stuck past its deadline (60 s and 10 cycles for this one): the thread
    is counted as abandoned, the lane takes no call, the GPU reads as unresponsive and its
    PCIe series go; the other GPUs carry on. Once the call returns, the GPU is read again."""
    clock = ManualClock()
    _PcieStuckOnGpu1.freed.clear()
    simulate(load_scenario("p2p_disabled"), clock, _PcieStuckOnGpu1)
    source = NvmlSource(pynvml, clock, SamplingConfig(), lambda _: None)
    await source.start()
    try:
        for _ in range(75):
            batch = await asyncio.wait_for(source.collect(), 30.0)
            clock.advance(1.0)
            await asyncio.sleep(0.002)
        statuses = [g.status for g in batch.gpus]
        assert statuses[1] == GpuStatus.UNRESPONSIVE and statuses.count(GpuStatus.OK) == 7
        assert _values(batch, m.NVML_ABANDONED_WORKERS) == {"": 1.0}
        pcie = {dict(s.labels)["gpu"] for s in batch.slow_samples if s.name == m.PCIE_THROUGHPUT}
        assert "1" not in pcie and len(pcie) == 7
    finally:
        _PcieStuckOnGpu1.freed.set()
    for _ in range(5):
        batch = await asyncio.wait_for(source.collect(), 30.0)
        clock.advance(1.0)
        await asyncio.sleep(0.01)
    await source.stop()
    assert batch.gpus[1].status == GpuStatus.OK
    assert _values(batch, m.NVML_ABANDONED_WORKERS) == {"": 0.0}


def test_a_kept_field_request_answers_as_pynvmls_own_call(simulate: Simulate) -> None:
    """The request array built once gets, call after call, what pynvml's wrapper returns, and
    the driver's errors raise the same pynvml exceptions."""
    clock = ManualClock()
    scenario = load_scenario("fall_off_bus")
    simulate(scenario, clock)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(scenario.faults[0].gpu)
    requests: list[int | tuple[int, int]] = [
        pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 3),
        (pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 17),
        (215, 2),  # NVLink5 only: NOT_SUPPORTED on an H100
        pynvml.NVML_FI_DEV_MEMORY_TEMP,
    ]
    kept = FieldRequest(pynvml, requests)
    read = FieldValues(pynvml)
    for _ in range(3):
        clock.advance(1.0)
        ours = [(code, value) for code, value, _ in read.entries(kept(handle))]
        theirs = [read.one(v) for v in pynvml.nvmlDeviceGetFieldValues(handle, requests)]
        assert ours == theirs
        assert [r for r, _ in ours] == [0, 0, 0, pynvml.NVML_ERROR_NOT_SUPPORTED, 0]
    clock.advance(scenario.faults[0].at)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetFieldValues(handle, requests)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        kept(handle)


def test_field_values_of_every_value_type_unpack_as_pynvmls_struct_reads_them() -> None:
    array = (pynvml.c_nvmlFieldValue_t * 7)()
    for slot, (kind, member, value) in zip(
        array,
        [
            (0, "dVal", 1.5),
            (1, "uiVal", 7),
            (2, "ulVal", 2**40),
            (3, "ullVal", 2**63 + 5),
            (4, "sllVal", -3),
            (5, "siVal", -2),
        ],
        strict=False,
    ):
        slot.valueType, slot.nvmlReturn = kind, 0
        setattr(slot.value, member, value)
    # An unsigned short (6): pynvml before 12.570 has no name for it in the union.
    array[6].valueType, array[6].nvmlReturn = 6, pynvml.NVML_ERROR_NOT_SUPPORTED
    ctypes.c_uint16.from_buffer(array[6].value).value = 9
    read = FieldValues(pynvml)
    entries = [(code, value) for code, value, _ in read.entries(array)]
    assert entries == [read.one(v) for v in array]
    # Which came in 32 bits or fewer: a wrapping counter of those is left out (PCIe bytes).
    assert [narrow for _, _, narrow in read.entries(array)] == [
        False, True, False, False, False, True, True
    ]  # fmt: skip
    # What pynvml's own struct reads, where it has a name for the member.
    members = ["dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal"]
    assert [v for _, v in entries[:6]] == [
        float(getattr(e.value, n)) for e, n in zip(array[:6], members, strict=True)
    ]
    assert [v for _, v in entries] == [1.5, 7, 2**40, float(2**63 + 5), -3, -2, 9]
    assert [r for r, _ in entries][5:] == [0, pynvml.NVML_ERROR_NOT_SUPPORTED]
