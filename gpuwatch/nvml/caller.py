"""Every NVML call goes through here: off the event loop, in a per-GPU worker, with a deadline.

A wedged driver leaves the calling thread in uninterruptible sleep; nothing can kill it. So a
call past its deadline is abandoned: its worker is left to finish whenever it can, the lane
gets a fresh worker for later calls, and the caller learns of the timeout at once. A lane with
an abandoned call still stuck takes no new calls (that GPU is reported unresponsive without
piling up threads), and the number of stuck workers across all lanes is bounded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from gpuwatch.clock import Clock

T = TypeVar("T")
log = logging.getLogger(__name__)


class NvmlTimeoutError(Exception):
    """The call did not answer within its deadline; its worker was abandoned."""


class LaneStuckError(Exception):
    """An earlier call on this lane is still stuck, or too many workers are stuck overall."""


# A call after which another may start: set when it starts, set when it has finished.
_Turn = tuple[threading.Event, threading.Event]
# fn, its arguments, its future, its turn; the turn of the call to let finish first, waiting
# at most `hold` of the clock's time once that one has started; the calls' deadline.
_Job = tuple[
    Callable[..., Any],
    tuple[Any, ...],
    "concurrent.futures.Future[Any]",
    _Turn,
    _Turn | None,
    float,
    float,
]
Call = tuple[str, Callable[..., Any], tuple[Any, ...]]  # lane, function, arguments


class _Worker:
    def __init__(self, name: str, on_freed: Callable[[_Worker], None], clock: Clock) -> None:
        self._clock = clock
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._busy = False
        self._abandoned = False
        self._on_freed = on_freed
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, job: _Job) -> None:
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
            fn, args, future, (started, finished), after, hold, deadline = job
            if after is not None:
                # The call before starts within `hold` of the one before it, and so on: well
                # within the deadline, which bounds this wait all the same.
                self._clock.block_until(after[0], deadline)
                self._clock.block_until(after[1], hold)
            started.set()
            if not future.set_running_or_notify_cancel():
                finished.set()
                continue
            with self._lock:
                self._busy = True
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the awaiting coroutine, never swallowed
                future.set_exception(exc)
            finished.set()
            with self._lock:
                self._busy = False
                if self._abandoned:
                    break
        if self._abandoned:
            self._on_freed(self)


class NvmlCaller:
    """Runs NVML calls in one worker thread per lane (a GPU, or the driver) with deadlines."""

    def __init__(self, clock: Clock, max_stuck: int) -> None:
        self._clock = clock
        self._max_stuck = max_stuck
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}
        self._stuck: dict[str, _Worker] = {}
        self.timeouts: dict[str, int] = {}

    @property
    def stuck_workers(self) -> int:
        with self._lock:
            return len(self._stuck)

    async def call(self, lane: str, deadline: float, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) in the lane's worker; raises NvmlTimeoutError past `deadline` clock-seconds."""
        worker = self._worker_for(lane)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        worker.submit(
            (fn, args, future, (threading.Event(), threading.Event()), None, 0.0, deadline)
        )
        try:
            return await self._clock.wait_for(asyncio.wrap_future(future), deadline)
        except TimeoutError:
            raise self._timed_out(lane, worker, deadline) from None

    async def call_many(self, deadline: float, calls: Sequence[Call]) -> list[Any]:
        """Each (lane, fn, args) in its lane's worker, all at once, awaited together: the event
        loop is woken once, when the last one finishes, not once per call (at 64 GPUs and 10 Hz
        the per-call wake-ups were a sixth of the daemon's time). Returns, in order, each call's
        value or the exception it raised; NvmlTimeoutError for one past `deadline`,
        LaneStuckError for a lane that takes no call.

        The calls run one after another, each in its own lane, a call starting when the one
        before it has finished or has taken deadline / 2n: Python threads reading at once
        contend for the interpreter lock at every NVML call (each releases it), which cost
        more CPU than the reads (8.4 ms a cycle more at 8 simulated GPUs). A hung GPU delays
        the ones after it by that hold only, and slow reads still overlap."""
        loop = asyncio.get_running_loop()
        all_done: asyncio.Future[None] = loop.create_future()
        results: list[Any] = [None] * len(calls)
        pending: dict[int, tuple[str, _Worker, concurrent.futures.Future[Any]]] = {}
        lock = threading.Lock()
        # Calls not finished, under `lock`, plus one held until all are submitted: a call that
        # finishes before the next is submitted must not wake the loop early.
        left = [1]

        def wake() -> None:
            if not all_done.done():
                all_done.set_result(None)

        def finished(_: object = None) -> None:  # in the worker's thread, but for the last
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile
                    loop.call_soon_threadsafe(wake)

        hold = deadline / (2 * max(1, len(calls)))
        before: _Turn | None = None
        for i, (lane, fn, args) in enumerate(calls):
            try:
                worker = self._worker_for(lane)
            except LaneStuckError as exc:
                results[i] = exc
                continue
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            pending[i] = (lane, worker, future)
            with lock:
                left[0] += 1
            future.add_done_callback(finished)
            turn = (threading.Event(), threading.Event())
            worker.submit((fn, args, future, turn, before, hold, deadline))
            before = turn
        finished()
        with contextlib.suppress(TimeoutError):
            await self._clock.wait_for(all_done, deadline)
        for i, (lane, worker, future) in pending.items():
            if not future.done():
                results[i] = self._timed_out(lane, worker, deadline)
            else:
                error = future.exception()
                results[i] = error if error is not None else future.result()
        return results

    def _worker_for(self, lane: str) -> _Worker:
        with self._lock:
            if lane in self._stuck:
                raise LaneStuckError(f"an earlier NVML call on {lane} is still stuck")
            if len(self._stuck) >= self._max_stuck:
                raise LaneStuckError(
                    f"{len(self._stuck)} NVML calls are stuck; not starting another"
                )
            worker = self._workers.get(lane)
            if worker is None:
                worker = self._workers[lane] = _Worker(
                    f"nvml-{lane}", self._freed_callback(lane), self._clock
                )
            return worker

    def _timed_out(self, lane: str, worker: _Worker, deadline: float) -> NvmlTimeoutError:
        """Abandon the lane's worker, whose call is past its deadline."""
        with self._lock:
            self.timeouts[lane] = self.timeouts.get(lane, 0) + 1
            self._workers.pop(lane, None)
            if worker.abandon():
                self._stuck[lane] = worker
            else:
                worker.stop()
        log.warning("nvml call timed out lane=%s deadline=%.3gs: worker abandoned", lane, deadline)
        return NvmlTimeoutError(f"NVML call on {lane} took longer than {deadline:g}s")

    def _freed_callback(self, lane: str) -> Callable[[_Worker], None]:
        def freed(worker: _Worker) -> None:
            with self._lock:
                if self._stuck.get(lane) is worker:
                    del self._stuck[lane]
            log.info("nvml call on %s returned after its deadline; lane usable again", lane)

        return freed

    def close(self) -> None:
        with self._lock:
            for worker in self._workers.values():
                worker.stop()
            self._workers.clear()
