"""The threads NVML calls run in: a lane's worker for single calls, a runner for a cycle's
batch, and the relay that hands a runner the cycle's calls and watches their deadlines. A
thread stuck in the driver is abandoned, never killed (gpuwatch.nvml.caller says why)."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any

from gpuwatch.clock import Clock
from gpuwatch.source import run_into

Job = tuple[Callable[..., Any], tuple[Any, ...], "concurrent.futures.Future[Any]"]


class Worker:
    """One lane's thread, for single calls."""

    def __init__(self, name: str, on_freed: Callable[[Worker], None]) -> None:
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._busy = False
        self._abandoned = False
        self._on_freed = on_freed
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        self._queue.put(job)

    def stop(self) -> None:
        self._queue.put(None)

    def abandon(self) -> bool:
        """Mark the worker abandoned; False when its call already finished (nothing is stuck)."""
        with self._lock:
            self._abandoned = True
            return self._busy

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            fn, args, future = job
            with self._lock:  # busy before the call can start, as in Runner.execute
                self._busy = True
            if future.set_running_or_notify_cancel():
                run_into(future, fn, args)
            with self._lock:
                self._busy = False
                if self._abandoned:
                    break
        if self._abandoned:
            self._on_freed(self)


class Relay:
    """One cycle's calls, run one after another by one runner thread. When a call has run for
    `hold`, the caller hands the rest to another runner (`take_over`), and the one holding
    the slow call stops after it. `wake` is called once every call has finished and every
    runner handed the relay is back among the idle ones: the next cycle finds them there
    instead of starting threads. `close` (at the deadline) stops runners taking more calls."""

    def __init__(self, jobs: list[tuple[str, Job]], clock: Clock, wake: Callable[[], None]) -> None:
        self.jobs = jobs
        self._clock = clock
        self._wake = wake
        self._lock = threading.Lock()
        self._left = len(jobs)  # calls not finished
        self._runners = 0  # runners handed the relay that have not settled
        self._woken = False
        self._next = 0
        self._owner: Runner | None = None
        self._started = 0.0  # when the call running now started, in the clock's time
        self.running_in: dict[int, Runner] = {}  # job -> the runner that runs or ran it

    def take_over(self, runner: Runner) -> None:
        with self._lock:
            self._owner = runner
            self._runners += 1

    def close(self) -> None:
        """No call starts from now on: the deadline has passed, or nobody waits."""
        with self._lock:
            self._owner = None

    def overdue(self, hold: float) -> bool:
        """Whether the call running now has run for `hold`, with calls left after it."""
        with self._lock:
            last = self._next - 1  # the call its runner started last
            if last < 0 or self._next >= len(self.jobs) or self.running_in[last] is not self._owner:
                return False
            started = self._started
        return not self.jobs[last][1][2].done() and self._clock.now() - started >= hold

    def run(self, runner: Runner) -> None:
        while True:
            with self._lock:
                if self._owner is not runner or self._next >= len(self.jobs):
                    return
                i = self._next
                self._next += 1
                self._started = self._clock.now()
                self.running_in[i] = runner
            lane, (fn, args, future) = self.jobs[i]
            runner.execute(lane, fn, args, future)
            with self._lock:
                self._left -= 1
            if runner.abandoned:
                return

    def settle(self) -> None:
        """A runner is done with the relay: wake the caller if every call has finished and
        every runner is done (once)."""
        with self._lock:
            self._runners -= 1
            done = self._left == 0 and self._runners == 0 and not self._woken
            self._woken |= done
        if done:
            self._wake()


class Runner:
    """A thread that runs relays of calls, each call on behalf of its lane."""

    def __init__(self, on_done: Callable[[Runner], None]) -> None:
        self._queue: queue.SimpleQueue[Relay | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._lane: str | None = None  # the lane whose call runs now
        self.abandoned = False
        self._on_done = on_done
        self.thread = threading.Thread(target=self._run, name="nvml-runner", daemon=True)
        self.thread.start()

    def submit(self, relay: Relay) -> None:
        self._queue.put(relay)

    def stop(self) -> None:
        self._queue.put(None)

    def abandon(self, lane: str) -> bool:
        """Mark the runner abandoned while it runs `lane`'s call; False when that call has
        already finished (nothing is stuck)."""
        with self._lock:
            if self._lane != lane:
                return False
            self.abandoned = True
            return True

    def execute(
        self,
        lane: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        future: concurrent.futures.Future[Any],
    ) -> None:
        # The lane is this runner's before the call can start: a deadline passing in between
        # either cancels the call or finds the runner holding it to abandon.
        with self._lock:
            self._lane = lane
        if future.set_running_or_notify_cancel():
            run_into(future, fn, args)
        with self._lock:
            self._lane = None

    def _run(self) -> None:
        while (relay := self._queue.get()) is not None:
            relay.run(self)
            self._on_done(self)
            relay.settle()
            if self.abandoned:
                return
