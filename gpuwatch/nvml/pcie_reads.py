"""Each GPU's PCIe throughput, read in the GPU's lane on its own turn while the cycles go on.

The read waits out two 20 ms windows in the driver (nvml/pcie.py): in the cycle's runner,
which reads every GPU one after another, that would be 40 ms per GPU, 2.5 s a cycle at 64.
So each GPU's read is started in its lane's own thread when its turn comes (GPU i of n i/n of
the way into each slow interval, so that reads of many GPUs seldom meet in the driver), and
the cycle that started it does not wait: what has come back joins the next batch as the GPU's
part `pcie/gpuN`, stored on its own timeline.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpuwatch.model import GpuStatus, Sample
from gpuwatch.nvml.caller import LaneStuckError, NvmlTimeoutError
from gpuwatch.nvml.config import SamplingConfig
from gpuwatch.nvml.device import DeviceReader
from gpuwatch.nvml.errors import NvmlModule
from gpuwatch.nvml.pcie import PcieThroughput
from gpuwatch.nvml.watched import WatchedGpu

log = logging.getLogger(__name__)

# A read in flight this long, and over as many cycles, is abandoned as a call past its deadline
# is: its lane takes no call until it returns, so its GPU reads as unresponsive, as one whose
# any other call is stuck in the driver. Far past the 40 ms it takes, and past what a starved
# host stretches the cycle's own calls to: a slow host alone does not make a GPU unresponsive
# through it. The cycles count too because time can pass in one step (a paused VM, a test's
# clock) while nothing had the chance to run: the read is judged on what the cycles saw.
DEADLINE_S = 60.0
DEADLINE_CYCLES = 10
# Each read comes this much of a period early or late, at random: a job whose step time
# divides the period would otherwise be sampled at the same point of every step.
JITTER = 0.2

Part = tuple[str, list[Sample]]  # a batch part: its name, its samples ([]: gone)
# The caller's `call`: fn() in a lane's thread, within a deadline (nvml/caller.py).
LaneCall = Callable[[str, float, Callable[[], list[Sample]]], Awaitable[list[Sample]]]
Abandon = Callable[[str, float], None]  # the caller's `abandon`: a lane's call given up on
NO_DEADLINE_S = 1e9  # the lane call's own: the deadline is judged here, in cycles and time


@dataclass
class _Gpu:
    reader: DeviceReader  # the GPU's reader it was made for: one opened again is another GPU
    throughput: PcieThroughput
    samples: list[Sample] | None = None  # the last read
    next: float = 0.0  # when the next read is due
    reading: asyncio.Task[None] | None = None  # the read in flight
    started: float = 0.0  # when it started
    cycles: int = 0  # cycles it has been in flight


class PcieReads:
    def __init__(
        self,
        nvml: NvmlModule,
        call: LaneCall,
        abandon: Abandon,
        sampling: SamplingConfig,
        seed: int = 0,
    ) -> None:
        self._nvml = nvml
        self._call = call
        self._abandon = abandon
        self._sampling = sampling
        self._random = random.Random(seed)
        self._gpus: dict[int, _Gpu] = {}
        self._back: list[Part] = []  # come back since the last cycle took them
        self._tasks: set[asyncio.Task[None]] = set()

    def taken(self) -> list[Part]:
        """The reads that came back (and the parts dropped) since the last call."""
        back, self._back = self._back, []
        return back

    def current(self, gpu: WatchedGpu) -> list[Sample] | None:
        one = self._gpus.get(gpu.index)
        return one.samples if one is not None and one.reader is gpu.reader else None

    def start_due(self, gpu: WatchedGpu, now: float, count: int) -> None:
        """Start the GPU's read if its turn has come; a read in flight is left to finish."""
        reader = gpu.reader
        if reader is None or gpu.status != GpuStatus.OK:
            return
        one = self._gpus.get(gpu.index)
        if one is None or one.reader is not reader:
            one = self._gpus[gpu.index] = _Gpu(
                reader, PcieThroughput(self._nvml, reader.handle, gpu.info.labels, gpu.index)
            )
        if one.reading is not None:
            self._judge(gpu, one, now)
            return
        if not one.throughput.supported:
            return
        interval = self._sampling.interval
        period = max(self._sampling.slow_interval, interval)
        if one.next == 0.0:
            one.next = now + period * gpu.index / count
        if now < one.next - interval / 2:  # half an interval early: ticks jitter
            return
        one.next += period * (1.0 + self._random.uniform(-JITTER, JITTER))
        if one.next < now:  # after a stall: start again from now
            one.next = now + period
        one.started, one.cycles = now, 0
        one.reading = task = asyncio.create_task(self._read(gpu, one))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _judge(self, gpu: WatchedGpu, one: _Gpu, now: float) -> None:
        """Give up on a read in flight past its deadline: stuck in the driver."""
        one.cycles += 1
        waited = now - one.started
        if one.reading is None or one.cycles < DEADLINE_CYCLES or waited < DEADLINE_S:
            return
        self._abandon(gpu.lane, waited)
        one.reading.cancel()

    async def _read(self, gpu: WatchedGpu, one: _Gpu) -> None:
        try:
            samples = await self._call(gpu.lane, NO_DEADLINE_S, one.throughput.read)
        except (NvmlTimeoutError, LaneStuckError):
            return  # counted with the lane's timeouts; the cycle's reads say what the GPU is
        except Exception:  # a bug or an NVML surprise: this read only
            log.exception("GPU %d: reading PCIe throughput failed", gpu.index)
            return
        finally:
            one.reading = None
        if gpu.reader is not one.reader or gpu.status != GpuStatus.OK:
            return  # failed or opened again meanwhile: its part was dropped
        if samples or one.samples is not None:
            one.samples = samples or None
            self._back.append((part(gpu), samples))

    def drop(self, gpu: WatchedGpu, parts: list[Part]) -> None:
        """Forget a failed GPU's last read, its part emptied in `parts`: its series go stale
        at once."""
        one = self._gpus.get(gpu.index)
        name = part(gpu)
        self._back = [p for p in self._back if p[0] != name]  # come back before it failed
        if one is not None and one.samples is not None:
            one.samples = None
            parts.append((name, []))

    async def stop(self) -> None:
        """Stop waiting: a read in flight finishes in its lane's thread (40 ms) unwaited."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def part(gpu: WatchedGpu) -> str:
    return f"pcie/gpu{gpu.index}"
