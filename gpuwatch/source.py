"""The seams between the daemon and what produces samples: a Source for the GPUs (NVML,
dcgm-exporter, ...), a Watcher for what the host tells beside them (the kernel log, sysfs), a
Collector for a component's own state."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from gpuwatch.model import BackendState, Batch, Sample


class Source(Protocol):
    name: str

    @property
    def backend(self) -> BackendState: ...

    async def start(self) -> None: ...

    async def collect(self) -> Batch:
        """One sampling cycle; returns within the deadline whatever the hardware does."""
        ...

    async def stop(self) -> None: ...


class Collector(Protocol):
    """A component that reports its own state as samples (the notifier's outbox and sends,
    the state directory's failed writes, the rules engine's evaluations), as client_python's
    Collector does: the daemon gathers every one it was handed each cycle, without knowing
    what they are."""

    def collect(self) -> Iterable[Sample]: ...


class Watcher(Protocol):
    """Something the daemon watches beside the GPU backend: the kernel log, sysfs. Read every
    cycle from the first, its samples on a timeline of its own; started once the first cycle
    has listed the GPUs, so that what it follows can be put to a GPU. `read` returns within the
    cycle whatever the host does: its blocking I/O runs off the event loop."""

    name: str

    async def start(self) -> None: ...

    async def read(self) -> list[Sample]: ...

    async def stop(self) -> None: ...
