"""The NVML source: one Batch per sampling cycle, every GPU read in parallel with a deadline.

Each GPU reads the slow tier of fields (see gpuwatch.nvml.device) every `slow_interval`, the
GPUs staggered across it so that no cycle reads them all; between reads a GPU's last slow
samples stand. Each GPU's slow tier is its own part of the batch (`Batch.slow_read`), stored on
its own timeline, so its series stay current between reads; so is its PCIe throughput, read
apart in its lane (nvml/pcie_reads.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import cast

from gpuwatch import metrics as m
from gpuwatch.clock import Clock
from gpuwatch.host.processes import ProcessLookup, with_jobs
from gpuwatch.logs import fields as log_fields
from gpuwatch.model import (
    BackendState,
    Batch,
    Event,
    GpuInfo,
    GpuState,
    GpuStatus,
    Sample,
    jobs_text,
)
from gpuwatch.nvml.caller import LaneStuckError, NvmlCaller, NvmlTimeoutError
from gpuwatch.nvml.config import SamplingConfig
from gpuwatch.nvml.cpu_wait import CpuWait
from gpuwatch.nvml.errors import NvmlGpuError, NvmlModule, as_text
from gpuwatch.nvml.events import EventWaiter, describe
from gpuwatch.nvml.opening import open_device
from gpuwatch.nvml.pcie_reads import PcieReads
from gpuwatch.nvml.process_samples import process_samples
from gpuwatch.nvml.watched import INIT_DEADLINE_S, WatchedGpu, init_failure_reason
from gpuwatch.state.inventory import Inventory, missing_samples
from gpuwatch.xid.known import APPLICATION_FAULTS

log = logging.getLogger(__name__)

DRIVER_LANE = "driver"
RETRY_S = 30.0  # how often a down backend or an unopened GPU is tried again
SHUTDOWN_DEADLINE_S = 2.0
# A GPU whose calls miss the cycle's deadline is called unresponsive only once they have been
# late this long (or 2 intervals, if longer); until then its last values stand. At 10 Hz on a
# busy host a call can miss a 100 ms deadline without anything being wrong with the GPU.
UNRESPONSIVE_AFTER_S = 2.0


class NvmlSource:
    name = "nvml"

    def __init__(
        self,
        nvml: NvmlModule,
        clock: Clock,
        sampling: SamplingConfig,
        on_event: Callable[[Event], None],
        inventory: Inventory | None = None,
        *,
        cpu_wait: CpuWait | None = None,
    ) -> None:
        self._nvml = nvml
        self._inventory = inventory
        self._clock = clock
        self._sampling = sampling
        self._on_event = on_event
        self._caller = NvmlCaller(clock, sampling.max_abandoned_workers, cpu_wait)
        self._pcie = PcieReads(nvml, self._caller.call, self._caller.abandon, sampling)
        self._backend = BackendState(up=False, name="nvml", reason="NVML: not started")
        self._gpus: list[WatchedGpu] = []
        self._events = EventWaiter(nvml, self._event_from_thread, clock)
        self._events_started = False
        self._next_init = 0.0
        self._slow_read: list[tuple[str, list[Sample]]] = []  # this cycle's, see Batch
        self._lookup = ProcessLookup()  # one per node: a process often holds several GPUs
        self._initialized = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def backend(self) -> BackendState:
        return self._backend

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._init()

    async def stop(self) -> None:
        await self._pcie.stop()
        if self._events_started:
            await asyncio.to_thread(self._events.stop, 1.0)
        if self._initialized:
            try:
                await self._caller.call(DRIVER_LANE, SHUTDOWN_DEADLINE_S, self._nvml.nvmlShutdown)
            except (self._nvml.NVMLError, NvmlTimeoutError, LaneStuckError) as exc:
                log.warning("nvmlShutdown: %s", exc)
        self._caller.close()

    # -- start-up --------------------------------------------------------------------------
    async def _init(self) -> None:
        nvml, call = self._nvml, self._caller.call
        self._next_init = self._clock.now() + RETRY_S
        try:
            await call(DRIVER_LANE, INIT_DEADLINE_S, nvml.nvmlInit)
            self._initialized = True
            driver = await call(DRIVER_LANE, INIT_DEADLINE_S, nvml.nvmlSystemGetDriverVersion)
            library = await call(DRIVER_LANE, INIT_DEADLINE_S, nvml.nvmlSystemGetNVMLVersion)
            count = await call(DRIVER_LANE, INIT_DEADLINE_S, nvml.nvmlDeviceGetCount)
        except (nvml.NVMLError, NvmlTimeoutError, LaneStuckError) as exc:
            reason = init_failure_reason(nvml, exc)
            if reason != self._backend.reason:
                log.error("GPU backend down: %s", reason)
            self._backend = BackendState(up=False, name="nvml", reason=reason)
            return
        self._backend = BackendState(
            up=True,
            name="nvml",
            driver_version=as_text(driver),
            library_version=as_text(library),
        )
        self._gpus = [
            WatchedGpu(
                i, GpuInfo(i, "", "", "", "", "", 0), None, GpuStatus.UNRESPONSIVE, "not opened yet"
            )
            for i in range(count)
        ]
        await asyncio.gather(*(self._open(g) for g in self._gpus))
        log.info("NVML up: driver=%s gpus=%d", self._backend.driver_version, count)
        self._check_inventory()
        self._watch_events()

    def _watch_events(self) -> None:
        """Every opened GPU's fault events, a GPU opened later included."""
        handles = {g.info.uuid: g.reader.handle for g in self._gpus if g.reader is not None}
        self._events.watch(handles)
        if not self._events_started:
            self._events.start()
            self._events_started = True

    def _check_inventory(self) -> None:
        """Report the GPUs this node had before that the driver no longer lists. Only once
        every listed GPU has opened: one that has not may be one of those it had."""
        if self._inventory is None or any(g.reader is None for g in self._gpus):
            return
        before = {g.uuid for g in self._backend.missing}
        missing = self._inventory.update([g.info for g in self._gpus])
        self._backend = replace(self._backend, missing=missing)
        for gone in missing:
            if gone.uuid in before:
                continue
            message = (
                f"GPU {gone.uuid} (last seen as GPU {gone.index}, serial {gone.serial}) is "
                "missing: the driver no longer lists it"
            )
            log.error("%s", message)
            self._on_event(Event(self._clock.now(), "gpu_missing", None, gone.uuid, message))

    async def _open(self, gpu: WatchedGpu) -> None:
        nvml = self._nvml
        gpu.next_open = self._clock.now() + RETRY_S
        try:
            gpu.reader = await self._caller.call(
                gpu.lane,
                INIT_DEADLINE_S,
                open_device,
                nvml,
                gpu.index,
                self._lookup,
                self._clock.now,
            )
        except nvml.NVMLError_GpuIsLost:  # at start too: a gpu_lost event, as for any loss
            self._transition(gpu, GpuStatus.LOST, "NVML: GPU is lost (fallen off the bus?)")
        except (NvmlTimeoutError, LaneStuckError) as exc:
            gpu.status, gpu.reason = GpuStatus.UNRESPONSIVE, f"opening the GPU: {exc}"
        except nvml.NVMLError as exc:
            gpu.status, gpu.reason = GpuStatus.UNRESPONSIVE, f"opening the GPU: NVML: {exc}"
        else:
            gpu.info = gpu.reader.info
            if gpu.status == GpuStatus.LOST:  # lost when the daemon came: back on the bus now
                self._transition(gpu, GpuStatus.OK, "")
            gpu.status, gpu.reason = GpuStatus.OK, ""
            return
        log.warning(
            "GPU %d cannot be opened: %s", gpu.index, gpu.reason, extra=log_fields(gpu=gpu.index)
        )

    # -- events ----------------------------------------------------------------------------
    def _event_from_thread(self, uuid: str, event_type: int, data: int) -> None:
        if self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._record_event, uuid, event_type, data)
        except RuntimeError:  # the loop closed while the event thread was still stopping
            log.debug(
                "event after shutdown dropped: type 0x%x", event_type, extra=log_fields(uuid=uuid)
            )

    def _record_event(self, uuid: str, event_type: int, data: int) -> None:
        gpu = next((g for g in self._gpus if g.info.uuid == uuid), None)
        index = gpu.index if gpu else None
        kind, message, details = describe(index, event_type, data)
        # Its error counters and states as the fault left them, at once; a program's own fault
        # (XID 13, 31, 43...) changes none of them, and a buggy job can raise one a second on
        # every GPU.
        if gpu is not None and not (kind == "xid" and details.get("xid") in APPLICATION_FAULTS):
            gpu.slow_now = True
        message, details = with_jobs(message, details, gpu.processes if gpu else ())
        log.warning(message, extra=log_fields(gpu=index, uuid=uuid, xid=details.get("xid")))
        self._on_event(Event(self._clock.now(), kind, index, uuid, message, details))

    def _transition(self, gpu: WatchedGpu, status: GpuStatus, reason: str) -> None:
        if status == gpu.status and reason == gpu.reason:
            return
        old = gpu.status
        gpu.status, gpu.reason = status, reason
        if status == old:
            return
        kind = {
            GpuStatus.OK: "gpu_recovered",
            GpuStatus.LOST: "gpu_lost",
            GpuStatus.UNRESPONSIVE: "gpu_unresponsive",
            GpuStatus.FAILING: "gpu_failing",
        }[status]
        message = f"GPU {gpu.index} {status.value}" + (f": {reason}" if reason else "")
        jobs = jobs_text(gpu.processes)
        if jobs and status != GpuStatus.OK:
            message += f", running {jobs}"
        (log.info if status == GpuStatus.OK else log.error)(
            message, extra=log_fields(gpu=gpu.index, uuid=gpu.info.uuid)
        )
        self._on_event(Event(self._clock.now(), kind, gpu.index, gpu.info.uuid, message))

    # -- sampling --------------------------------------------------------------------------
    async def collect(self) -> Batch:
        now = self._clock.now()
        if not self._backend.up and now >= self._next_init:
            await self._init()
        self._slow_read = self._pcie.taken()
        if not self._backend.up:
            for gpu in self._gpus:
                self._drop_slow(gpu)
            samples = [Sample(m.UP, (), 0.0)]
            return Batch(self.name, now, samples, self._backend, [], [], self._slow_read)
        reopened = [g for g in self._gpus if self._open_due(g)]
        if reopened:
            await asyncio.gather(*(self._open(g) for g in reopened))
            self._check_inventory()
            self._watch_events()
        readable = [g for g in self._gpus if g.reader is not None]
        results = await self._caller.call_many(
            self._sampling.deadline,
            [(g.lane, g.reader.read, (self._slow_due(g, now),)) for g in readable if g.reader],
        )
        outcome = dict(zip((g.index for g in readable), results, strict=True))
        per_gpu = [self._sampled(g, outcome.get(g.index)) for g in self._gpus]
        samples = [Sample(m.UP, (), 1.0), *missing_samples(self._backend.missing)]
        slow: list[list[Sample]] = []
        for gpu, gpu_samples in zip(self._gpus, per_gpu, strict=True):
            samples.extend(gpu_samples)
            samples.extend(self._bookkeeping(gpu))
            self._pcie.start_due(gpu, now, len(self._gpus))
            slow += [part for part in (gpu.slow, self._pcie.current(gpu)) if part is not None]
        samples.append(
            Sample(m.NVML_TIMEOUTS, (), float(self._caller.timeouts.get(DRIVER_LANE, 0)))
        )
        samples.append(Sample(m.NVML_ABANDONED_WORKERS, (), float(self._caller.stuck_workers)))
        samples.append(Sample(m.NVML_CPU_WAIT_GRANTED, (), self._caller.stretched_s))
        states = [
            GpuState(g.info, g.status, g.reason, g.processes, g.instances) for g in self._gpus
        ]
        return Batch(
            self.name, self._clock.now(), samples, self._backend, states, slow, self._slow_read
        )

    def _slow_due(self, gpu: WatchedGpu, now: float) -> bool:
        """Whether this cycle reads the GPU's slow tier. First, the whole node's state at
        start: every GPU's in the first cycle at a 1 s interval or slower; faster, spread over
        the first second (64 GPUs' in one 100 ms cycle took longer than the cycle). Then GPU
        i of n reads it (i+1)/n of the way into each slow interval. A GPU a fault event came
        from, or that failed, reads it in every cycle until it comes back, so that the alerts
        on its counters and states (an uncorrectable ECC error, a pending remap) are not a
        slow interval late."""
        interval = self._sampling.interval
        period = self._sampling.slow_interval
        if period <= interval:
            return True
        n = len(self._gpus)
        if gpu.next_slow == 0.0:
            gpu.next_slow = now + max(0.0, 1.0 - interval) * gpu.index / n
        if gpu.slow_now:
            return True  # cleared when a slow tier comes back (_sampled)
        if now < gpu.next_slow - interval / 2:  # half an interval early: ticks jitter
            return False
        if gpu.slow is None:  # its first read: its turns begin
            gpu.next_slow = now + period * (gpu.index + 1) / n
        else:
            gpu.next_slow += period
            if gpu.next_slow < now:  # after a stall: start again from now
                gpu.next_slow = now + period
        return True

    def _open_due(self, gpu: WatchedGpu) -> bool:
        return gpu.reader is None and self._clock.now() >= gpu.next_open

    def _sampled(self, gpu: WatchedGpu, result: object) -> list[Sample]:
        """The GPU's fast tier from its read's result (None: not opened); a slow tier read
        goes to gpu.slow."""
        nvml = self._nvml
        if result is None:
            pass
        elif isinstance(result, nvml.NVMLError_GpuIsLost):
            self._transition(gpu, GpuStatus.LOST, "NVML: GPU is lost (fallen off the bus?)")
        elif isinstance(result, NvmlGpuError):
            self._transition(gpu, GpuStatus.FAILING, str(result))
        elif isinstance(result, NvmlTimeoutError | LaneStuckError):
            late = self._still_within_grace(gpu)
            if late is not None:
                return late
            self._transition(gpu, GpuStatus.UNRESPONSIVE, str(result))
        elif isinstance(result, Exception):  # a bug or an NVML surprise: this GPU only
            log.error(
                "GPU %d: sampling failed",
                gpu.index,
                exc_info=result,
                extra=log_fields(gpu=gpu.index),
            )
            self._transition(gpu, GpuStatus.UNRESPONSIVE, f"sampling failed: {result}")
        else:
            fast, slow = cast(tuple[list[Sample], list[Sample] | None], result)
            memory = self._sampling.process_memory_metrics
            fast += process_samples(gpu.info, gpu.processes, memory)
            gpu.late_since, gpu.last_samples = None, fast
            if slow is not None:
                gpu.slow, gpu.slow_now = slow, False
                self._slow_read.append((gpu.part, gpu.slow))
            self._transition(gpu, GpuStatus.OK, "")
            return fast
        gpu.last_samples = None
        self._drop_slow(gpu)
        return [Sample(m.GPU_UP, gpu.info.labels, 0.0)]

    def _drop_slow(self, gpu: WatchedGpu) -> None:
        """Forget a failed GPU's slow tier; its series go stale at once. It is read again as
        soon as the GPU answers."""
        gpu.slow_now = True
        if gpu.slow is not None:
            gpu.slow = None
            self._slow_read.append((gpu.part, []))
        self._pcie.drop(gpu, self._slow_read)

    def _still_within_grace(self, gpu: WatchedGpu) -> list[Sample] | None:
        """The GPU's last values while its calls have been late for less than the grace."""
        if gpu.status != GpuStatus.OK or gpu.last_samples is None:
            return None
        now = self._clock.now()
        if gpu.late_since is None:
            gpu.late_since = now
        grace = max(UNRESPONSIVE_AFTER_S, 2 * self._sampling.interval)
        return gpu.last_samples if now - gpu.late_since < grace else None

    def _bookkeeping(self, gpu: WatchedGpu) -> list[Sample]:
        """Series that exist whatever state the GPU is in: identity, lost or not, timeouts."""
        info, labels = gpu.info, gpu.info.labels
        out = [
            Sample(m.NVML_TIMEOUTS, labels, float(self._caller.timeouts.get(gpu.lane, 0))),
            Sample(m.GPU_LOST, labels, 1.0 if gpu.status == GpuStatus.LOST else 0.0),
        ]
        if not info.uuid:
            return out
        out.append(
            Sample(
                m.GPU_INFO,
                (
                    *labels,
                    ("model", info.model),
                    ("pci_bus_id", info.pci_bus_id),
                    ("serial", info.serial),
                    ("driver_version", self._backend.driver_version),
                    ("vbios_version", info.vbios_version),
                ),
                1.0,
            )
        )
        return out
