"""Which jobs ran on which GPUs, and what happened to those GPUs meanwhile: the job-end report.

Each cycle the tracker sees every GPU's processes and the jobs they belong to (their cgroup:
Slurm job, pod, container). For each job and each of its GPUs it keeps the counters at the
job's first sight and at its last (ECC errors, remapped rows, retired pages), the seconds each
clock-event reason held the clocks down, the peak of the memory in use, how busy the GPU was on
average and how long it was busy under half the time (a job waiting on its input), the NVLink
bytes it moved and its mean PCIe throughput, the checkpoints the job said it wrote
(`train_checkpoints_total`, from gpuwatch.client's checkpointed(), on the GPU the push was
attributed to), and the events that came while the job was on the GPU: XIDs, ECC and
memory-retirement events, a lost GPU, and alerts (an alert a job's own metrics raise,
TrainingLossNaN say, names the GPU the kernel says its sender holds: push/attribution.py).
A job whose processes have left every GPU for `ENDED_AFTER_S` has ended: its report is
written then (again, whole, if the job comes back: a new step, a restarted rank);
`report(job_id)` gives one at any time (Slurm's Epilog asks as the job ends).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpuwatch import metrics as m
from gpuwatch.model import Batch, Event, GpuState, Labels, PerPart, Sample

log = logging.getLogger(__name__)

ENDED_AFTER_S = 10.0  # processes gone this long: the job has ended (not a restart of a rank)
MAX_ACTIVE_JOBS = 1024
MAX_ENDED_JOBS = 128  # kept for `gpuwatch job-report` after the end
MAX_EVENTS_PER_GPU = 100
MAX_ADVICE_PER_JOB = 16
MAX_GAP_S = 5.0  # a longer gap between cycles is not counted as throttled time
COUNTERS = (m.ECC_ERRORS, m.REMAPPED_ROWS, m.ROW_REMAP_PENDING, m.ROW_REMAP_FAILED,
            m.RETIRED_PAGES)  # fmt: skip
EVENT_KINDS = frozenset({"xid", "ecc", "memory_retirement", "gpu_lost", "recovery_action"})
STARVED_BELOW = 0.5  # utilization under which a job's GPU waits more than it computes
MAX_CHECKPOINT_SERIES = 64  # a job's checkpoint counts followed, one per pushing rank
CHECKPOINTS = "train_checkpoints_total"
Traffic = tuple[str, str, str]  # a byte counter: link kind (nvlink), direction, link


@dataclass
class GpuRecord:
    index: int
    uuid: str
    first: dict[str, float] = field(default_factory=dict)  # counter key -> value at start
    last: dict[str, float] = field(default_factory=dict)
    throttled: dict[str, float] = field(default_factory=dict)  # reason -> seconds
    events: list[Event] = field(default_factory=list)
    dropped: int = 0  # events past MAX_EVENTS_PER_GPU
    memory_peak: float | None = None  # bytes in use at most, while the job was on the GPU
    memory_total: float | None = None
    seconds: float = 0.0  # time the job was on the GPU, counted between cycles
    busy_seconds: float = 0.0  # of that, the GPU's utilization times the time
    starved_seconds: float = 0.0  # of that, time the GPU was busy under STARVED_BELOW
    # Byte counters by (link kind, direction, link number): (time, value) first and last.
    traffic_first: dict[Traffic, tuple[float, float]] = field(default_factory=dict)
    traffic_last: dict[Traffic, tuple[float, float]] = field(default_factory=dict)
    # PCIe throughput by direction, times the seconds it stood, and those seconds.
    pcie_bytes: dict[str, float] = field(default_factory=dict)
    pcie_seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class JobRecord:
    kind: str
    job_id: str
    user: str
    start: float
    last_seen: float
    gpus: dict[str, GpuRecord] = field(default_factory=dict)  # uuid ->
    ended: bool = False
    advised: list[Event] = field(default_factory=list)  # told to checkpoint, while it ran
    # For each advice, when one of its checkpoint counts next grew (None: not yet).
    checkpoint_after: list[float | None] = field(default_factory=list)
    checkpoints: dict[Labels, float] = field(default_factory=dict)  # series -> count last seen


def _counter_key(sample: Sample) -> str:
    rest = ",".join(f"{k}={v}" for k, v in sample.labels if k not in ("gpu", "uuid"))
    return f"{sample.name}{{{rest}}}" if rest else sample.name


class JobTracker:
    def __init__(self, on_end: Callable[[JobRecord], None]) -> None:
        self.on_end = on_end  # writes the report of a job that has ended
        self.active: dict[str, JobRecord] = {}
        self.ended: OrderedDict[str, JobRecord] = OrderedDict()
        self._on_gpu: dict[str, list[JobRecord]] = {}  # uuid -> the jobs on it last cycle
        self._index: dict[int, str] = {}  # GPU index -> uuid, last cycle
        self._last_cycle: float | None = None
        self._slow_seen = PerPart(_seen_by_gpu)  # the slow tier's, made once per read

    def observe(self, now: float, batch: Batch | None, pushed: Iterable[Sample] = ()) -> None:
        """One cycle: which jobs are where, their GPUs' counters and clock reasons, and the
        checkpoint counts the jobs pushed."""
        if batch is None:
            return
        # Only a node running jobs needs its samples looked through (and without copying).
        busy = any(p.job_id for g in batch.gpus for p in g.processes)
        seen: dict[str, list[_Seen]] = {}
        for found in (_seen_by_gpu(batch.samples), *self._slow_seen(batch.slow)) if busy else ():
            for uuid, one in found.items():
                seen.setdefault(uuid, []).append(one)
        gap = 0.0 if self._last_cycle is None else min(now - self._last_cycle, MAX_GAP_S)
        self._last_cycle = now
        self._index = {g.info.index: g.info.uuid for g in batch.gpus}
        self._on_gpu = {}
        for gpu in batch.gpus:
            for record in self._jobs_on(gpu, now):
                self._update(record, gpu, seen.get(gpu.info.uuid, []), gap, now)
                self._on_gpu.setdefault(gpu.info.uuid, []).append(record)
        self._count_checkpoints(now, pushed)
        for key, record in list(self.active.items()):
            if now - record.last_seen >= ENDED_AFTER_S:
                del self.active[key]
                record.ended = True
                self.ended.pop(key, None)
                self.ended[key] = record  # the newest last: the oldest go first
                while len(self.ended) > MAX_ENDED_JOBS:
                    self.ended.popitem(last=False)
                self.on_end(record)

    def on_event(self, event: Event) -> None:
        """An event for the jobs on its GPU (an alert, only as it fires); checkpoint advice
        for every job running."""
        if event.kind == "checkpoint_advice":
            for record in self.active.values():
                if len(record.advised) < MAX_ADVICE_PER_JOB:
                    record.advised.append(event)
                    record.checkpoint_after.append(None)
            return
        if event.kind not in EVENT_KINDS and not (
            event.kind == "alert" and event.data.get("state") == "firing"
        ):
            return
        uuid = event.uuid or (self._index.get(event.gpu) if event.gpu is not None else None)
        for record in self._on_gpu.get(uuid or "", []):
            gpu = record.gpus[uuid or ""]
            if len(gpu.events) < MAX_EVENTS_PER_GPU:
                gpu.events.append(event)
            else:
                gpu.dropped += 1

    def _count_checkpoints(self, now: float, pushed: Iterable[Sample]) -> None:
        """The checkpoint counts a job's ranks push, each on the GPU the kernel attributed its
        push to (push/attribution.py). A count that grew since the last cycle is a checkpoint
        now, after any advice given before this cycle. gpuwatch.client sends a count from the
        first checkpoint on, so a count that appears at 1 for a job already seen is that
        checkpoint; any other first value is where the count starts (a daemon started mid-job,
        a rank that pushed late). A GPU two jobs share cannot say whose count it is: it counts
        for neither."""
        for sample in pushed:
            if sample.name != CHECKPOINTS:
                continue
            on_gpu = self._on_gpu.get(dict(sample.labels).get("uuid", ""), [])
            if len(on_gpu) != 1:
                continue
            [record] = on_gpu
            before = record.checkpoints.get(sample.labels)
            if before is None:
                if len(record.checkpoints) >= MAX_CHECKPOINT_SERIES:
                    continue
                first = sample.value == 1.0 and record.start < now
                before = 0.0 if first else sample.value
            record.checkpoints[sample.labels] = sample.value
            if sample.value <= before:  # no checkpoint since, or a rank restarted from 0
                continue
            for i, advice in enumerate(record.advised):
                if record.checkpoint_after[i] is None and advice.time < now:
                    record.checkpoint_after[i] = now

    def find(self, job_id: str) -> JobRecord | None:
        """The running job, else the most recent ended one, with this id."""
        for records in (self.active.values(), reversed(self.ended.values())):
            for record in records:
                if record.job_id == job_id:
                    return record
        return None

    def _jobs_on(self, gpu: GpuState, now: float) -> Iterable[JobRecord]:
        seen: set[str] = set()
        for process in gpu.processes:
            if not process.job_id or process.job_id in seen:
                continue
            seen.add(process.job_id)
            key = f"{process.job_kind}:{process.job_id}"
            record = self.active.get(key)
            if record is None and key in self.ended:  # back (a new step, a restarted rank)
                record = self.active[key] = self.ended.pop(key)
                record.ended = False
            if record is None:
                if len(self.active) >= MAX_ACTIVE_JOBS:
                    continue
                record = self.active[key] = JobRecord(
                    process.job_kind, process.job_id, process.user, now, now
                )
            record.last_seen = now
            yield record

    @staticmethod
    def _update(
        record: JobRecord, gpu: GpuState, seen: list[_Seen], gap: float, now: float
    ) -> None:
        uuid = gpu.info.uuid
        entry = record.gpus.get(uuid)
        if entry is None:
            entry = record.gpus[uuid] = GpuRecord(gpu.info.index, uuid)
            gap = 0.0  # its first cycle on this GPU: nothing to count yet
        for one in seen:
            for key, value in one.counters:
                entry.first.setdefault(key, value)
                entry.last[key] = value
            if one.memory_used is not None:
                peak = entry.memory_peak
                entry.memory_peak = one.memory_used if peak is None else max(peak, one.memory_used)
            if one.memory_total is not None:
                entry.memory_total = one.memory_total
            for counter, value in one.traffic.items():
                entry.traffic_first.setdefault(counter, (now, value))
                entry.traffic_last[counter] = (now, value)
            if gap > 0:
                for direction, rate in one.pcie.items():
                    entry.pcie_bytes[direction] = entry.pcie_bytes.get(direction, 0.0) + rate * gap
                    entry.pcie_seconds[direction] = entry.pcie_seconds.get(direction, 0.0) + gap
                for reason in one.held:
                    entry.throttled[reason] = entry.throttled.get(reason, 0.0) + gap
                if one.utilization is not None:
                    entry.seconds += gap
                    entry.busy_seconds += one.utilization * gap
                    if one.utilization < STARVED_BELOW:
                        entry.starved_seconds += gap


@dataclass
class _Seen:
    """What a job's report takes from one GPU's samples."""

    counters: list[tuple[str, float]] = field(default_factory=list)  # (counter key, value)
    held: list[str] = field(default_factory=list)  # the clock-event reasons active
    memory_used: float | None = None
    memory_total: float | None = None
    utilization: float | None = None
    traffic: dict[Traffic, float] = field(default_factory=dict)  # ("nvlink", "tx", "3") ->
    pcie: dict[str, float] = field(default_factory=dict)  # direction -> bytes/s


def _seen_by_gpu(samples: Iterable[Sample]) -> dict[str, _Seen]:
    """uuid -> its counters and the reasons holding its clocks down."""
    out: dict[str, _Seen] = {}
    for sample in samples:
        name = sample.name
        if name in COUNTERS:
            uuid = dict(sample.labels).get("uuid", "")
            seen = out.setdefault(uuid, _Seen())
            seen.counters.append((_counter_key(sample), sample.value))
        elif name == m.CLOCK_EVENT and sample.value == 1.0:
            labels = dict(sample.labels)
            out.setdefault(labels.get("uuid", ""), _Seen()).held.append(labels.get("reason", ""))
        elif name in _GAUGES:
            seen = out.setdefault(dict(sample.labels).get("uuid", ""), _Seen())
            setattr(seen, _GAUGES[name], sample.value)
        elif name == m.PCIE_THROUGHPUT:
            labels = dict(sample.labels)
            pcie = out.setdefault(labels.get("uuid", ""), _Seen()).pcie
            pcie[labels.get("direction", "")] = sample.value
        elif name in _TRAFFIC:
            labels = dict(sample.labels)
            traffic = out.setdefault(labels.get("uuid", ""), _Seen()).traffic
            key = (_TRAFFIC[name], labels.get("direction", ""), labels.get("link", ""))
            traffic[key] = sample.value
    return out


# The GPU's gauges a report sums up: the fields of _Seen they go to.
_GAUGES = {
    m.MEMORY_USED: "memory_used",
    m.MEMORY_TOTAL: "memory_total",
    m.UTILIZATION: "utilization",
}
# The byte counters whose rate over the job's time a report gives (summed over links). PCIe's
# come from its throughput instead: drivers count its bytes in 32 bits (nvml/pcie.py).
_TRAFFIC = {m.NVLINK_BYTES: "nvlink"}
