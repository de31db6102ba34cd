"""PagerDuty Events API v2: one incident per alert group. `trigger` while any alert in it
fires, `resolve` when all have resolved, under one dedup_key (at most 255 characters)."""

from __future__ import annotations

from typing import Any

from gpuwatch.notify.config import ReceiverConfig
from gpuwatch.notify.db import Outgoing
from gpuwatch.notify.formats.common import (
    alert_text,
    digest,
    link,
    outgoing,
    severity,
    title,
    truncate,
)
from gpuwatch.notify.message import Notification

SUMMARY_CHARS = 1024
DETAILS_CHARS = 2000
PAGERDUTY_SEVERITIES = ("critical", "error", "warning", "info")


def dedup_key(n: Notification) -> str:
    return f"gpuwatch/{n.node}/{digest(n.group_key, 32)}"[:255]


def render(receiver: ReceiverConfig, n: Notification) -> Outgoing:
    assert receiver.routing_key is not None  # the config requires one for PagerDuty
    event: dict[str, Any] = {
        "routing_key": receiver.routing_key.reveal(),
        "event_action": "trigger" if n.status == "firing" else "resolve",
        "dedup_key": dedup_key(n),
    }
    if n.status == "firing":
        first = n.firing[0]
        sev = severity(first)
        event["payload"] = {
            "summary": truncate(
                f"{title(n)}: {first.annotation('summary')}".rstrip(": "), SUMMARY_CHARS
            ),
            "source": n.node,
            "severity": sev if sev in PAGERDUTY_SEVERITIES else "warning",
            "component": f"GPU {first.label('gpu')}" if first.label("gpu") else "node",
            "group": first.label("alertname"),
            "class": first.label("alertname"),
            "custom_details": {
                f"{a.label('alertname')} {a.label('gpu')}".strip(): truncate(
                    alert_text(n, a), DETAILS_CHARS
                )
                for a in n.firing
            },
        }
        event["client"] = "gpuwatch"
        if link(n):
            event["client_url"] = link(n)
            event["links"] = [{"href": link(n), "text": f"gpuwatch on {n.node}"}]
    return outgoing(n, event)
