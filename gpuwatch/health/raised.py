"""Causes raised by alerts. A firing alert whose rule gives it a `cause` label is a cause of
its GPU's verdict (of the node's when it names no GPU the node lists): unhealthy when its
severity is critical (or page, error, high), degraded otherwise; `info` alerts raise nothing.
The reason is the alert's summary and the action its `action` annotation; its
`cause_fingerprint` annotation, where the rule has one, says when an acknowledgement stops
holding (a count that grows is news again).

So whatever needs a threshold or a window (error rates, page counts, how long a GPU has not
answered) is decided once, in the rule pack, for the alert and the verdict alike; an operator
who tunes a rule tunes both."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpuwatch.health.verdict import SEVERITY, Cause, Health, as_action

# The `severity` labels the rule packs and Alertmanager configs commonly use. Any other value
# (warning, major, none given) makes the cause degraded: something is wrong, and the rule does
# not say it is an emergency.
UNHEALTHY_SEVERITIES = frozenset({"critical", "page", "error", "high"})
SILENT_SEVERITIES = frozenset({"info", "none", "ok"})  # raise no cause


def health_of(severity: str) -> Health | None:
    level = severity.strip().lower()
    if level in SILENT_SEVERITIES:
        return None
    return Health.UNHEALTHY if level in UNHEALTHY_SEVERITIES else Health.DEGRADED


@dataclass(frozen=True, slots=True)
class RaisedCause:
    uuid: str  # the GPU's the alert names; "" when it names none
    cause: Cause


def raised_causes(
    firing: Iterable[tuple[Mapping[str, str], Mapping[str, str]]],
) -> list[RaisedCause]:
    """The causes among firing alerts, given as (labels, annotations)."""
    out: list[RaisedCause] = []
    for labels, notes in firing:
        key = labels.get("cause", "")
        state = health_of(labels.get("severity", ""))
        if not key or state is None:
            continue
        reason = notes.get("summary") or labels.get("alertname", key)
        cause = Cause(
            key,
            state,
            reason,
            as_action(notes.get("action", "")),
            notes.get("cause_fingerprint", ""),
        )
        out.append(RaisedCause(labels.get("uuid", ""), cause))
    return out


def merged(seen: list[Cause], raised: Iterable[Cause]) -> list[Cause]:
    """One cause per key. Where an alert and a reading name the same cause (an unresponsive
    GPU, then GpuUnresponsive firing), the worse state and its action win and the reading's
    more particular reason stays; among alerts (one per NVLink link), the worst."""
    out = list(seen)
    where = {c.key: i for i, c in enumerate(out)}
    for cause in raised:
        i = where.get(cause.key)
        if i is None:
            where[cause.key] = len(out)
            out.append(cause)
        elif SEVERITY[cause.state] > SEVERITY[out[i].state]:
            out[i] = replace(cause, reason=out[i].reason) if i < len(seen) else cause
    return out
