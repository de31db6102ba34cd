"""What a job's alerts may cost a receiver: the lane they wait in, and how many messages an
hour they may take.

A notification carrying a hardware alert is in the hardware's lane, which each receiver
empties first; one carrying only jobs' alerts (`provenance="job"`) waits behind it. A
receiver takes at most `per_hour` notifications of one job in an hour, and ten times that
of all jobs together (a user can push under any number of job names); past it, the group
waits, nothing dropped, until the hour allows it."""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence

from gpuwatch.model import NotifyAlert
from gpuwatch.notify.db import HARDWARE_LANE, JOB_LANE

log = logging.getLogger(__name__)

HOUR_S = 3600.0
ALL_JOBS = 10  # the budget of all jobs together, in budgets of one job
MAX_KEYS = 4096  # (receiver, job) pairs remembered; the oldest forgotten past it


def lane_of(alerts: Sequence[NotifyAlert]) -> int:
    if alerts and all(a.label("provenance") == "job" for a in alerts):
        return JOB_LANE
    return HARDWARE_LANE


class JobBudget:
    def __init__(self, per_hour: int) -> None:
        self.per_hour = per_hour
        self._sent: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()
        self.held: Counter[str] = Counter()  # by receiver: notifications that waited
        self._told: dict[tuple[str, str], float] = {}  # when a hold was last logged

    def allows(self, now: float, receiver: str, alerts: Sequence[NotifyAlert]) -> bool:
        """Whether one more notification of these alerts' job may go to `receiver` now."""
        mine, everyone = self._books(now, receiver, alerts)
        if len(mine) >= self.per_hour or len(everyone) >= self.per_hour * ALL_JOBS:
            self.held[receiver] += 1
            self._log(now, receiver, _job(alerts), len(mine) >= self.per_hour)
            return False
        return True

    def spend(self, now: float, receiver: str, alerts: Sequence[NotifyAlert]) -> None:
        """Count one that went into the outbox (not one its format could not render)."""
        for times in self._books(now, receiver, alerts):
            times.append(now)

    def _books(
        self, now: float, receiver: str, alerts: Sequence[NotifyAlert]
    ) -> tuple[deque[float], deque[float]]:
        return self._recent((receiver, _job(alerts)), now), self._recent((receiver, ""), now)

    def _recent(self, key: tuple[str, str], now: float) -> deque[float]:
        times = self._sent.pop(key, None)
        if times is None:
            times = deque()
        while times and times[0] <= now - HOUR_S:
            times.popleft()
        self._sent[key] = times  # the newest used last: the oldest go first past MAX_KEYS
        while len(self._sent) > MAX_KEYS:
            self._sent.popitem(last=False)
        return times

    def _log(self, now: float, receiver: str, job: str, alone: bool) -> None:
        key = (receiver, job if alone else "")
        if self._told.get(key, float("-inf")) > now - HOUR_S:
            return
        self._told = {k: t for k, t in self._told.items() if t > now - HOUR_S}
        self._told[key] = now
        which = f"job {job!r}" if alone else "all jobs together"
        log.warning(
            "receiver %s: %s had %d notifications in the last hour (%s); the next wait",
            receiver,
            which,
            self.per_hour * (1 if alone else ALL_JOBS),
            "notify.job_notifications_per_hour" + ("" if alone else f", times {ALL_JOBS}"),
        )


def _job(alerts: Sequence[NotifyAlert]) -> str:
    return ",".join(sorted({a.label("job") for a in alerts}))
