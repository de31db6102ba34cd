"""The verdict on each GPU and on the node: healthy, degraded or unhealthy, with the reasons
and what to do about each.

It is judged afresh from every sample, so it clears when its cause does (a GPU reset clears
volatile ECC counts and pending remaps; the driver withdraws its recovery action): never "bad
forever". Thresholds follow NVIDIA's DCGM health watches. Still to come: XID classes, error
rates over time and operator acknowledgement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gpuwatch import metrics as m
from gpuwatch.model import BackendState, GpuState, GpuStatus, Sample


class Health(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"


SEVERITY = {Health.HEALTHY: 0, Health.DEGRADED: 1, Health.UNHEALTHY: 2}

# Clock-event reasons that mean the hardware is protecting itself, not just idling or capping.
DEGRADING_REASONS = {
    "hw_slowdown": "HW slowdown is holding the clocks down",
    "hw_thermal_slowdown": "thermal slowdown: the GPU is too hot",
    "hw_power_brake": "the external power brake is asserted",
}


RETIRED_PAGES_LIMIT = 63  # DCGM: retired pages (SBE + DBE) at or above this is a failure
REMAPPED_UNCORRECTABLE_LIMIT = 512  # DCGM: uncorrectable remapped rows at or above: warning

RECOVERY_ACTIONS = {
    "gpu_reset": (Health.UNHEALTHY, "drain the GPU's jobs and reset the GPU"),
    "node_reboot": (Health.UNHEALTHY, "drain the node and reboot it"),
    "drain_and_reset": (Health.UNHEALTHY, "drain the node, then reset the GPU"),
    "drain_p2p": (Health.DEGRADED, "let jobs finish, start no peer-to-peer work, then reset"),
}


@dataclass(frozen=True, slots=True)
class Verdict:
    state: Health
    reasons: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)  # one per reason, what to do about it


@dataclass
class GpuFacts:
    """What one sample says about a GPU's faults."""

    clock_reasons: set[str] = field(default_factory=set)
    dbe_volatile: float = 0.0
    remap_pending: bool = False
    remap_failed: bool = False
    remapped_uncorrectable: float = 0.0
    retired_pages: float = 0.0
    retired_pending: bool = False
    recovery_action: str = ""
    links_down: list[str] = field(default_factory=list)


def gpu_facts(samples: list[Sample]) -> dict[str, GpuFacts]:
    """uuid -> the fault facts of this batch."""
    out: dict[str, GpuFacts] = {}
    for name, labels, value in samples:
        if name not in _FACT_METRICS:
            continue
        d = dict(labels)
        facts = out.setdefault(d.get("uuid", ""), GpuFacts())
        if name == m.CLOCK_EVENT and value == 1.0:
            facts.clock_reasons.add(d["reason"])
        elif (
            name == m.ECC_ERRORS and d.get("type") == "uncorrected" and d.get("scope") == "volatile"
        ):
            facts.dbe_volatile = value
        elif name == m.ROW_REMAP_PENDING:
            facts.remap_pending = value == 1.0
        elif name == m.ROW_REMAP_FAILED:
            facts.remap_failed = value == 1.0
        elif name == m.REMAPPED_ROWS and d.get("type") == "uncorrectable":
            facts.remapped_uncorrectable = value
        elif name == m.RETIRED_PAGES:
            facts.retired_pages += value
        elif name == m.RETIRED_PAGES_PENDING:
            facts.retired_pending = value == 1.0
        elif name == m.RECOVERY_ACTION and value == 1.0:
            facts.recovery_action = d.get("action", "")
        elif name == m.NVLINK_LINK_UP and value == 0.0:
            facts.links_down.append(d.get("link", "?"))
    return out


_FACT_METRICS = frozenset(
    {
        m.CLOCK_EVENT, m.ECC_ERRORS, m.ROW_REMAP_PENDING, m.ROW_REMAP_FAILED, m.REMAPPED_ROWS,
        m.RETIRED_PAGES, m.RETIRED_PAGES_PENDING, m.RECOVERY_ACTION, m.NVLINK_LINK_UP,
    }
)  # fmt: skip


