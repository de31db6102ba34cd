"""The seam between the daemon and whatever produces samples (NVML, dcgm-exporter, ...)."""

from __future__ import annotations

from typing import Protocol

from gpuwatch.model import BackendState, Batch


class Source(Protocol):
    name: str

    @property
    def backend(self) -> BackendState: ...

    async def start(self) -> None: ...

    async def collect(self) -> Batch:
        """One sampling cycle; returns within the deadline whatever the hardware does."""
        ...

    async def stop(self) -> None: ...
