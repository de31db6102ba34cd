"""Prometheus's stale markers, put back into a history read from its query API.

When a scrape succeeds without a series the target's previous scrape had, or fails, Prometheus
writes a stale marker for that series at the scrape's time, and an instant selector stops
seeing it there instead of 5 minutes later. The query API leaves stale markers out of the raw
samples it returns, so a series that went away (a GPU lost, a daemon restarted, a target
down) would seem to linger for the lookback. Every scrape also writes the target's `up`, so
its samples' times are the target's scrapes: where a series had a sample at one scrape and
none at the next, the marker goes back at the next.

Only series whose samples all fall on their target's scrapes are marked: a recording rule's
output that keeps a target's labels is not scraped, and has no scrapes to go missing from.
"""

from __future__ import annotations

from gpuwatch.promql.values import Labels
from gpuwatch.store.series import STALE_NAN

Target = tuple[str, str]  # job, instance
Points = list[tuple[int, float]]  # (milliseconds, value)
UP = "up"


def target_of(metric: Labels) -> Target | None:
    labels = dict(metric)
    job, instance = labels.get("job"), labels.get("instance")
    return (job, instance) if job is not None and instance is not None else None


class Scrapes:
    """What carries over from one chunk of history to the next: each target's last scrape
    and the series that had a sample at it."""

    def __init__(self) -> None:
        self._live: dict[Target, set[Labels]] = {}
        self.marked = 0  # stale markers put back

    def mark(self, chunk: dict[Labels, Points], ups: dict[Target, list[int]]) -> None:
        """Add the stale markers of one chunk to its series' points (kept in time order)."""
        by_target: dict[Target, dict[Labels, set[int]]] = {}
        for metric, points in chunk.items():
            target = target_of(metric)
            if target is not None and target in ups:
                by_target.setdefault(target, {})[metric] = {t for t, _ in points}
        for target, scrapes in ups.items():
            series = by_target.get(target, {})
            on = set(scrapes)
            scraped = {m for m, times in series.items() if times <= on}
            live = self._live.get(target, set())
            for scrape in scrapes:
                present = {m for m in scraped if scrape in series[m]}
                for gone in live - present:
                    chunk.setdefault(gone, []).append((scrape, STALE_NAN))
                    self.marked += 1
                live = present
            self._live[target] = live
        for points in chunk.values():
            points.sort(key=lambda p: p[0])
