"""The NVML deadline wrapper: timeouts abandon the worker, other lanes carry on, bounded."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from gpuwatch.clock import ManualClock, SystemClock
from gpuwatch.nvml.caller import MAX_STRETCH, LaneStuckError, NvmlCaller, NvmlTimeoutError
from gpuwatch.nvml.cpu_wait import SchedstatWait


async def _until_unstuck(caller: NvmlCaller, seconds: float) -> None:
    """Until the stuck calls have returned (up to `seconds`), then that they have."""
    for _ in range(round(seconds / 0.01)):
        if caller.stuck_workers == 0:
            break
        await asyncio.sleep(0.01)
    assert caller.stuck_workers == 0


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
    await _until_unstuck(caller, 1.0)
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


async def test_many_calls_at_once_each_get_their_own_outcome_within_the_deadline() -> None:
    caller = NvmlCaller(SystemClock(), max_stuck=4)
    release = threading.Event()
    with pytest.raises(NvmlTimeoutError):
        await caller.call("gpu3", 0.02, release.wait)  # gpu3 is stuck from here on
    # Real time, not the loop's: uvloop's clock counts whole milliseconds, and the 0.2 s it
    # measured for the deadline came out as 0.19999999999708962.
    started = time.monotonic()
    results = await caller.call_many(
        0.2,
        [
            ("gpu0", lambda a: a * 2, (21,)),
            ("gpu1", lambda: 1 / 0, ()),
            ("gpu2", release.wait, ()),  # hangs past the deadline
            ("gpu3", lambda: "never run", ()),
            ("gpu4", str.upper, ("ok",)),
        ],
    )
    took = time.monotonic() - started
    assert results[0] == 42
    assert isinstance(results[1], ZeroDivisionError)
    assert isinstance(results[2], NvmlTimeoutError)
    assert isinstance(results[3], LaneStuckError)
    assert results[4] == "OK"
    assert 0.2 <= took < 1.0
    assert caller.timeouts == {"gpu3": 1, "gpu2": 1}
    release.set()
    caller.close()


async def test_many_calls_return_as_soon_as_the_last_one_finishes() -> None:
    caller = NvmlCaller(SystemClock(), max_stuck=4)
    loop = asyncio.get_running_loop()
    started = loop.time()
    results = await caller.call_many(5.0, [(f"gpu{i}", lambda i=i: i, ()) for i in range(64)])
    assert results == list(range(64))
    assert loop.time() - started < 1.0  # not the 5 s deadline
    assert await caller.call_many(5.0, []) == []
    caller.close()


async def test_many_calls_take_turns_and_a_hung_one_holds_the_next_only_briefly() -> None:
    """Reads running at once contend for the interpreter lock at every NVML call, so the calls
    of one cycle take turns; a call that hangs holds the next one for deadline / 2n of the
    clock's time, not for the deadline."""
    clock = ManualClock()
    caller = NvmlCaller(clock, max_stuck=4)
    running: list[int] = []
    overlaps: list[list[int]] = []
    lock = threading.Lock()

    def read(gpu: int) -> int:
        with lock:
            running.append(gpu)
            overlaps.append(list(running))
        time.sleep(0.002)
        with lock:
            running.remove(gpu)
        return gpu

    results = await caller.call_many(8.0, [(f"gpu{i}", read, (i,)) for i in range(8)])
    assert results == list(range(8))
    assert overlaps == [[i] for i in range(8)]  # one at a time, in order
    release = threading.Event()
    calls = [("gpu0", release.wait, ()), *((f"gpu{i}", read, (i,)) for i in range(1, 4))]
    task = asyncio.ensure_future(caller.call_many(8.0, calls))
    await asyncio.sleep(0.2)
    assert not task.done() and running == []  # gpu1 waits its turn behind the hung gpu0
    clock.advance(1.0)  # deadline 8 s over 4 calls: a turn is held at most 1 s
    for _ in range(500):  # gpu3 started and finished
        if len(overlaps) == 11 and not running:
            break
        await asyncio.sleep(0.01)
    assert overlaps[8:] == [[1], [2], [3]]
    clock.advance(8.0)
    results = await task
    assert isinstance(results[0], NvmlTimeoutError) and results[1:] == [1, 2, 3]
    release.set()
    caller.close()


async def test_a_cycle_of_calls_runs_in_one_thread_that_is_kept_for_the_next() -> None:
    """Handing each call to a thread of its own cost a thread switch a call."""
    caller = NvmlCaller(SystemClock(), max_stuck=4)
    calls = [(f"gpu{i}", threading.get_ident, ()) for i in range(8)]
    first = await caller.call_many(5.0, calls)
    second = await caller.call_many(5.0, calls)
    assert len(set(first)) == 1 and set(first) == set(second)
    assert threading.get_ident() not in first
    caller.close()


async def test_a_call_many_lane_past_its_deadline_refuses_until_its_call_returns() -> None:
    clock = ManualClock()
    caller = NvmlCaller(clock, max_stuck=4)
    release = threading.Event()
    calls = [("gpu0", lambda: 0, ()), ("gpu1", release.wait, ()), ("gpu2", lambda: 2, ())]
    task = asyncio.ensure_future(caller.call_many(3.0, calls))
    for _ in range(400):  # the hung call holds gpu2 for 3 / 6 s, then the deadline passes
        if task.done():
            break
        clock.advance(0.1)
        await asyncio.sleep(0.005)
    results = task.result()
    assert results[0] == 0 and isinstance(results[1], NvmlTimeoutError) and results[2] == 2
    assert caller.stuck_workers == 1 and caller.timeouts == {"gpu1": 1}
    again = await caller.call_many(3.0, calls)
    assert isinstance(again[1], LaneStuckError) and again[0::2] == [0, 2]
    with pytest.raises(LaneStuckError):
        await caller.call("gpu1", 1.0, lambda: 1)
    release.set()
    await _until_unstuck(caller, 2.0)
    assert await caller.call_many(3.0, calls) == [0, True, 2]
    caller.close()


