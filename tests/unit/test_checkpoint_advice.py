"""The checkpoint advice: given while a cause or firing alert it names holds, said in each
push's answer, journaled once when it starts and once when it ends."""

from __future__ import annotations

from gpuwatch.actions.advice import CheckpointAdvisor
from gpuwatch.health.verdict import Cause, Health, Verdict
from gpuwatch.health.view import NodeView
from gpuwatch.model import Event
from gpuwatch.push.http import accepted
from gpuwatch.push.jobs import JobInputs
from gpuwatch.push.registry import PushLimits

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
