"""The daemon core: the sampling loop feeding the store, the node's verdict, and its events."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Protocol

from gpuwatch import metrics as m
from gpuwatch.clock import Clock, wait_event
from gpuwatch.config import Config
from gpuwatch.health.acks import AckStore, acknowledgeable
from gpuwatch.health.judge import HealthJudge
from gpuwatch.health.own import state_causes
from gpuwatch.health.raised import RaisedCause, raised_causes
from gpuwatch.health.verdict import Cause, Verdict, health_samples, with_sampling_problem
from gpuwatch.health.view import NodeView
from gpuwatch.kernel.gpus import GpuDirectory
from gpuwatch.model import BackendState, Batch, Event, Sample
from gpuwatch.notify.message import GpuIdentity
from gpuwatch.notify.notifier import Notifier
from gpuwatch.push.jobs import JobInputs
from gpuwatch.rules.engine import RuleEngine
from gpuwatch.rules.outgoing import alerts_to_send, firing_alerts
from gpuwatch.source import Collector, Source, Watcher
from gpuwatch.state.journal import Journal
from gpuwatch.state.statedir import StateProblems
from gpuwatch.store.tsdb import Store
from gpuwatch.xid.counter import XidCounter, xid_history

log = logging.getLogger(__name__)

STALE_AFTER_INTERVALS = 3
RECENT_EVENTS = 1000
# The share of the sampling deadline the GPUs are read alone before the host's files are
# read beside them (see sample_once).
GPUS_ALONE = 0.1


# Events that make the daemon sample and evaluate its rules at once, not at the next tick.
URGENT_EVENT_KINDS = frozenset({"xid", "ecc", "memory_retirement", "recovery_action",
                                "gpu_lost", "gpu_unresponsive", "preemption"})  # fmt: skip
RESTORE_LIMIT = 1_000_000  # XIDs restored from the journal at start, at most


class AckError(Exception):
    """An acknowledgement refused: one that names no current cause (404; the message says what
    there is), or a cause that cannot be acknowledged (409)."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


class EventLog:
    """Recent events, newest last. Sources publish into it from the event loop."""

    def __init__(self, size: int = RECENT_EVENTS) -> None:
        self.recent: deque[Event] = deque(maxlen=size)
        self.listeners: list[Callable[[Event], None]] = []

    def publish(self, event: Event) -> None:
        self.recent.append(event)
        for listener in self.listeners:
            listener(event)


class CycleOutput(Protocol):
    """What acts on each finished cycle's verdict: the drainer, job reports, the verdict file,
    the state directory's upkeep. Called on the loop after the cycle; cheap, or it hands the
    work to a task of its own."""

    def after_cycle(self, now: float, view: NodeView) -> None: ...