def _causes(facts: GpuFacts) -> list[tuple[Health, str, str]]:
    """(state, reason, action) for every fault the facts show, worst first."""
    out: list[tuple[Health, str, str]] = []
    bad, warn = Health.UNHEALTHY, Health.DEGRADED
    if facts.recovery_action in RECOVERY_ACTIONS:
        state, action = RECOVERY_ACTIONS[facts.recovery_action]
        out.append((state, f"the driver asks for {facts.recovery_action}", action))
    if facts.dbe_volatile > 0:
        out.append((bad, f"{facts.dbe_volatile:g} uncorrectable ECC errors since the last reset",
                    "drain the GPU's jobs and reset the GPU"))  # fmt: skip
    if facts.remap_failed:
        out.append((bad, "row remapping failed: no spare rows left", "take the GPU out; RMA it"))
    if facts.retired_pages >= RETIRED_PAGES_LIMIT:
        out.append((bad, f"{facts.retired_pages:g} retired memory pages", "RMA the GPU"))
    if facts.links_down:
        links = ", ".join(facts.links_down)
        out.append((bad, f"NVLink {links} down", "drain, reset the GPU and check the link"))
    if facts.remap_pending:
        out.append((warn, "a row remap waits for a GPU reset", "reset the GPU when it is idle"))
    if facts.retired_pending:
        out.append((warn, "a page retirement waits for a GPU reset", "reset the GPU when idle"))
    if facts.remapped_uncorrectable >= REMAPPED_UNCORRECTABLE_LIMIT:
        out.append((warn, f"{facts.remapped_uncorrectable:g} rows remapped for uncorrectable "
                    "errors", "plan to replace the GPU"))  # fmt: skip
    for reason, text in DEGRADING_REASONS.items():
        if reason in facts.clock_reasons:
            out.append((warn, text, "check cooling and power"))
    out.sort(key=lambda c: -SEVERITY[c[0]])
    return out


def gpu_verdict(gpu: GpuState, facts: GpuFacts) -> Verdict:
    index = gpu.info.index
    if gpu.status == GpuStatus.LOST:
        return Verdict(
            Health.UNHEALTHY,
            [f"GPU {index} is lost: {gpu.reason}"],
            ["drain the node and reboot it; reseat or RMA the GPU if it stays lost"],
        )
    if gpu.status == GpuStatus.UNRESPONSIVE:
        return Verdict(
            Health.UNHEALTHY,
            [f"GPU {index} is unresponsive: {gpu.reason}"],
            ["drain the node; reset the GPU, or reboot if the reset hangs"],
        )
    causes = _causes(facts)
    if not causes:
        return Verdict(Health.HEALTHY)
    return Verdict(
        causes[0][0], [f"GPU {index}: {reason}" for _, reason, _ in causes], [a for *_, a in causes]
    )


def node_verdict(backend: BackendState, gpus: dict[int, Verdict]) -> Verdict:
    if not backend.up:
        return Verdict(Health.UNHEALTHY, [backend.reason])
    state = Health.HEALTHY
    reasons: list[str] = []
    actions: list[str] = []
    for verdict in gpus.values():
        if SEVERITY[verdict.state] > SEVERITY[state]:
            state = verdict.state
        reasons.extend(verdict.reasons)
        actions.extend(verdict.actions)
    return Verdict(state, reasons, actions)


def with_sampling_problem(verdict: Verdict, problem: str) -> Verdict:
    """The verdict as of now: stale sampling makes the node unhealthy whatever it last saw."""
    if not problem:
        return verdict
    return Verdict(
        Health.UNHEALTHY,
        [problem, *verdict.reasons],
        ["check the daemon's log; restart it if it is wedged", *verdict.actions],
    )


def health_samples(
    gpus: list[GpuState], verdicts: dict[int, Verdict], node: Verdict
) -> list[Sample]:
    out: list[Sample] = []
    for gpu in gpus:
        verdict = verdicts[gpu.info.index]
        for state in Health:
            out.append(
                Sample(
                    m.GPU_HEALTH,
                    (*gpu.info.labels, ("state", state.value)),
                    1.0 if verdict.state == state else 0.0,
                )
            )
    for state in Health:
        out.append(
            Sample(m.NODE_HEALTH, (("state", state.value),), 1.0 if node.state == state else 0.0)
        )
    return out
