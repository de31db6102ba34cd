"""All job metrics the daemon samples each cycle: pushes and textfiles, under one set of limits."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.model import Sample
from gpuwatch.push.parse import PushError
from gpuwatch.push.registry import JobMetrics, PushLimits
from gpuwatch.push.textfile import TextfileDir

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CheckpointAdvice:
    """What the daemon tells every job that pushes, in the push's answer, while it holds: the
    node is going away or going bad, checkpoint now (gpuwatch.actions.advice decides)."""

    since: float  # when it was first given (seconds since the epoch)
    since_text: str  # the same, RFC 3339
    reasons: tuple[str, ...]  # the causes and alerts that made it, as the verdict names them

    def as_json(self) -> dict[str, object]:
        return {"advised": True, "since": self.since_text, "reasons": list(self.reasons)}


class JobInputs:
    def __init__(self, limits: PushLimits, textfile_dir: str | None) -> None:
        self.pushed = JobMetrics(limits)
        # Said back to each pushing job while it is set: gpuwatch.client's should_checkpoint().
        self.advice: CheckpointAdvice | None = None
        self.textfiles = (
            TextfileDir(Path(textfile_dir), limits.max_body_bytes) if textfile_dir else None
        )
        self._over_limit: set[str] = set()

    async def collect(self, now: float) -> list[Sample]:
        """The live job series, sampled into the store with this cycle's batch. The textfile
        directory is read on a thread: a slow disk or ten thousand files never hold the loop."""
        if self.textfiles is not None:
            files = await asyncio.to_thread(self.textfiles.read)
            for job, samples in files.items():
                try:
                    self.pushed.apply(job, samples, now)  # refreshed while the file is there
                except PushError as exc:
                    if job not in self._over_limit:
                        log.warning("textfile job %s left out: %s", job, exc)
                    self._over_limit.add(job)
                else:
                    self._over_limit.discard(job)
        return self.pushed.samples(now)
