"""How long this process's threads waited for a CPU: what tells a starved daemon from a
wedged driver.

An NVML call past its deadline is either stuck in the driver (its thread sleeps in the
kernel, uninterruptibly, and uses no CPU) or slow because the host gave the daemon no CPU
(its threads were runnable and waited on a run queue). The scheduler counts the second for
each thread: the second field of /proc/self/task/TID/schedstat is the time the thread spent
runnable and waiting, in nanoseconds (the kernel's Documentation/scheduler/sched-stats.rst;
kernels with CONFIG_SCHED_INFO, which every distribution kernel has). Every thread counts,
not just the one calling NVML: a Python thread the kernel preempted while it held the
interpreter lock keeps the calling thread from going on as surely as a run queue does.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Protocol

from gpuwatch.kernel.attributes import read_small

log = logging.getLogger(__name__)

MAX_THREADS = 512  # threads read at most (the daemon runs a few dozen)

Mark = dict[str, int]  # thread id -> nanoseconds waited, as read


class CpuWait(Protocol):
    def mark(self) -> Mark | None:
        """Each thread's wait so far; None where the kernel does not count it."""

    def since(self, mark: Mark) -> float:
        """Seconds since `mark` that the process could not run for want of a CPU: what its
        threads waited, added up. Python threads take turns at the interpreter lock, so one
        waiting on a run queue mostly holds up the others rather than waiting beside them;
        where two did wait at once, the sum counts that time twice, which the caller's bound
        on the time it grants keeps small."""


class SchedstatWait:
    """CpuWait from the kernel's per-thread scheduler statistics."""

    def __init__(self, tasks: str = "/proc/self/task") -> None:
        self._tasks = tasks

    def mark(self) -> Mark | None:
        try:
            tids = os.listdir(self._tasks)[:MAX_THREADS]
        except OSError:
            return None
        out: Mark = {}
        for tid in tids:
            waited = _waited(os.path.join(self._tasks, tid, "schedstat"))
            if waited is not None:
                out[tid] = waited
        return out or None

    def since(self, mark: Mark) -> float:
        # A thread started since the mark (a runner the calls were handed to) waited all its
        # life after it.
        waits = (waited - mark.get(tid, 0) for tid, waited in (self.mark() or {}).items())
        return sum(max(0, w) for w in waits) / 1e9


def _waited(path: str) -> int | None:
    """The second field of a thread's schedstat; None where the thread has ended, or the
    kernel keeps no schedstat."""
    fields = (read_small(path) or "").split()
    return int(fields[1]) if len(fields) >= 2 and fields[1].isdigit() else None


class Stretch:
    """The time the process waited for a CPU while a cycle's calls ran, granted past the
    deadline as more time, up to `limit` in all.

    Reading every thread's wait costs ~10 µs a thread, so it is read only once the calls
    turn out slow, at the caller's first wake (`start`, due at `first_wake`). Until then the
    caller's own lateness stands for it: the event loop's thread woke that much late because
    it could not run, for want of a CPU or of the interpreter lock, and so could not the
    Python around the calls."""

    def __init__(
        self,
        cpu_wait: CpuWait | None,
        limit: float,
        granted: Callable[[float], None],
        first_wake: float,
    ) -> None:
        self._cpu_wait = cpu_wait
        self._granted = granted
        self._left = limit
        self._first_wake = first_wake
        self._late = 0.0
        self._mark: Mark | None = None
        self._started = False

    def start(self, now: float) -> None:
        if not self._started and self._cpu_wait is not None:
            self._started = True
            self._late = max(0.0, now - self._first_wake)
            self._mark = self._cpu_wait.mark()

    def grant(self) -> float:
        """Seconds more for the calls: what the process waited since the last grant."""
        if self._cpu_wait is None or self._mark is None or self._left <= 0:
            return 0.0
        waited = self._cpu_wait.since(self._mark) + self._late
        self._late = 0.0
        self._mark = self._cpu_wait.mark()
        if self._mark is None:
            return 0.0
        extra = min(waited, self._left)
        self._left -= extra
        self._granted(extra)
        if extra > 0:
            log.debug("nvml calls waited %.3gs for a CPU; their deadline moves by that", extra)
        return extra
