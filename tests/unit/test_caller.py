"""The NVML deadline wrapper: timeouts abandon the worker, other lanes carry on, bounded."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gpuwatch.clock import SystemClock
from gpuwatch.nvml.caller import LaneStuckError, NvmlCaller, NvmlTimeoutError


async def test_results_and_errors_come_back() -> None:
    caller = NvmlCaller(SystemClock(), max_stuck=4)
    assert await caller.call("gpu0", 1.0, lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ZeroDivisionError):
        await caller.call("gpu0", 1.0, lambda: 1 / 0)
    caller.close()


async def test_a_hung_call_is_abandoned_and_its_lane_refuses_until_it_returns() -> None:
    caller = NvmlCaller(SystemClock(), max_stuck=4)
    release = threading.Event()
    with pytest.raises(NvmlTimeoutError):
        await caller.call("gpu1", 0.05, release.wait)
    assert caller.timeouts == {"gpu1": 1}
    assert caller.stuck_workers == 1
    # The stuck lane takes no new calls (no thread pile-up); the others are unaffected.
    with pytest.raises(LaneStuckError):
        await caller.call("gpu1", 0.05, lambda: 1)
    assert await caller.call("gpu0", 1.0, lambda: "ok") == "ok"
    release.set()
    for _ in range(100):
        if caller.stuck_workers == 0:
            break
        await asyncio.sleep(0.01)
    assert caller.stuck_workers == 0
    assert await caller.call("gpu1", 1.0, lambda: "back") == "back"
    caller.close()


async def test_stuck_workers_are_bounded_across_lanes() -> None:
    caller = NvmlCaller(SystemClock(), max_stuck=2)
    release = threading.Event()
    for lane in ("gpu0", "gpu1"):
        with pytest.raises(NvmlTimeoutError):
            await caller.call(lane, 0.02, release.wait)
    with pytest.raises(LaneStuckError, match="2 NVML calls are stuck"):
        await caller.call("gpu2", 1.0, lambda: 1)
    release.set()
    caller.close()
