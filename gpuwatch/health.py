"""The verdict on each GPU and on the node: healthy, degraded or unhealthy, with reasons.

This covers what sampling can see (backend down, GPU lost or unresponsive, thermal and power
throttling); the fault catalogue (XID classes, ECC and remapping thresholds, the driver's
recovery action) extends it.
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


@dataclass(frozen=True, slots=True)
class Verdict:
    state: Health
    reasons: list[str] = field(default_factory=list)


def gpu_verdict(gpu: GpuState, active_reasons: set[str]) -> Verdict:
    if gpu.status == GpuStatus.LOST:
        return Verdict(Health.UNHEALTHY, [f"GPU {gpu.info.index} is lost: {gpu.reason}"])
    if gpu.status == GpuStatus.UNRESPONSIVE:
        return Verdict(Health.UNHEALTHY, [f"GPU {gpu.info.index} is unresponsive: {gpu.reason}"])
    reasons = [
        f"GPU {gpu.info.index}: {text}"
        for reason, text in DEGRADING_REASONS.items()
        if reason in active_reasons
    ]
    return Verdict(Health.DEGRADED if reasons else Health.HEALTHY, reasons)


def node_verdict(backend: BackendState, gpus: dict[int, Verdict]) -> Verdict:
    if not backend.up:
        return Verdict(Health.UNHEALTHY, [backend.reason])
    state = Health.HEALTHY
    reasons: list[str] = []
    for verdict in gpus.values():
        if SEVERITY[verdict.state] > SEVERITY[state]:
            state = verdict.state
        reasons.extend(verdict.reasons)
    return Verdict(state, reasons)


def with_sampling_problem(verdict: Verdict, problem: str) -> Verdict:
    """The verdict as of now: stale sampling makes the node unhealthy whatever it last saw."""
    if not problem:
        return verdict
    return Verdict(Health.UNHEALTHY, [problem, *verdict.reasons])


def active_clock_events(samples: list[Sample]) -> dict[str, set[str]]:
    """uuid -> clock-event reasons active in this batch."""
    out: dict[str, set[str]] = {}
    for name, labels, value in samples:
        if name == m.CLOCK_EVENT and value == 1.0:
            d = dict(labels)
            out.setdefault(d["uuid"], set()).add(d["reason"])
    return out


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
