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
    """Linear in the jobs: a push looks at its own job's series and a running total, never at
    every other job (10,000 textfile jobs a cycle were quadratic)."""

    def __init__(self, limits: PushLimits) -> None:
        self.limits = limits
        self._jobs: dict[str, dict[SeriesKey, tuple[float, float]]] = {}  # -> (value, time)
        self._total = 0  # series over all jobs
        self.names: frozenset[str] = frozenset()  # metric names in the last samples()
        self._next_expire = float("-inf")

    def apply(self, job: str, samples: list[Sample], now: float) -> int:
        """Take one push; returns how many series it carried. PushError when over a limit."""
        self.expire(now)
        current = self._jobs.get(job, {})
        new_keys = {(s.name, s.labels) for s in samples}
        job_total = len(current) + len(new_keys - current.keys())
        if job_total > self.limits.max_series_per_job:
            raise PushError(
                422,
                f"too many series: job {job!r} would have {job_total}, the limit per job is "
                f"{self.limits.max_series_per_job} (push.max_series_per_job)",
            )
        node_total = self._total - len(current) + job_total
        if node_total > self.limits.max_series:
            raise PushError(
                422,
                f"too many series: the node would hold {node_total} pushed series, the "
                f"limit is {self.limits.max_series} (push.max_series)",
            )
        before = len(current)
        series = self._jobs.setdefault(job, current)
        for s in samples:
            series[(s.name, s.labels)] = (s.value, now)
        self._total += len(series) - before
        return len(samples)

    def expire(self, now: float) -> None:
        if now < self._next_expire:
            return
        self._next_expire = now + EXPIRE_EVERY_S
        cutoff = now - self.limits.stale_after
        for job in list(self._jobs):
            series = self._jobs[job]
            stale = [k for k, (_, t) in series.items() if t < cutoff]
            for key in stale:
                del series[key]
            self._total -= len(stale)
            if not series:
                del self._jobs[job]

    def samples(self, now: float) -> list[Sample]:
        self.expire(now)
        out = [
            Sample(name, labels, value)
            for series in self._jobs.values()
            for (name, labels), (value, _) in series.items()
        ]
        self.names = frozenset(s.name for s in out)
        return out
