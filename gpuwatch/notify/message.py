"""One notification as the formats see it: a group of alerts for one receiver, with what a
person needs to act on them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuwatch.model import Labels, NotifyAlert
from gpuwatch.text.units import ascii_int
from gpuwatch.xid.known import lookup


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    model: str
    serial: str
    uuid: str
    jobs: str = ""  # `Slurm job 81234 of alice`: whose work runs on it


@dataclass(frozen=True, slots=True)
class Notification:
    receiver: str
    group_key: str
    group_labels: Labels
    alerts: tuple[NotifyAlert, ...]  # firing first, then resolved
    time: float
    node: str
    external_url: str = ""
    runbook_url: str = ""
    gpus: Mapping[str, GpuIdentity] = field(default_factory=dict)  # by GPU index

    @property
    def status(self) -> str:
        return "firing" if any(a.firing for a in self.alerts) else "resolved"

    @property
    def firing(self) -> list[NotifyAlert]:
        return [a for a in self.alerts if a.firing]

    @property
    def resolved(self) -> list[NotifyAlert]:
        return [a for a in self.alerts if not a.firing]

    def common_labels(self) -> dict[str, str]:
        return _common([a.labels for a in self.alerts])

    def common_annotations(self) -> dict[str, str]:
        return _common([a.annotations for a in self.alerts])

    def runbook(self, alert: NotifyAlert) -> str:
        return self.runbook_url + alert.label("alertname") if self.runbook_url else ""


def _common(label_sets: list[Labels]) -> dict[str, str]:
    if not label_sets:
        return {}
    common = dict(label_sets[0])
    for labels in label_sets[1:]:
        other = dict(labels)
        common = {k: v for k, v in common.items() if other.get(k) == v}
    return common


def alert_details(n: Notification, alert: NotifyAlert) -> list[tuple[str, str]]:
    """(field, text) lines a person acts on: where, which GPU, what XID, what to do."""
    out: list[tuple[str, str]] = [("Node", n.node)]
    gpu = alert.label("gpu")
    if gpu:
        identity = n.gpus.get(gpu)
        text = f"GPU {gpu}"
        if identity is not None:
            text += f" ({identity.model}, serial {identity.serial}, {identity.uuid})"
        elif alert.label("uuid"):
            text += f" ({alert.label('uuid')})"
        out.append(("GPU", text))
    xid = ascii_int(alert.label("xid"))
    if xid is not None:
        out.append(("XID", f"{xid}: {lookup(xid).meaning}"))
    identity = n.gpus.get(gpu) if gpu else None
    if identity is not None and identity.jobs:
        out.append(("Running", identity.jobs))
    elif alert.label("job"):
        out.append(("Job", alert.label("job")))
    if alert.annotation("action"):
        out.append(("Action", alert.annotation("action")))
    return out
