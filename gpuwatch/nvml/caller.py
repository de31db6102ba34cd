"""Every NVML call goes through here: off the event loop, on behalf of a lane (a GPU, or the
driver), with a deadline. Single calls run in the lane's own worker thread; a cycle's reads
of every GPU run one after another in a runner thread (`call_many`).

A wedged driver leaves the calling thread in uninterruptible sleep; nothing can kill it. So a
call past its deadline is abandoned: its thread is left to finish whenever it can, later calls
go to a fresh one, and the caller learns of the timeout at once. A lane with an abandoned call
still stuck takes no new calls (that GPU is reported unresponsive without piling up threads),
and the number of stuck threads across all lanes is bounded.

A cycle's calls are timed on the daemon's CPU, not the wall's: time the process spent waiting
for a CPU while they ran (cpu_wait.py) extends their deadline, up to MAX_STRETCH deadlines
more. A host that other processes saturate slows every call without any of them being stuck;
a call stuck in the driver waits for no CPU, and is abandoned at its deadline, or where the
host starves the daemon too (its other threads wait) within MAX_STRETCH deadlines more.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from gpuwatch.clock import Clock
from gpuwatch.nvml.cpu_wait import CpuWait, Stretch
from gpuwatch.nvml.threads import Job, Relay, Runner, Worker

T = TypeVar("T")
log = logging.getLogger(__name__)


class NvmlTimeoutError(Exception):
    """The call did not answer within its deadline; its worker was abandoned."""


class LaneStuckError(Exception):
    """An earlier call on this lane is still stuck, or too many workers are stuck overall."""


Call = tuple[str, Callable[..., Any], tuple[Any, ...]]  # lane, function, arguments
IDLE_RUNNERS = 2  # runner threads kept waiting for the next cycle's calls
# Deadlines a cycle's calls may be given on top of their own for the time the process waited
# for a CPU: bounded, so that a hang on a host also starved still times out (at 1 s, by 5 s).
MAX_STRETCH = 4.0


class NvmlCaller:
    """Runs NVML calls in one worker thread per lane (a GPU, or the driver) with deadlines."""

    def __init__(self, clock: Clock, max_stuck: int, cpu_wait: CpuWait | None = None) -> None:
        self._clock = clock
        self._max_stuck = max_stuck
        self._cpu_wait = cpu_wait
        self._lock = threading.Lock()
        self._workers: dict[str, Worker] = {}
        # Each thread stuck in a call, with its lane: a lane can have two (the cycle's runner
        # and the lane's own worker, reading PCIe throughput), each counted.
        self._stuck: dict[Worker | Runner, str] = {}
        self._idle: list[Runner] = []
        self._closed = False
        self.timeouts: dict[str, int] = {}
        self.stretched_s = 0.0  # deadline time granted for the process's wait for a CPU

    def _stretched(self, seconds: float) -> None:
        self.stretched_s += seconds

    @property
    def stuck_workers(self) -> int:
        with self._lock:
            return len(self._stuck)

    async def call(self, lane: str, deadline: float, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) in the lane's worker; raises NvmlTimeoutError past `deadline` clock-seconds."""
        worker = self._worker_for(lane)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        worker.submit((fn, args, future))
        try:
            return await self._clock.wait_for(asyncio.wrap_future(future), deadline)
        except TimeoutError:
            raise self._timed_out(lane, worker, deadline) from None

    async def call_many(self, deadline: float, calls: Sequence[Call]) -> list[Any]:
        """Each (lane, fn, args) on behalf of its lane, awaited together: the event loop is
        woken once, when the last one finishes, not once per call (at 64 GPUs and 10 Hz the
        per-call wake-ups were a sixth of the daemon's time). Returns, in order, each call's
        value or the exception it raised; NvmlTimeoutError for one past `deadline`,
        LaneStuckError for a lane that takes no call.

        The calls run one after another in one runner thread. Python threads reading at once
        contend for the interpreter lock at every NVML call (each releases it), and handing
        each call to its own thread in turn still cost a thread switch a call (2.5 ms a cycle
        at 8 simulated GPUs, a third of the reads' own time). A call that has run for
        deadline / 2n is left to its runner and the rest go on in another, so a hung GPU
        delays the ones after it by that much only; one past the deadline is abandoned, as in
        `call`, and its lane refuses calls until it returns."""
        loop = asyncio.get_running_loop()
        all_done: asyncio.Future[None] = loop.create_future()
        results: list[Any] = [None] * len(calls)
        jobs: list[tuple[str, Job]] = []
        index: list[int] = []  # the call each job is

        def wake() -> None:  # in the runner that finished the last call
            def done() -> None:
                if not all_done.done():
                    all_done.set_result(None)

            with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile
                loop.call_soon_threadsafe(done)

        for i, (lane, fn, args) in enumerate(calls):
            try:
                self._check_lane(lane)
            except LaneStuckError as exc:
                results[i] = exc
                continue
            jobs.append((lane, (fn, args, concurrent.futures.Future())))
            index.append(i)
        relay = Relay(jobs, self._clock, wake)
        if jobs:
            self._hand(relay)
        else:
            all_done.set_result(None)
        hold = deadline / (2 * max(1, len(calls)))
        end = self._clock.now() + deadline
        stretch = Stretch(
            self._cpu_wait, deadline * MAX_STRETCH, self._stretched, end - deadline + hold
        )
        try:
            while not all_done.done():
                if (remaining := end - self._clock.now()) <= 0:
                    if (extra := stretch.grant()) <= 0:
                        break
                    end, remaining = end + extra, extra
                with contextlib.suppress(TimeoutError):
                    await self._clock.wait_for(asyncio.shield(all_done), min(hold, remaining))
                if not all_done.done():
                    stretch.start(self._clock.now())  # slow calls only: a quick cycle reads none
                if relay.overdue(hold) and end > self._clock.now():
                    self._hand(relay)
        finally:
            relay.close()  # no call starts after the deadline, or once nobody waits
        for j, (i, (lane, (_, _, future))) in enumerate(zip(index, jobs, strict=True)):
            if future.done():
                error = future.exception()
                results[i] = error if error is not None else future.result()
            else:
                results[i] = self._run_out(lane, future, relay.running_in.get(j), deadline)
        return results

    def _run_out(
        self,
        lane: str,
        future: concurrent.futures.Future[Any],
        runner: Runner | None,
        deadline: float,
    ) -> NvmlTimeoutError:
        """A call of call_many past the deadline: cancelled where it has not started, else
        abandoned to its runner; its lane refuses calls until it returns."""
        with self._lock:
            self.timeouts[lane] = self.timeouts.get(lane, 0) + 1
            if not future.cancel() and runner is not None and runner.abandon(lane):
                self._stuck[runner] = lane
        log.warning("nvml call timed out lane=%s deadline=%.3gs: runner abandoned", lane, deadline)
        return NvmlTimeoutError(f"NVML call on {lane} took longer than {deadline:g}s")

    def _hand(self, relay: Relay) -> None:
        """Give the relay's remaining calls to an idle runner, or a new one."""
        with self._lock:
            runner = self._idle.pop() if self._idle else None
        if runner is None:
            runner = Runner(self._runner_done)
        relay.take_over(runner)
        runner.submit(relay)

    def _runner_done(self, runner: Runner) -> None:
        """A runner's relay is over (or it was abandoned, and its call has now returned)."""
        with self._lock:
            lane = self._stuck.pop(runner, None)
            idle = not runner.abandoned and not self._closed and len(self._idle) < IDLE_RUNNERS
            if lane is None and idle:
                self._idle.append(runner)
                return
        if lane is not None:
            log.info("nvml call on %s returned after its deadline; lane usable again", lane)
        if not runner.abandoned:
            runner.stop()

    def _check_lane(self, lane: str) -> None:
        with self._lock:
            self._check_lane_locked(lane)

    def _check_lane_locked(self, lane: str) -> None:
        if lane in self._stuck.values():
            raise LaneStuckError(f"an earlier NVML call on {lane} is still stuck")
        if len(self._stuck) >= self._max_stuck:
            raise LaneStuckError(f"{len(self._stuck)} NVML calls are stuck; not starting another")

    def _worker_for(self, lane: str) -> Worker:
        with self._lock:
            self._check_lane_locked(lane)
            worker = self._workers.get(lane)
            if worker is None:
                worker = self._workers[lane] = Worker(f"nvml-{lane}", self._freed_callback(lane))
            return worker

    def abandon(self, lane: str, waited: float) -> None:
        """Give up on the call the lane's worker runs, for a caller that judges its own
        deadline: the worker is abandoned as one past its deadline is, and the lane takes no
        call until that call returns."""
        with self._lock:
            worker = self._workers.get(lane)
        if worker is not None:
            self._timed_out(lane, worker, waited)

    def _timed_out(self, lane: str, worker: Worker, deadline: float) -> NvmlTimeoutError:
        """Abandon the lane's worker, whose call is past its deadline."""
        with self._lock:
            self.timeouts[lane] = self.timeouts.get(lane, 0) + 1
            self._workers.pop(lane, None)
            if worker.abandon():
                self._stuck[worker] = lane
            else:
                worker.stop()
        log.warning("nvml call timed out lane=%s deadline=%.3gs: worker abandoned", lane, deadline)
        return NvmlTimeoutError(f"NVML call on {lane} took longer than {deadline:g}s")

    def _freed_callback(self, lane: str) -> Callable[[Worker], None]:
        def freed(worker: Worker) -> None:
            with self._lock:
                self._stuck.pop(worker, None)
            log.info("nvml call on %s returned after its deadline; lane usable again", lane)

        return freed

    def close(self) -> None:
        """Stop every thread that is idle; a runner still busy stops when its calls return."""
        with self._lock:
            self._closed = True
            for worker in self._workers.values():
                worker.stop()
            self._workers.clear()
            for runner in self._idle:
                runner.stop()
            self._idle.clear()