async def test_close_during_a_cycle_leaves_no_thread_once_its_call_returns() -> None:
    """Shutting down cancels the sampling task mid-cycle and then closes the caller: the
    runner still in a call stops when the call returns, instead of waiting for a next cycle."""
    caller = NvmlCaller(SystemClock(), max_stuck=4)
    release, started = threading.Event(), threading.Event()
    before = set(threading.enumerate())

    def hang() -> None:
        started.set()
        release.wait()

    task = asyncio.ensure_future(caller.call_many(5.0, [("gpu0", hang, ()), ("gpu1", int, ())]))
    for _ in range(500):
        if started.is_set():
            break
        await asyncio.sleep(0.01)
    runners = [t for t in threading.enumerate() if t not in before]
    assert [t.name for t in runners] == ["nvml-runner"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    caller.close()
    release.set()
    for runner in runners:
        runner.join(2.0)
    assert not any(t.is_alive() for t in runners)


class _Waits:
    """CpuWait whose process has waited `waited` seconds for a CPU so far."""

    def __init__(self) -> None:
        self.waited = 0.0

    def mark(self) -> dict[str, int]:
        return {"1": round(self.waited * 1e9)}

    def since(self, mark: dict[str, int]) -> float:
        return self.waited - mark["1"] / 1e9


async def _drive(
    task: asyncio.Future[list[object]], clock: ManualClock, waits: _Waits, starved: bool
) -> float:
    """Advance the clock 1/8 s at a time (sums of which floats hold exactly) until the calls
    come back, the process waiting for a CPU all that time when `starved`; the clock time
    they took."""
    started = clock.now()
    for _ in range(200):
        if task.done():
            break
        clock.advance(0.125)
        waits.waited += 0.125 if starved else 0.0
        await asyncio.sleep(0.005)
    return clock.now() - started


async def test_calls_slowed_by_a_cpu_starved_host_are_not_abandoned() -> None:
    """Other processes saturating the CPUs slow every call; the time the daemon waited for a
    CPU is added to the deadline, so the slow calls come back instead of paging."""
    clock, waits = ManualClock(), _Waits()
    caller = NvmlCaller(clock, max_stuck=4, cpu_wait=waits)
    release = threading.Event()
    task = asyncio.ensure_future(
        caller.call_many(1.0, [("gpu0", release.wait, ()), ("gpu1", int, ())])
    )
    for _ in range(25):  # 2.5 s of the clock, the process starved throughout
        clock.advance(0.1)
        waits.waited += 0.1
        await asyncio.sleep(0.005)
    assert not task.done()
    release.set()
    results = await task
    assert results == [True, 0]
    assert caller.timeouts == {} and caller.stretched_s >= 1.4
    caller.close()


@pytest.mark.parametrize(
    ("starved", "at_least", "at_most", "granted"),
    [
        (False, 1.0, 1.125, 0.0),  # the process waits for nothing: at its deadline
        # A driver can hang while the host is also busy: the deadline grows by the process's
        # wait for a CPU only up to MAX_STRETCH deadlines.
        (True, 1.0 + MAX_STRETCH, 1.0 + MAX_STRETCH + 0.25, MAX_STRETCH),
    ],
)
async def test_a_hung_call_times_out_within_its_deadline_and_the_bound(
    starved: bool, at_least: float, at_most: float, granted: float
) -> None:
    clock, waits = ManualClock(), _Waits()
    caller = NvmlCaller(clock, max_stuck=4, cpu_wait=waits)
    release = threading.Event()
    task = asyncio.ensure_future(caller.call_many(1.0, [("gpu0", release.wait, ())]))
    took = await _drive(task, clock, waits, starved=starved)
    assert isinstance(task.result()[0], NvmlTimeoutError)
    assert at_least <= took <= at_most
    assert caller.stretched_s == pytest.approx(granted)
    release.set()
    caller.close()


def test_the_kernel_counts_each_threads_wait_for_a_cpu(tmp_path: Path) -> None:
    """The scheduler's own counts: every thread of this process has one, and what the
    process waited since a mark is the threads' waits added up, a thread started since
    counting whole."""
    real = SchedstatWait()
    mark = real.mark()
    assert mark is not None and str(threading.get_native_id()) in mark
    assert real.since(mark) >= 0.0
    tasks = tmp_path / "task"
    for tid, line in (("10", "500 2000000000 3"), ("11", "1 500000000 1")):
        (tasks / tid).mkdir(parents=True)
        (tasks / tid / "schedstat").write_text(line + "\n")
    fake = SchedstatWait(str(tasks))
    before = fake.mark()
    assert before == {"10": 2_000_000_000, "11": 500_000_000}
    (tasks / "10" / "schedstat").write_text("900 2750000000 9\n")
    (tasks / "12").mkdir()
    (tasks / "12" / "schedstat").write_text("5 250000000 1\n")  # a thread started since
    assert fake.since(before) == pytest.approx(1.0)
