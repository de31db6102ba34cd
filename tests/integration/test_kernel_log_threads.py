"""The kernel log's reader thread: it waits while the loop is behind, says why a missing log is
not fatal, and follows the log again after a stop. Real threads, so not a unit test."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from gpuwatch.clock import ManualClock
from gpuwatch.kernel.watcher import MAX_BATCHES_QUEUED, KernelLog
from gpuwatch.model import Event
from tests.unit.test_kernel_log import directory, gpu_at, kernel_log, records

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."


def test_the_reader_waits_while_the_loop_is_behind(tmp_path: Path) -> None:
    watcher, published, _ = kernel_log(tmp_path, directory(gpu_at(3, "3b")))
    loop = asyncio.new_event_loop()
    watcher._loop = loop
    stop = threading.Event()
    for _ in range(MAX_BATCHES_QUEUED):
        assert watcher._hand_over(records([XID_79]), stop)
    handed: list[bool] = []
    late = threading.Thread(
        target=lambda: handed.append(watcher._hand_over(records([XID_79]), stop))
    )
    late.start()
    late.join(0.3)
    assert late.is_alive() and not published  # waits: the loop has taken none
    loop.run_until_complete(asyncio.sleep(0))  # the loop takes what was queued
    late.join(10)
    assert handed == [True]
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    assert len(published) == 1  # the same record, taken once


async def test_a_missing_kernel_log_says_why_and_is_not_fatal(tmp_path: Path) -> None:
    watcher, _, _ = kernel_log(tmp_path, directory())
    await watcher.start()
    try:
        assert watcher.problem.endswith("kmsg: No such file or directory")
        assert [s.value for s in watcher.collect() if s.name == "gpuwatch_kmsg_up"] == [0.0]
    finally:
        await watcher.stop()


async def test_a_kernel_log_started_again_after_a_stop_follows_the_log(tmp_path: Path) -> None:
    (tmp_path / "kmsg").write_text(f"4,1,1,-;{XID_79}\n")
    arrived = asyncio.Event()
    published: list[Event] = []
    gpus = directory(gpu_at(3, "3B"))
    watcher = KernelLog(
        str(tmp_path / "kmsg"), ManualClock(), lambda e: (published.append(e), arrived.set()), gpus
    )
    await watcher.start()
    await watcher.stop()
    await watcher.start()
    try:
        arrived.clear()
        with (tmp_path / "kmsg").open("a") as log:
            log.write(f"4,2,2,-;{XID_79}\n")
        await asyncio.wait_for(arrived.wait(), 10)  # its thread reads as the file grows
    finally:
        await watcher.stop()
    assert [e.data["kmsg_seq"] for e in published] == [1, 2]
