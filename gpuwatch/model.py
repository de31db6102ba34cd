"""Values that flow from sources to the store, the exporter and the API."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Generic, NamedTuple, TypeVar

from gpuwatch.compat import StrEnum
from gpuwatch.text.jobs import JOB_NOUNS

Labels = tuple[tuple[str, str], ...]


def series_text(name: str, labels: Labels) -> str:
    """A series as Prometheus writes it, for log lines: name{a="1",b="x"}, or name alone."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


class Sample(NamedTuple):
    """One value of one series. `labels` is ordered as the source emits it, never re-sorted."""

    name: str
    labels: Labels
    value: float


# The daemon's namespace: its own metrics and the shipped packs' records. No push or textfile
# may use it, so a series named so is the hardware's (or the daemon's own account).
HARDWARE_PREFIXES = ("gpuwatch_", "gpuwatch:")


class Provenance(StrEnum):
    """Where a series, an alert or a cause came from; only the hardware's may judge a GPU or
    the node, or move an action. A series is the hardware's when its name is the daemon's
    own (`gpuwatch_`, which nothing a job sends may carry), a job's otherwise; an alert is
    the hardware's when its rule reads the hardware's series only."""

    HARDWARE = "hardware"  # NVML, dcgm-exporter, records the kernel wrote, sysfs
    JOB = "job"  # pushes and textfiles: a job's account of itself


class GpuStatus(StrEnum):
    OK = "ok"
    LOST = "lost"
    UNRESPONSIVE = "unresponsive"
    FAILING = "failing"  # it answers, but with errors: nothing could be read, or reset it


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """What identifies a GPU; read once when its handle is opened."""

    index: int
    uuid: str
    model: str
    pci_bus_id: str
    serial: str
    vbios_version: str
    nvlink_count: int

    @property
    def labels(self) -> Labels:
        return (("gpu", str(self.index)), ("uuid", self.uuid))


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG GPU instance as last read; None where its driver did not say."""

    gpu_instance_id: int
    profile: str  # 3g.40gb
    uuid: str
    memory_used: float | None
    memory_total: float | None
    pids: tuple[int, ...] | None

    def as_json(self) -> dict[str, object]:
        return {
            "gpu_i_id": self.gpu_instance_id,
            "gpu_i_profile": self.profile,
            "uuid": self.uuid,
            "memory_used_bytes": self.memory_used,
            "memory_total_bytes": self.memory_total,
            "pids": list(self.pids) if self.pids is not None else None,
        }


@dataclass(frozen=True, slots=True)
class GpuState:
    info: GpuInfo
    status: GpuStatus
    reason: str = ""
    processes: tuple[GpuProcess, ...] = ()  # as last read; kept while the GPU is lost
    instances: tuple[MigInstance, ...] = ()  # MIG GPU instances, as last read

    @property
    def jobs(self) -> str:
        """The jobs running on it, as a person reads them: `Slurm job 81234 of alice`."""
        return jobs_text(self.processes)


@dataclass(frozen=True, slots=True)
class MissingGpu:
    """A GPU this node had before (same state directory) that the driver no longer lists."""

    uuid: str
    index: int  # its index when it was last seen; the driver may have renumbered since
    model: str
    serial: str
    pci_bus_id: str


@dataclass(frozen=True, slots=True)
class BackendState:
    """The GPU backend as a whole (NVML loaded and answering, or not, and why)."""

    up: bool
    name: str
    reason: str = ""
    driver_version: str = ""
    library_version: str = ""
    missing: tuple[MissingGpu, ...] = ()


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened at an instant: an XID, a GPU lost or back, a timeout."""

    time: float
    kind: str
    gpu: int | None
    uuid: str | None
    message: str
    data: dict[str, int | float | str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Batch:
    """One sampling cycle of one source."""

    source: str
    time: float
    samples: list[Sample]  # read this cycle
    backend: BackendState
    gpus: list[GpuState]
    # The slow tier: fields a source reads less often than every cycle, the last reading of
    # each part (a GPU), one list per part. A part read again is a new list, never the old
    # one changed, so what a reader derives from a list holds until the list is replaced
    # (PerPart). `slow_read` has the parts read, or emptied, this cycle, by name.
    slow: list[list[Sample]] = field(default_factory=list)
    slow_read: list[tuple[str, list[Sample]]] = field(default_factory=list)

    @property
    def slow_samples(self) -> Iterator[Sample]:
        return chain.from_iterable(self.slow)


T = TypeVar("T")


class PerPart(Generic[T]):
    """What `derive` makes of each part of a batch's slow tier, made again only for a part
    read again. Most of a batch is slow samples read seconds ago: looking through them all
    every cycle cost more than anything else done with them."""

    def __init__(self, derive: Callable[[list[Sample]], T]) -> None:
        self._derive = derive
        # By id(part), each with its part: kept alive, no other list can have its id.
        self._made: dict[int, tuple[list[Sample], T]] = {}

    def __call__(self, parts: list[list[Sample]]) -> list[T]:
        made: dict[int, tuple[list[Sample], T]] = {}
        for part in parts:
            hit = self._made.get(id(part))
            if hit is None:
                hit = (part, self._derive(part))
            made[id(part)] = hit
        self._made = made  # parts gone are forgotten
        return [hit for _, hit in made.values()]


# What processes use a GPU, and whose jobs they are (gpuwatch.host.processes finds them).


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    name: str
    user: str
    gpu_memory_bytes: float | None
    job_kind: str = ""  # slurm, kubernetes, docker, containerd, or "" when unknown
    job_id: str = ""
    # When the process started (gpuwatch.host.procfs.start_time): a pid alone may be another's.
    started: float | None = None

    @property
    def job(self) -> str:
        """`Slurm job 81234 of alice`, or "" when the process belongs to no known job."""
        if not self.job_id:
            return ""
        ident = self.job_id[:12] if self.job_kind in ("docker", "containerd") else self.job_id
        return f"{JOB_NOUNS.get(self.job_kind, self.job_kind)} {ident} of {self.user}"

    def as_json(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "name": self.name,
            "user": self.user,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "job_kind": self.job_kind,
            "job_id": self.job_id,
            "job": self.job,
        }


def jobs_text(processes: Iterable[GpuProcess]) -> str:
    """The jobs these processes belong to, as a person reads them: `Slurm job 81234 of alice`."""
    return "; ".join(sorted({p.job for p in processes if p.job}))


# The alerts the notifier works on, as the rules hand them over: firing or resolved, each
# with the node's name, Alertmanager's fingerprint and its status.
_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_SEPARATOR = 0xFF


def fingerprint(labels: Labels) -> str:
    """Prometheus's label-set fingerprint (FNV-1a 64 over sorted names and values), as the
    16 hex digits Alertmanager shows, so the same alert has the same id everywhere."""
    h = _FNV_OFFSET
    for name, value in sorted(labels):
        for part in (name, value):
            for byte in part.encode():
                h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
            h = ((h ^ _SEPARATOR) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


@dataclass(frozen=True, slots=True)
class NotifyAlert:
    labels: Labels  # sorted, with alertname and node
    annotations: tuple[tuple[str, str], ...]
    starts_at: float
    ends_at: float | None  # None while firing; when it resolved otherwise
    value: float
    fingerprint: str

    @property
    def firing(self) -> bool:
        return self.ends_at is None

    @property
    def status(self) -> str:
        return "firing" if self.ends_at is None else "resolved"

    def label(self, name: str) -> str:
        return dict(self.labels).get(name, "")

    def annotation(self, name: str) -> str:
        return dict(self.annotations).get(name, "")
