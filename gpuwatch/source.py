"""The seams between the daemon and what produces samples: a Source for the GPUs (NVML,
dcgm-exporter, ...), a Collector for a component's own state."""

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
