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
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from gpuwatch.clock import Clock

T = TypeVar("T")
log = logging.getLogger(__name__)


class NvmlTimeoutError(Exception):
    """The call did not answer within its deadline; its worker was abandoned."""


class LaneStuckError(Exception):
    """An earlier call on this lane is still stuck, or too many workers are stuck overall."""


_Job = tuple[Callable[..., Any], tuple[Any, ...], "concurrent.futures.Future[Any]"]


class _Worker:
    def __init__(self, name: str, on_freed: Callable[[_Worker], None]) -> None:
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
            fn, args, future = job
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._busy = True
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the awaiting coroutine, never swallowed
                future.set_exception(exc)
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
        with self._lock:
            if lane in self._stuck:
                raise LaneStuckError(f"an earlier NVML call on {lane} is still stuck")
            if len(self._stuck) >= self._max_stuck:
                raise LaneStuckError(
                    f"{len(self._stuck)} NVML calls are stuck; not starting another"
                )
            worker = self._workers.get(lane)
            if worker is None:
                worker = self._workers[lane] = _Worker(f"nvml-{lane}", self._freed_callback(lane))
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        worker.submit((fn, args, future))
        try:
            return await self._clock.wait_for(asyncio.wrap_future(future), deadline)
        except TimeoutError:
            with self._lock:
                self.timeouts[lane] = self.timeouts.get(lane, 0) + 1
                self._workers.pop(lane, None)
                if worker.abandon():
                    self._stuck[lane] = worker
                else:
                    worker.stop()
            log.warning(
                "nvml call timed out lane=%s deadline=%.3gs: worker abandoned", lane, deadline
            )
            raise NvmlTimeoutError(f"NVML call on {lane} took longer than {deadline:g}s") from None

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
