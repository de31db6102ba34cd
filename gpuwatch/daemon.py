"""The daemon core: the sampling loop feeding the store, the node's verdict, and its events."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field

from gpuwatch import metrics as m
from gpuwatch.clock import Clock
from gpuwatch.config import Config
from gpuwatch.health import Verdict, active_clock_events, gpu_verdict, health_samples, node_verdict
from gpuwatch.model import Batch, Event, GpuState, Sample
from gpuwatch.source import Source
from gpuwatch.store import Store

log = logging.getLogger(__name__)

STALE_AFTER_INTERVALS = 3
RECENT_EVENTS = 1000


class EventLog:
    """Recent events, newest last. Sources publish into it from the event loop."""

    def __init__(self, size: int = RECENT_EVENTS) -> None:
        self.recent: deque[Event] = deque(maxlen=size)

    def publish(self, event: Event) -> None:
        self.recent.append(event)


@dataclass
class NodeView:
    """What the API and dashboards show of the node, refreshed every cycle."""

    batch: Batch | None = None
    gpu_verdicts: dict[int, Verdict] = field(default_factory=dict)
    node_verdict: Verdict | None = None


class Daemon:
    def __init__(self, config: Config, clock: Clock, source: Source, events: EventLog) -> None:
        self.config = config
        self.clock = clock
        self.source = source
        self.store = Store(config.store.retention)
        self.view = NodeView()
        self.events = events
        self.started_at = clock.now()
        self.last_cycle_end: float | None = None
        self.last_cycle_duration = 0.0
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        await self.source.start()
        await self.sample_once()
        self._task = asyncio.create_task(self._loop(), name="sampling")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.source.stop()

    # -- sampling -------------------------------------------------------------------------
    async def _loop(self) -> None:
        interval = self.config.sampling.interval
        next_tick = self.clock.now() + interval
        while True:
            await self.clock.sleep(next_tick - self.clock.now())
            try:
                await self.sample_once()
            except Exception:  # the loop must outlive any one bad cycle
                log.exception("sampling cycle failed")
            next_tick += interval
            now = self.clock.now()
            if next_tick < now:  # overran: skip the missed ticks rather than bunching them
                missed = int((now - next_tick) / interval) + 1
                next_tick += missed * interval

    async def sample_once(self) -> None:
        started = self.clock.now()
        batch = await self.source.collect()
        ended = self.clock.now()
        self.last_cycle_duration = ended - started
        self.last_cycle_end = ended
        gpu_verdicts, verdict = self._judge(batch.gpus, batch.samples)
        self.view = NodeView(batch, gpu_verdicts, verdict)
        samples = [
            *batch.samples,
            *health_samples(batch.gpus, gpu_verdicts, verdict),
            Sample(m.SAMPLE_DURATION, (), self.last_cycle_duration),
            Sample(m.LAST_SAMPLE_TIMESTAMP, (), ended),
            Sample(m.STORE_SERIES, (), float(len(self.store))),
        ]
        self.store.ingest(self.source.name, batch.time, samples)

    def _judge(
        self, gpus: list[GpuState], samples: list[Sample]
    ) -> tuple[dict[int, Verdict], Verdict]:
        events = active_clock_events(samples)
        verdicts = {g.info.index: gpu_verdict(g, events.get(g.info.uuid, set())) for g in gpus}
        return verdicts, node_verdict(self.source.backend, verdicts)

    def sampling_problem(self) -> str:
        """Empty when sampling is current; otherwise why it is not."""
        limit = STALE_AFTER_INTERVALS * self.config.sampling.interval
        if self.last_cycle_end is None:
            return "no sample taken yet"
        age = self.clock.now() - self.last_cycle_end
        if age > limit:
            return f"last sample is {age:.1f}s old (more than {STALE_AFTER_INTERVALS} intervals)"
        if self._task is not None and self._task.done():
            return "the sampling loop has stopped"
        return ""
