"""Microsoft Teams through a Workflows webhook: an Adaptive Card in an `attachments` array.
Teams refuses a message over 28 KB, so alerts are left out from the end until it fits."""

from __future__ import annotations

import json
from typing import Any

from gpuwatch.model import NotifyAlert
from gpuwatch.notify.config import ReceiverConfig
from gpuwatch.notify.db import Outgoing
from gpuwatch.notify.formats.common import alert_heading, link, outgoing, title, truncate
from gpuwatch.notify.message import Notification, alert_details
from gpuwatch.text.timefmt import rfc3339

MAX_BYTES = 28 * 1024 - 1024  # a kilobyte of headroom for the envelope Teams adds
TEXT_CHARS = 2000


def _alert_items(n: Notification, alert: NotifyAlert) -> list[dict[str, Any]]:
    colour = (
        "Good"
        if not alert.firing
        else ("Attention" if alert.label("severity") == "critical" else "Warning")
    )
    facts = [
        {"title": "Since", "value": rfc3339(alert.starts_at)},
        {"title": "Value", "value": f"{alert.value:g}"},
    ]
    facts += [
        {"title": name, "value": truncate(text, TEXT_CHARS)}
        for name, text in alert_details(n, alert)
    ]
    items: list[dict[str, Any]] = [
        {
            "type": "TextBlock",
            "text": truncate(alert_heading(alert), 300),
            "weight": "Bolder",
            "color": colour,
            "wrap": True,
        },
    ]
    if alert.annotation("description"):
        items.append(
            {
                "type": "TextBlock",
                "text": truncate(alert.annotation("description"), TEXT_CHARS),
                "wrap": True,
            }
        )
    items.append({"type": "FactSet", "facts": facts})
    return items


def _card(n: Notification, body: list[dict[str, Any]]) -> dict[str, Any]:
    card: dict[str, Any] = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": body,
    }
    if link(n):
        card["actions"] = [
            {"type": "Action.OpenUrl", "title": f"Open gpuwatch on {n.node}", "url": link(n)}
        ]
    return {
        "type": "message",
        "attachments": [
            {
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": None,
                "content": card,
            }
        ],
    }


def render(receiver: ReceiverConfig, n: Notification) -> Outgoing:
    header = {
        "type": "TextBlock",
        "text": title(n),
        "size": "Large",
        "weight": "Bolder",
        "wrap": True,
    }
    per_alert = [_alert_items(n, a) for a in n.alerts]
    shown = len(per_alert)
    while True:
        body = [header] + [item for items in per_alert[:shown] for item in items]
        if shown < len(per_alert):
            body.append(
                {
                    "type": "TextBlock",
                    "wrap": True,
                    "isSubtle": True,
                    "text": f"… and {len(per_alert) - shown} more alerts, left out to fit 28 KB",
                }
            )
        payload = _card(n, body)
        if len(json.dumps(payload).encode()) <= MAX_BYTES or shown == 0:
            return outgoing(n, payload)
        shown -= 1
