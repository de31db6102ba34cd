"""What jobs have pushed, with limits and staleness.

A push updates the series it carries (ranks of one job push on their own; each keeps its own
series). A series not refreshed within `stale_after` is dropped, and because pushed series are
sampled into the store with every cycle, it goes stale there as a scraped series would. A push
that would take its job or the node past a series limit is refused whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatch.model import Labels, Sample
from gpuwatch.push.parse import PushError

SeriesKey = tuple[str, Labels]


@dataclass(frozen=True, slots=True)
class PushLimits:
    max_body_bytes: int = 4 * 1024 * 1024
    max_series_per_job: int = 1000
    max_series: int = 10000
    stale_after: float = 300.0


EXPIRE_EVERY_S = 1.0  # stale series are dropped at most this often, not on every push


class JobMetrics:
    """Linear in the jobs: a push looks at its own series and two running totals, never at
    every other job (10,000 textfile jobs a cycle were quadratic). One flat table of series,
    not a table per job: a job of one series cost a dict of its own (about 220 bytes), and
    what 10,000 jobs hold at once is what the allocator keeps after they are gone."""

    def __init__(self, limits: PushLimits) -> None:
        self.limits = limits
        self._series: dict[tuple[str, str, Labels], tuple[float, float]] = {}  # -> (value, time)
        self._per_job: dict[str, int] = {}  # series of each job
        self._total = 0  # series over all jobs
        self.names: frozenset[str] = frozenset()  # metric names in the last samples()
        self._next_expire = float("-inf")

    def apply(self, job: str, samples: list[Sample], now: float) -> int:
        """Take one push; returns how many series it carried. PushError when over a limit."""
        self.expire(now)
        series = self._series
        new = len({(s.name, s.labels) for s in samples if (job, s.name, s.labels) not in series})
        before = self._per_job.get(job, 0)
        job_total = before + new
        if job_total > self.limits.max_series_per_job:
            raise PushError(
                422,
                f"too many series: job {job!r} would have {job_total}, the limit per job is "
                f"{self.limits.max_series_per_job} (push.max_series_per_job)",
            )
        node_total = self._total + new
        if node_total > self.limits.max_series:
            raise PushError(
                422,
                f"too many series: the node would hold {node_total} pushed series, the "
                f"limit is {self.limits.max_series} (push.max_series)",
            )
        for s in samples:
            series[(job, s.name, s.labels)] = (s.value, now)
        self._per_job[job] = job_total
        self._total = node_total
        return len(samples)

    def expire(self, now: float) -> None:
        if now < self._next_expire:
            return
        self._next_expire = now + EXPIRE_EVERY_S
        cutoff = now - self.limits.stale_after
        stale = [key for key, (_, t) in self._series.items() if t < cutoff]
        for key in stale:
            del self._series[key]
            job = key[0]
            left = self._per_job[job] - 1
            if left:
                self._per_job[job] = left
            else:
                del self._per_job[job]
        self._total -= len(stale)
        if stale and len(self._series) < len(stale):
            # Most series went at once (a flood ended): rebuilt, the tables shrink to what is
            # left; a dict keeps its largest table for good otherwise.
            self._series = dict(self._series)
            self._per_job = dict(self._per_job)

    def samples(self, now: float) -> list[Sample]:
        self.expire(now)
        out = [
            Sample(name, labels, value) for (_, name, labels), (value, _) in self._series.items()
        ]
        self.names = frozenset(s.name for s in out)
        return out
