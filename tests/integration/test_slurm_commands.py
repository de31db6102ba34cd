"""Slurm's commands as the drainer runs them, stood in for by shell scripts: a hung one killed
at its deadline, a failure's words, output past the cap, and a resume that fails retried on
its backoff. Real processes and the time they take, so not a unit test."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwatch.actions.config import SlurmActions
from gpuwatch.actions.drainer import RECHECK_S, SlurmDrainer
from gpuwatch.actions.slurm import (
    SlurmCli,
    SlurmError,
)
from gpuwatch.clock import ManualClock
from gpuwatch.health.verdict import Cause, Health, Verdict
from gpuwatch.model import Sample

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "sinfo-22.05.8.txt"
NOW = 1_800_000_000.0


def script(tmp_path: Path, body: str, name: str = "scontrol") -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_hung_command_is_killed_at_its_deadline(tmp_path: Path) -> None:
    cli = SlurmCli(script(tmp_path, "exec sleep 30"), "sinfo", timeout=0.3)
    with pytest.raises(SlurmError, match=r"no answer within 0.3s"):
        asyncio.run(cli.drain("n1", "gpuwatch: x"))


def test_a_failed_command_says_what_slurm_said(tmp_path: Path) -> None:
    body = 'echo "slurm_update error: Invalid node name specified" >&2; exit 1'
    cli = SlurmCli(script(tmp_path, body), "sinfo", timeout=5)
    with pytest.raises(SlurmError, match=r"exit status 1: slurm_update error: Invalid node name"):
        asyncio.run(cli.resume("n1"))
    missing = SlurmCli(str(tmp_path / "nowhere"), "sinfo", timeout=5)
    with pytest.raises(SlurmError, match=r"cannot run it"):
        asyncio.run(missing.resume("n1"))


def test_output_past_the_cap_is_refused(tmp_path: Path) -> None:
    cli = SlurmCli("scontrol", script(tmp_path, "head -c 17000000 /dev/zero"), timeout=10)
    with pytest.raises(SlurmError, match=r"printed more than"):
        asyncio.run(cli.nodes(partitions=["gpu"]))


async def test_a_failing_resume_is_retried_on_the_backoff_not_every_cycle(tmp_path: Path) -> None:
    # sinfo replays the capture (gw2: drained by gpuwatch); scontrol fails, as without root.
    sinfo = script(tmp_path, f"cat {CAPTURE}", "sinfo")
    calls = tmp_path / "calls"
    body = f"echo x >> {calls}\necho 'Access/permission denied' >&2\nexit 1"
    scontrol = script(tmp_path, body)
    clock = ManualClock(NOW)
    config = SlurmActions(enabled=True, drain_on=("gpu-lost",), resume_after=60.0)
    drainer = SlurmDrainer(
        config, "gw2", clock, lambda _: None, SlurmCli(scontrol, sinfo, timeout=5)
    )
    await drainer.start()
    try:
        healthy = Verdict(Health.HEALTHY)
        for _ in range(3):  # healthy for 90 s: past resume_after
            drainer.observe(clock.now(), healthy)
            clock.advance(30.0)
        drainer.observe(clock.now(), healthy)
        await wait_until(lambda: calls.exists() and len(calls.read_text().split()) == 1)
        for _ in range(20):  # cycles within the 5 s backoff: no new try
            clock.advance(0.2)
            drainer.observe(clock.now(), healthy)
            await asyncio.sleep(0.005)
        clock.advance(1.5)
        await wait_until(lambda: len(calls.read_text().split()) == 2)
        failures = Sample("gpuwatch_action_failures_total", (("scheduler", "slurm"),), 2.0)
        await wait_until(lambda: drainer.samples()[0] == failures)
    finally:
        await drainer.stop()


async def test_without_resume_the_drained_metric_ends_when_an_admin_resumes(
    tmp_path: Path,
) -> None:
    answer = tmp_path / "sinfo.txt"
    answer.write_text(CAPTURE.read_text())  # gw2: drained by gpuwatch
    sinfo = script(tmp_path, f"cat {answer}", "sinfo")
    clock = ManualClock(NOW)
    config = SlurmActions(enabled=True, drain_on=("gpu-lost",), resume=False)
    drainer = SlurmDrainer(
        config, "gw2", clock, lambda _: None, SlurmCli(script(tmp_path, "exit 1"), sinfo, timeout=5)
    )
    lost = Cause("gpu-lost", Health.UNHEALTHY, "GPU 1 is lost", "drain the node")

    def drained() -> bool:
        return any(s.name == "gpuwatch_action_node_drained" for s in drainer.samples())

    await drainer.start()
    try:
        drainer.observe(clock.now(), Verdict(Health.UNHEALTHY, (lost,)))
        await wait_until(drained)  # out already, by gpuwatch: kept track of
        drainer.observe(clock.now(), Verdict(Health.HEALTHY))
        clock.advance(RECHECK_S)
        await asyncio.sleep(0.05)
        assert drained()  # healthy, but nobody has resumed it
        lines = CAPTURE.read_text().splitlines()
        lines[1] = "\x1f".join(["gw2", "gpu*", "idle", "Unknown", "none"])
        answer.write_text("\n".join(lines) + "\n")  # the admin resumed it
        clock.advance(RECHECK_S)
        await wait_until(lambda: not drained())
    finally:
        await drainer.stop()


async def wait_until(check: Callable[[], bool]) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not met")
