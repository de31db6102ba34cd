"""What one local user may cost the daemon through the push socket.

The kernel names each connection's user (SO_PEERCRED's uid), so the bounds are per user, not
per connection a user can open more of:

- connections: at most MAX_CONNECTIONS_PER_UID open at once; one more is answered 429 and
  closed, and other users still get in (before, 520 connections that trickled a body from one
  user locked every other job out);
- parsing: what a user's pushes cost to parse (CPU seconds, on the loop or on a thread) is
  counted over the last WINDOW_S; past SHARE of it, the next push is answered 429 with a
  Retry-After, unparsed;
- large bodies (parsed on a thread) are parsed one at a time, whoever sent them: a parse holds
  the interpreter lock, and eight at once starved the sampling loop for seconds. A user may
  have at most MAX_LARGE_PER_UID being received, waiting or being parsed (each up to
  push.max_body_bytes in memory); one more is answered 429 as soon as it shows it is large.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

MAX_CONNECTIONS_PER_UID = 64
WINDOW_S = 10.0
SHARE = 0.25  # of one core, over WINDOW_S, for one user's parsing
MAX_LARGE_PER_UID = 2
MAX_USERS = 4096  # users remembered; the least recent forgotten past it

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Refusal:
    """A push not taken, for now: why, and in how many seconds to try again."""

    message: str
    retry_after: float


class PushGate:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.open: dict[int, int] = {}  # uid -> connections open
        self._spent: OrderedDict[int, deque[tuple[float, float]]] = OrderedDict()
        self._large: dict[int, int] = {}  # uid -> large pushes waiting or being parsed
        self._lane = asyncio.Lock()

    # -- connections ----------------------------------------------------------------------
    def connect(self, uid: int) -> bool:
        """Count a new connection of `uid`; False when it has as many as it may."""
        if self.open.get(uid, 0) >= MAX_CONNECTIONS_PER_UID:
            return False
        self.open[uid] = self.open.get(uid, 0) + 1
        return True

    def disconnect(self, uid: int) -> None:
        _one_less(self.open, uid)

    # -- parsing --------------------------------------------------------------------------
    def refusal(self, uid: int) -> Refusal | None:
        """Why `uid` may not have a push parsed now; None when it may."""
        now = self._clock()
        spent = self._recent(uid, now)
        used = sum(seconds for _, seconds in spent)
        if used > SHARE * WINDOW_S:
            retry = max(1.0, spent[0][0] + WINDOW_S - now) if spent else WINDOW_S
            return Refusal(
                f"uid {uid} used {used:.1f} s of the daemon's CPU parsing pushes in the last "
                f"{WINDOW_S:.0f} s (the most a user may is {SHARE * WINDOW_S:.1f} s)",
                retry,
            )
        return None

    def hold_large(self, uid: int) -> Refusal | None:
        """Take one of `uid`'s places for a large body (release_large gives it back); why not,
        when it has none left."""
        if self._large.get(uid, 0) >= MAX_LARGE_PER_UID:
            return Refusal(f"uid {uid} has {MAX_LARGE_PER_UID} large pushes under way already", 1.0)
        self._large[uid] = self._large.get(uid, 0) + 1
        return None

    def release_large(self, uid: int) -> None:
        _one_less(self._large, uid)

    def charge(self, uid: int, seconds: float) -> None:
        now = self._clock()
        self._recent(uid, now).append((now, seconds))

    def parse_here(self, uid: int, work: Callable[[], T]) -> T:
        """`work` on the loop, its CPU time charged to `uid`."""
        result, seconds = _timed(work)
        self.charge(uid, seconds)
        return result

    async def parse_large(self, uid: int, work: Callable[[], T]) -> T:
        """`work` on a thread, one large push at a time, its CPU time charged to `uid` (on
        the loop: the books are the loop's alone)."""
        async with self._lane:
            result, seconds = await asyncio.to_thread(_timed, work)
        self.charge(uid, seconds)
        return result

    def _recent(self, uid: int, now: float) -> deque[tuple[float, float]]:
        spent = self._spent.pop(uid, None)
        if spent is None:
            spent = deque()
        while spent and spent[0][0] <= now - WINDOW_S:
            spent.popleft()
        self._spent[uid] = spent  # most recent last
        while len(self._spent) > MAX_USERS:
            self._spent.popitem(last=False)
        return spent


def _timed(work: Callable[[], T]) -> tuple[T, float]:
    """`work`'s result and the CPU seconds its thread spent on it (not the time it waited for
    the interpreter lock)."""
    started = time.thread_time()
    result = work()
    return result, time.thread_time() - started


def _one_less(counts: dict[int, int], uid: int) -> None:
    """One fewer for `uid`, forgotten at none: the books keep only users with something open."""
    left = counts.get(uid, 0) - 1
    if left > 0:
        counts[uid] = left
    else:
        counts.pop(uid, None)
