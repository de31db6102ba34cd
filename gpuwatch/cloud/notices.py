"""The three providers' notices, read from their metadata services' answers as each documents
them. Pure functions: the poller (gpuwatch.cloud.metadata) fetches, these read.

- AWS, IMDSv2: `spot/instance-action` is absent (404) until EC2 is about to interrupt a Spot
  Instance, then `{"action": "terminate" | "stop" | "hibernate", "time": "2017-09-18T08:22:00Z"}`,
  two minutes ahead ("Spot Instance interruption notices", Amazon EC2 User Guide).
- GCP: `instance/preempted` is `TRUE` once a Spot or preemptible VM is being reclaimed (it has
  30 seconds); `instance/maintenance-event` is `NONE`, `MIGRATE_ON_HOST_MAINTENANCE` or
  `TERMINATE_ON_HOST_MAINTENANCE`, the last for VMs with GPUs, which cannot live-migrate and
  are told 60 minutes ahead (Compute Engine, "Getting live migration and maintenance
  notices", "GPU host maintenance").
- Azure, Scheduled Events: a document of `Events`, each with `EventType` (`Preempt` for a Spot
  eviction, at least 30 seconds ahead; `Terminate`, `Reboot`, `Redeploy`; `Freeze` is a pause of
  seconds and takes nothing away), the `Resources` (VM names) it applies to, `EventStatus` and
  `NotBefore` (an RFC 1123 date, empty once Started) ("Azure Metadata Service: Scheduled
  Events for Linux VMs").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpuwatch.text.timefmt import parse_rfc3339

GCP_PREEMPTION_S = 30.0  # a preempted GCP VM's shutdown period
GCP_GPU_MAINTENANCE_S = 3600.0  # the notice a GPU VM gets before host maintenance
AZURE_TAKES = ("Preempt", "Terminate", "Reboot", "Redeploy")  # Freeze pauses, takes nothing


class NoticeError(ValueError):
    """An answer that is not what the provider documents."""


@dataclass(frozen=True, slots=True)
class Notice:
    provider: str  # aws, gcp, azure
    event: str  # what the provider calls it, lower case: terminate, preempted, preempt, ...
    at: float  # when the VM goes (seconds since the epoch); estimated where none is given
    detail: str = ""  # the provider's own words (Azure's Description, an event id)

    @property
    def key(self) -> tuple[str, str]:
        return self.provider, self.event


def aws_instance_action(body: bytes) -> Notice:
    """`spot/instance-action`'s document (a 404 is no notice, and never reaches here)."""
    doc = _json(body)
    action, when = doc.get("action"), doc.get("time")
    if not isinstance(action, str) or not isinstance(when, str):
        raise NoticeError('instance-action: expected {"action": ..., "time": ...}')
    try:
        at = parse_rfc3339(when)
    except (ValueError, OverflowError) as exc:
        raise NoticeError(f"instance-action: time {when[:40]!r}: {exc}") from None
    return Notice("aws", action.lower()[:32], at)


def gcp_notices(preempted: str, maintenance: str, first_seen: dict[str, float]) -> list[Notice]:
    """The VM's notices from its two metadata values; `first_seen` (event -> when it was
    first read) gives the time each one goes, the provider giving none."""
    out = []
    if preempted.strip().upper() == "TRUE":
        out.append(Notice("gcp", "preempted", first_seen["preempted"] + GCP_PREEMPTION_S))
    event = maintenance.strip().upper()
    if event not in ("NONE", "MIGRATE_ON_HOST_MAINTENANCE", ""):
        if event != "TERMINATE_ON_HOST_MAINTENANCE":
            raise NoticeError(f"maintenance-event: unknown value {event[:60]!r}")
        seen = first_seen["terminate_on_host_maintenance"]
        out.append(Notice("gcp", "terminate_on_host_maintenance", seen + GCP_GPU_MAINTENANCE_S))
    return out


def azure_notices(body: bytes, vm_name: str, now: float) -> list[Notice]:
    """The Scheduled Events that take this VM away; `vm_name` is the VM's own (an event names
    the VMs it applies to; one that names none applies to all of them)."""
    doc = _json(body)
    events = doc.get("Events")
    if not isinstance(events, list):
        raise NoticeError("scheduledevents: no Events list")
    out = []
    for event in events[:64]:
        if not isinstance(event, dict):
            raise NoticeError("scheduledevents: an event that is not an object")
        kind, resources = event.get("EventType"), event.get("Resources") or []
        if kind not in AZURE_TAKES:
            continue
        if not isinstance(resources, list) or (resources and vm_name not in resources):
            continue
        not_before = event.get("NotBefore") or ""
        at = now
        if not_before:
            # Imported here, on Azure with an event: the email package costs 1.5 MiB.
            from email.utils import parsedate_to_datetime

            try:
                at = parsedate_to_datetime(str(not_before)).timestamp()
            except (TypeError, ValueError, OverflowError):
                raise NoticeError(f"scheduledevents: NotBefore {str(not_before)[:40]!r}") from None
        detail = str(event.get("Description") or event.get("EventId") or "")[:200]
        out.append(Notice("azure", str(kind).lower(), at, detail))
    return out


def _json(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise NoticeError("not JSON") from None
    if not isinstance(doc, dict):
        raise NoticeError("not a JSON object")
    return doc
