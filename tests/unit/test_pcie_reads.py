"""PCIe throughput reads on their turns, through a lane call the test answers: when they start,
what a GPU that fails meanwhile keeps of them, and what a read that never answers leaves."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pynvml
import pytest

from gpuwatch import metrics as m
from gpuwatch.model import GpuInfo, GpuStatus, Sample
from gpuwatch.nvml.caller import NvmlTimeoutError
from gpuwatch.nvml.config import SamplingConfig
from gpuwatch.nvml.pcie_reads import JITTER, PcieReads
from gpuwatch.nvml.watched import WatchedGpu


class _Reader:
    """What the reads take of a GPU's reader: its handle."""

    handle = object()


class Lane:
    """The lane call: each read waits for the test to answer it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, asyncio.Future[list[Sample]]]] = []
        self.abandoned: list[tuple[str, float]] = []

    def abandon(self, lane: str, waited: float) -> None:
        self.abandoned.append((lane, waited))

    async def __call__(
        self, lane: str, deadline: float, fn: Callable[[], list[Sample]]
    ) -> list[Sample]:
        answer: asyncio.Future[list[Sample]] = asyncio.get_running_loop().create_future()
        self.calls.append((lane, answer))
        return await answer


def gpu(index: int) -> WatchedGpu:
    info = GpuInfo(index, f"GPU-{index}", "H100", "", "", "", 0)
    return WatchedGpu(index, info, _Reader(), GpuStatus.OK)  # type: ignore[arg-type]


def throughput(index: int, value: float) -> list[Sample]:
    labels = (("gpu", str(index)), ("uuid", f"GPU-{index}"), ("direction", "rx"))
    return [Sample(m.PCIE_THROUGHPUT, labels, value)]


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_read_back_in_the_cycle_its_gpu_fails_is_never_stored() -> None:
    """The read answers while the cycle waits on its reads, and the same cycle finds the
    GPU failed: the part is emptied, and the read does not come back in the next batch."""
    lane = Lane()
    reads = PcieReads(pynvml, lane, lane.abandon, SamplingConfig())
    one = gpu(0)
    reads.start_due(one, 100.0, 1)
    await settle()
    [(_, answer)] = lane.calls
    answer.set_result(throughput(0, 5e9))
    await settle()
    assert reads.current(one) == throughput(0, 5e9)
    one.status = GpuStatus.FAILING  # found failing by the cycle's own reads
    parts: list[tuple[str, list[Sample]]] = []
    reads.drop(one, parts)
    assert parts == [("pcie/gpu0", [])]
    assert reads.taken() == []
    assert reads.current(one) is None
    await reads.stop()


async def test_reads_come_in_turn_a_period_apart_give_or_take_the_jitter() -> None:
    """Two GPUs, a 5 s period: GPU 1 starts half a period after GPU 0; each next read comes
    4-6 s after the last, never on a fixed grid, and never while one is in flight."""
    lane = Lane()
    reads = PcieReads(pynvml, lane, lane.abandon, SamplingConfig(interval=0.1, slow_interval=5.0))
    gpus = [gpu(0), gpu(1)]
    started: dict[int, list[float]] = {0: [], 1: []}
    t = 1000.0
    while t < 1100.0:
        for g in gpus:
            before = len(lane.calls)
            reads.start_due(g, t, 2)
            await settle()
            if len(lane.calls) > before:
                started[g.index].append(t)
        for _, answer in lane.calls:
            if not answer.done():
                answer.set_result([])
        await settle()
        t = round(t + 0.1, 1)
    assert started[0][0] == 1000.0 and started[1][0] == 1002.5
    for times in started.values():
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(5.0 * (1 - JITTER) - 0.1 <= g <= 5.0 * (1 + JITTER) + 0.1 for g in gaps)
        assert len({round(g, 1) for g in gaps}) > 3
    lane.calls.clear()
    reads.start_due(gpus[0], t + 10.0, 2)  # one in flight: no other
    reads.start_due(gpus[0], t + 20.0, 2)
    await settle()
    assert len(lane.calls) == 1
    await reads.stop()


@pytest.mark.parametrize("error", [NvmlTimeoutError("late"), RuntimeError("a bug")])
async def test_a_read_that_fails_keeps_nothing_and_the_next_turn_reads_again(
    error: Exception,
) -> None:
    lane = Lane()
    reads = PcieReads(pynvml, lane, lane.abandon, SamplingConfig())
    one = gpu(0)
    reads.start_due(one, 100.0, 1)
    await settle()
    lane.calls[0][1].set_exception(error)
    await settle()
    assert reads.current(one) is None and reads.taken() == []
    reads.start_due(one, 110.0, 1)
    await settle()
    assert len(lane.calls) == 2
    await reads.stop()


async def test_a_read_in_flight_is_given_up_on_after_a_minute_and_ten_cycles() -> None:
    """Stuck in the driver: past 60 s and 10 cycles, its lane's call is abandoned (the lane
    then takes no call until it returns). Five minutes passing in one cycle (a paused VM)
    is not enough: the read had no chance to run."""
    lane = Lane()
    reads = PcieReads(pynvml, lane, lane.abandon, SamplingConfig())
    one = gpu(0)
    reads.start_due(one, 100.0, 1)
    await settle()
    assert len(lane.calls) == 1
    reads.start_due(one, 400.0, 1)  # 300 s in one step
    assert lane.abandoned == []
    for t in range(401, 409):  # nine cycles in all, 308 s
        reads.start_due(one, float(t), 1)
    assert lane.abandoned == []
    reads.start_due(one, 409.0, 1)
    await settle()
    assert lane.abandoned == [("gpu0", 309.0)]
    reads.start_due(one, 410.0, 1)  # the next turn asks again (the caller refuses a stuck lane)
    await settle()
    assert len(lane.calls) == 2
    await reads.stop()