class Daemon:
    def __init__(
        self,
        config: Config,
        clock: Clock,
        source: Source,
        events: EventLog,
        *,
        store: Store,
        jobs: JobInputs,
        rules: RuleEngine | None = None,
        journal: Journal | None = None,
        acks: AckStore | None = None,
        notifier: Notifier | None = None,
        problems: StateProblems | None = None,
        collectors: Sequence[Collector] = (),
        watchers: Sequence[Watcher] = (),
        outputs: Sequence[CycleOutput] = (),
        event_listeners: Sequence[Callable[[Event], None]] = (),
        gpus: GpuDirectory | None = None,
    ) -> None:
        """`store` is shared with the rules and `jobs` with the push sockets; `outputs` act on
        each cycle's view, in order; `event_listeners` hear each event after the journal and
        the daemon itself."""
        self.config = config
        self.clock = clock
        self.source = source
        self.store = store
        self.rules = rules
        self.journal = journal
        self.notifier = notifier
        self.problems = problems if problems is not None else StateProblems(None)
        self.collectors = collectors  # components' own metrics, gathered each cycle
        self.watchers = watchers
        self.outputs = outputs  # in order, after each cycle
        # Which GPU sits at which PCI address, for the watchers; refreshed every cycle.
        self.gpus = gpus if gpus is not None else GpuDirectory()
        if journal is not None:
            # First: held by the journal before the others act on it, on disk as the turn ends.
            events.listeners.append(journal.record)
        self.jobs = jobs
        self.judge = HealthJudge(acks if acks is not None else AckStore(None))
        self.xids = XidCounter()
        self._raised: list[RaisedCause] = []  # by the firing alerts of this cycle's evaluation
        self._urgent = asyncio.Event()
        self._evaluate_everything = False
        events.listeners.append(self._on_event)
        events.listeners.extend(event_listeners)
        self.view = NodeView()
        self.events = events
        self.started_at = clock.now()
        # Readers that come and go (a dashboard's event stream), told after each cycle.
        self.cycle_listeners: list[Callable[[float], None]] = []
        self.last_cycle_end: float | None = None
        self.last_cycle_duration = 0.0
        self.cycles = 0  # sampling cycles completed
        self.overruns = 0  # ticks skipped because a cycle ran past them
        self._task: asyncio.Task[None] | None = None
        self._started: list[Source | Watcher] = []  # in the order start started them

    def apply(self, config: Config) -> None:
        """A reload's step for the daemon: the new config (the reloader has checked the files,
        and the rules and the notifier have applied their parts)."""
        self.config = config

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self, ticks: bool = True) -> None:
        """Restore, open the source, sample once, start the watchers, and (with `ticks`)
        sample on every tick; without, whoever started it calls sample_once (a test stepping
        a manual clock, which a second sampler would race)."""
        self.restore_xids()
        self._started.append(self.source)  # its stop undoes what of its start got done
        await self.source.start()
        # The first cycle lists the GPUs, so what the watchers then follow finds its GPU; it
        # already has what they kept from before (the kernel log's counts this boot).
        await self.sample_once()
        for watcher in self.watchers:
            self._started.append(watcher)
            await watcher.start()
        if ticks:
            self._task = asyncio.create_task(self._loop(), name="sampling")

    async def stop(self) -> None:
        """Undo what start did, also when it failed part of the way: the loop, then each
        watcher started and the source, the last started first."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])  # its end, without taking a cancel of our own
        while self._started:
            await self._started.pop().stop()

    def restore_xids(self) -> None:
        """This boot's XIDs, from the journal: counts, verdicts and the counters' recent
        history carry over a restart, so rules neither forget an XID nor see an old one anew."""
        if self.journal is None:
            return
        events = self.journal.events(0.0, RESTORE_LIMIT, kind="xid", this_boot=True)
        for event in events:
            self._count_xid(event)
        now = self.clock.now()
        for t, samples in xid_history(events, now, now - self.config.store.retention):
            self.store.ingest(self.source.name, t, samples)

    def _count_xid(self, event: Event) -> None:
        code = event.data.get("xid")
        if event.uuid and isinstance(code, int):
            counted_as = self.xids.record(event.uuid, code)
            self.judge.record_xid(event.uuid, event.time, counted_as)

    def _on_event(self, event: Event) -> None:
        if event.kind == "xid":
            self._count_xid(event)
        if event.kind in URGENT_EVENT_KINDS:
            self._evaluate_everything = True
            self._urgent.set()

    async def _wait_for_tick(self, seconds: float) -> bool:
        """Sleep until the next tick; True when an urgent event cut the sleep short."""
        if self._urgent.is_set():
            return True
        return await wait_event(self.clock, self._urgent, seconds)

    # -- sampling -------------------------------------------------------------------------
    async def _loop(self) -> None:
        interval = self.config.sampling.interval
        next_tick = self.clock.now() + interval
        while True:
            urgent = await self._wait_for_tick(next_tick - self.clock.now())
            self._urgent.clear()
            try:
                await self.sample_once()
            except Exception:  # the loop must outlive any one bad cycle
                log.exception("sampling cycle failed")
            if urgent:
                continue  # an extra cycle; the regular ticks keep their schedule
            next_tick += interval
            now = self.clock.now()
            if next_tick < now:  # overran: skip the missed ticks rather than bunching them
                missed = int((now - next_tick) / interval) + 1
                next_tick += missed * interval
                self.overruns += missed

    async def sample_once(self) -> None:
        """One cycle, in the order data flows: the sources' batch into the store, the rules
        over it, the verdict from the batch and this evaluation's firing alerts, the verdict
        into the store, and then what acts on it."""
        batch, watched = await self._collect()
        jobs = await self.jobs.collect(self.last_cycle_end or batch.time)
        self._ingest(batch, watched, jobs)
        await self._evaluate(batch)
        self._judge(batch, jobs)
        self._notify(batch)
        for output in self.outputs:
            output.after_cycle(self.last_cycle_end or batch.time, self.view)
        for listener in self.cycle_listeners:
            listener(self.last_cycle_end or batch.time)

    async def _collect(self) -> tuple[Batch, list[list[Sample] | None]]:
        """The GPUs' batch and each watcher's read."""
        started = self.clock.now()
        # The host's files are read once the GPUs have been: a worker thread reading files
        # while the NVML runner calls the library made the two hand the interpreter lock back
        # and forth at every read and every call (500-900 futex calls a second at 8 GPUs,
        # 30 once the files waited; strace -f -c). GPUs that take longer than a tenth of the
        # deadline (a hung call) are waited for beside the files, so a hang in both costs a
        # cycle little more than a hang in one.
        collecting = asyncio.ensure_future(self.source.collect())
        try:
            with contextlib.suppress(TimeoutError):
                alone = self.config.sampling.deadline * GPUS_ALONE
                await self.clock.wait_for(asyncio.shield(collecting), alone)
            reads = [asyncio.ensure_future(self._read(w)) for w in self.watchers]
            batch = await collecting
        finally:
            collecting.cancel()  # none once it is done; a cancelled cycle takes it along
        watched = [await read for read in reads]
        self.gpus.update(batch.gpus, batch.backend.missing, batch.backend.up)
        ended = self.clock.now()
        self.last_cycle_duration = ended - started
        self.last_cycle_end = ended
        self.cycles += 1
        return batch, watched

    def _ingest(self, batch: Batch, watched: list[list[Sample] | None], jobs: list[Sample]) -> None:
        samples = [
            *batch.samples,
            *self.xids.samples(batch.gpus),
            *jobs,
            Sample(m.SAMPLE_DURATION, (), self.last_cycle_duration),
            Sample(m.LAST_SAMPLE_TIMESTAMP, (), self.last_cycle_end or batch.time),
            Sample(m.SAMPLES, (), float(self.cycles)),
            Sample(m.SAMPLING_OVERRUNS, (), float(self.overruns)),
            Sample(m.STORE_SERIES, (), float(len(self.store))),
            Sample(m.BUILD_INFO, m.build_labels(), 1.0),
            *chain.from_iterable(c.collect() for c in self.collectors),
        ]
        self.store.ingest(self.source.name, batch.time, samples)
        for part, part_samples in batch.slow_read:  # own timelines: current between reads
            self.store.ingest(f"{self.source.name}/{part}", batch.time, part_samples)
        for watcher, read in zip(self.watchers, watched, strict=True):
            if read is not None:
                self.store.ingest(watcher.name, batch.time, read)

    async def _evaluate(self, batch: Batch) -> None:
        """The rules over what was just ingested; their firing alerts' causes for the verdict."""
        if self.rules is None:
            return
        everything, self._evaluate_everything = self._evaluate_everything, False
        blind = not batch.backend.up  # what the GPUs' alerts read went with it
        transitions = await self.rules.evaluate_off_loop(self.clock.now(), everything, blind)
        for transition in transitions:
            self.events.publish(transition.as_event())
        self._raised = raised_causes(firing_alerts(self.rules.alerting_rules()))

    def _judge(self, batch: Batch, jobs: list[Sample]) -> None:
        """The verdict per GPU and node, kept for readers and stored on its own timeline."""
        gpu_verdicts, verdict = self.judge.judge(
            self.last_cycle_end or batch.time,
            self.source.backend,
            batch.gpus,
            batch.samples,
            slow=batch.slow,
            own=state_causes(self.problems),
            raised=self._raised,
        )
        self.view = NodeView(batch, gpu_verdicts, verdict, jobs)
        samples = health_samples(batch.gpus, gpu_verdicts, verdict)
        self.store.ingest(f"{self.source.name}/verdict", batch.time, samples)

    def _notify(self, batch: Batch) -> None:
        if self.notifier is None or self.rules is None:
            return
        identities = {
            str(g.info.index): GpuIdentity(g.info.model, g.info.serial, g.info.uuid, g.jobs)
            for g in batch.gpus
        }
        outgoing = alerts_to_send(self.rules.alerting_rules(), self.notifier.node)
        self.notifier.update(self.clock.now(), outgoing, identities)

    @staticmethod
    async def _read(watcher: Watcher) -> list[Sample] | None:
        try:
            return await watcher.read()
        except Exception:  # one watcher's bug must not cost the cycle
            log.exception("reading %s failed", watcher.name)
            return None

    def acknowledge(self, gpu: str, key: str, note: str) -> tuple[str, Cause]:
        """Acknowledge a current cause of GPU `gpu` (index or UUID; "node" for the node's own).
        Returns (uuid, cause); raises AckError naming the causes there are."""
        view = self.view
        index: int | None = None
        uuid = ""
        causes: tuple[Cause, ...] = ()
        if gpu == "node":  # the node's own: missing GPUs, state files, alerts naming no GPU
            causes = self.judge.node_causes
        else:
            states = view.batch.gpus if view.batch else []
            found = next((g for g in states if gpu in (str(g.info.index), g.info.uuid)), None)
            if found is None:
                raise AckError(f"no GPU {gpu!r} on this node")
            index, uuid = found.info.index, found.info.uuid
            verdict = view.gpu_verdicts.get(index)
            causes = verdict.causes if verdict else ()
        cause = next((c for c in causes if c.key == key), None)
        where = "the node" if gpu == "node" else f"GPU {gpu}"
        if cause is None:
            keys = ", ".join(c.key for c in causes) or "none"
            raise AckError(f"{where} has no current cause {key!r}; its causes: {keys}")
        if not acknowledgeable(key):
            raise AckError(
                f"{cause.reason}: {key} ends by itself once the GPU answers again (after a "
                "reset or a reboot) and cannot be acknowledged",
                status=409,
            )
        self.judge.acks.add(uuid, cause, self.clock.now(), note)
        message = f"acknowledged: {cause.reason}" + (f" ({note})" if note else "")
        self.events.publish(
            Event(
                self.clock.now(),
                "acknowledged",
                index,
                uuid or None,
                message,
                {"cause": key, "note": note},
            )
        )
        self._urgent.set()  # show the new verdict now
        return uuid, cause

    @property
    def backend(self) -> BackendState:
        return self.source.backend

    def node_verdict_now(self) -> tuple[Verdict | None, str]:
        """The node's verdict as of now, and what keeps sampling from being current (empty
        when nothing does): the last cycle's verdict, unhealthy too while sampling is not
        current (a wedged loop judges nothing, so no cycle could say it)."""
        problem = self.sampling_problem()
        verdict = self.view.node_verdict
        return verdict and with_sampling_problem(verdict, problem), problem

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
