"""The checkpoint advice: given while a cause or firing alert it names holds, said in each
push's answer, journaled once when it starts and once when it ends."""

from __future__ import annotations

import signal
from pathlib import Path

import psutil
import pytest

from gpuwatch.actions.advice import CheckpointAdvisor
from gpuwatch.actions.config import SlurmActions
from gpuwatch.actions.drainer import SlurmDrainer
from gpuwatch.actions.slurm import SlurmNode
from gpuwatch.clock import ManualClock
from gpuwatch.config import load_config
from gpuwatch.health.verdict import Cause, Health, Verdict
from gpuwatch.health.view import NodeView
from gpuwatch.model import (
    BackendState,
    Batch,
    Event,
    GpuInfo,
    GpuProcess,
    GpuState,
    GpuStatus,
)
from gpuwatch.push.http import accepted
from gpuwatch.push.jobs import JobInputs
from gpuwatch.push.registry import PushLimits
from gpuwatch.text.yamlfile import FileError

T0 = 1_800_000_000.0


def view(*keys: str) -> NodeView:
    causes = tuple(Cause(k, Health.UNHEALTHY, f"{k} now", "act") for k in keys)
    return NodeView(None, {}, Verdict(Health.UNHEALTHY if causes else Health.HEALTHY, causes))


def test_advice_starts_changes_and_ends_with_what_it_names() -> None:
    jobs = JobInputs(PushLimits(), None)
    firing: list[str] = []
    events: list[Event] = []
    patterns = ("preemption", "Gpu*Pending", "xid-*")
    advisor = CheckpointAdvisor(patterns, jobs, lambda: firing, events.append)
    advisor.after_cycle(T0, view("nvlink-crc"))  # not named: nothing
    assert jobs.advice is None and accepted("j", 1, jobs.advice)["data"] == {
        "job": "j",
        "series": 1,
    }
    firing.append("GpuRowRemapPending")
    advisor.after_cycle(T0 + 1, view("nvlink-crc"))
    assert jobs.advice is not None and jobs.advice.reasons == ("GpuRowRemapPending",)
    advisor.after_cycle(T0 + 2, view("preemption", "xid-48"))
    assert jobs.advice.reasons == ("preemption", "xid-48", "GpuRowRemapPending")
    assert jobs.advice.since == T0 + 1  # the same advice, more reasons
    assert accepted("j", 1, jobs.advice)["data"]["checkpoint"] == {
        "advised": True,
        "since": "2027-01-15T08:00:01.000000Z",
        "reasons": ["preemption", "xid-48", "GpuRowRemapPending"],
    }
    firing.clear()
    advisor.after_cycle(T0 + 3, view())
    assert jobs.advice is None
    assert [e.kind for e in events] == ["checkpoint_advice", "checkpoint_advice_withdrawn"]
    assert events[0].message == "jobs told to checkpoint: GpuRowRemapPending"


def test_no_patterns_no_advice() -> None:
    jobs = JobInputs(PushLimits(), None)
    advisor = CheckpointAdvisor((), jobs, lambda: ["GpuRowRemapPending"], lambda _: None)
    advisor.after_cycle(T0, view("preemption"))
    assert jobs.advice is None


def test_the_signal_goes_to_the_jobs_processes_that_are_still_theirs() -> None:
    me = psutil.Process()
    started = me.create_time()
    mine = GpuProcess(me.pid, me.name(), "alice", 1e9, "slurm", "7", started)
    reused = GpuProcess(me.pid, me.name(), "bob", 1e9, "slurm", "8", started - 60)  # pid again
    no_job = GpuProcess(me.pid, "nvidia-cuda-mps-server", "root", 1e9, "", "", started)
    gone = GpuProcess(2**22 + 7, "python3", "carol", 1e9, "slurm", "9", started)
    info = GpuInfo(0, "GPU-0", "H100", "0000:01:00.0", "s", "v", 18)
    sent: list[tuple[int, int]] = []

    def kill(pid: int, sig: int) -> None:
        sent.append((pid, sig))

    def told(*processes: GpuProcess) -> list[Event]:
        events: list[Event] = []
        gpus = [GpuState(info, GpuStatus.OK, processes=(p,)) for p in processes]
        batch = Batch("nvml", T0, [], BackendState(True, "nvml"), gpus)
        jobs = JobInputs(PushLimits(), None)
        advisor = CheckpointAdvisor(
            ("preemption",), jobs, list, events.append, signal=signal.SIGUSR1, kill=kill
        )
        for t in (T0, T0 + 1):  # once, as the advice starts
            advisor.after_cycle(t, NodeView(batch, {}, view("preemption").node_verdict))
        return events

    events = told(mine, gone)
    assert sent == [(me.pid, signal.SIGUSR1)]
    assert events[0].message.endswith(f"; SIGUSR1 sent to pids {me.pid}")
    told(reused)
    told(no_job)  # an MPS server's clients would die of it
    assert len(sent) == 1


class FakeSlurm:
    def __init__(self) -> None:
        self.drains: list[str] = []

    async def node(self, name: str) -> SlurmNode:
        return SlurmNode(name, ("gpu",), frozenset({"idle"}), "", None)

    async def nodes(self, partitions: tuple[str, ...] = ()) -> list[SlurmNode]:
        return [await self.node(f"gw{i}") for i in range(1, 9)]

    async def drain(self, name: str, reason: str) -> None:
        self.drains.append(name)


async def test_a_drain_waits_its_grace_after_the_advice() -> None:
    clock = ManualClock(T0)
    slurm = FakeSlurm()
    advised: list[float | None] = [None]
    config = SlurmActions(enabled=True, drain_on=("gpu-lost",))
    drainer = SlurmDrainer(
        config,
        "gw1",
        clock,
        lambda _: None,
        cli=slurm,  # type: ignore[arg-type]
        advised_since=lambda: advised[0],
        grace=60.0,
    )
    lost = Verdict(Health.UNHEALTHY, (Cause("gpu-lost", Health.UNHEALTHY, "GPU 1 is lost", "x"),))
    advised[0] = T0  # told in this very cycle
    drainer.observe(T0, lost)
    await drainer._step()
    assert slurm.drains == [] and drainer._next_check == T0 + 60
    clock.advance(60)
    await drainer._step()
    assert slurm.drains == ["gw1"]
    # Without advice (turned off), the drain goes at once.
    now_drainer = SlurmDrainer(config, "gw1", clock, lambda _: None, cli=slurm, grace=60.0)  # type: ignore[arg-type]
    now_drainer.observe(clock.now(), lost)
    await now_drainer._step()
    assert slurm.drains == ["gw1", "gw1"]


def test_the_config_names_what_advises_the_signal_and_the_grace(tmp_path: Path) -> None:
    path = tmp_path / "gpuwatch.yaml"
    path.write_text(
        "actions:\n  checkpoint: {advise_on: [preemption], signal: USR1, drain_grace: 2m}\n"
    )
    checkpoint = load_config(path).actions.checkpoint
    assert (checkpoint.advise_on, checkpoint.signal, checkpoint.drain_grace) == (
        ("preemption",),
        "USR1",
        120.0,
    )
    assert load_config(None).actions.checkpoint.advise_on[0] == "preemption"  # on by default
    path.write_text("actions:\n  checkpoint: {advise_on: [], signal: KILL}\n")
    with pytest.raises(FileError, match=r"actions\.checkpoint\.signal: expected one of USR1"):
        load_config(path)
