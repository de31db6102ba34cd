"""How the GPUs are sampled: the `sampling` section of the config."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    interval: float = 1.0
    # Deadline for one GPU's sampling calls; None means one interval.
    timeout: float | None = None
    # Worker threads left stuck in NVML (uninterruptible) before a GPU is no longer retried.
    max_abandoned_workers: int = 16
    # gpuwatch_process_gpu_memory_bytes per process: opt-in, its pid label is unbounded.
    process_memory_metrics: bool = False
    # How often the slow tier of fields (error counters, link states, limits, MIG) is
    # read; never more often than `interval`. Rules judge those over minutes, and a fault
    # event reads its GPU's at once: every second cost a quarter more CPU at 8 GPUs.
    slow_interval: float = 5.0

    @property
    def deadline(self) -> float:
        return self.timeout if self.timeout is not None else self.interval
