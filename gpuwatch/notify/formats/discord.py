"""Discord webhooks: `content` (2000 characters), up to 10 embeds (6000 characters in all, a
description 4096, a field 1024), and no pings: allowed_mentions parses nothing."""

from __future__ import annotations

from typing import Any

from gpuwatch.model import NotifyAlert
from gpuwatch.notify.config import ReceiverConfig
from gpuwatch.notify.db import Outgoing
from gpuwatch.notify.formats.common import (
    RESOLVED_COLOUR,
    SEVERITY_COLOURS,
    alert_heading,
    link,
    outgoing,
    severity,
    title,
    truncate,
)
from gpuwatch.notify.message import Notification, alert_details
from gpuwatch.text.timefmt import rfc3339

MAX_EMBEDS = 10
EMBED_TOTAL = 6000
DESCRIPTION_CHARS = 1500  # of Discord's 4096, so several alerts fit in the 6000 in all
FIELD_CHARS = 1024


def _embed(n: Notification, alert: NotifyAlert) -> dict[str, Any]:
    hex_colour = (
        RESOLVED_COLOUR
        if not alert.firing
        else SEVERITY_COLOURS.get(severity(alert), SEVERITY_COLOURS["warning"])
    )
    since = f"since {rfc3339(alert.starts_at)}; value {alert.value:g}"
    description = truncate(f"{alert.annotation('description')}\n{since}".strip(), DESCRIPTION_CHARS)
    embed: dict[str, Any] = {
        "title": truncate(alert_heading(alert), 256),
        "description": description,
        "color": int(hex_colour[1:], 16),
        "fields": [
            {"name": name, "value": truncate(text, FIELD_CHARS), "inline": False}
            for name, text in alert_details(n, alert)
        ][:25],
    }
    if link(n):
        embed["url"] = link(n)
    return embed


def _size(embed: dict[str, Any]) -> int:
    fields = embed.get("fields", [])
    return (
        len(embed["title"])
        + len(embed["description"])
        + sum(len(f["name"]) + len(f["value"]) for f in fields)
    )


def render(receiver: ReceiverConfig, n: Notification) -> Outgoing:
    embeds: list[dict[str, Any]] = []
    total = 0
    for alert in n.alerts:
        embed = _embed(n, alert)
        if len(embeds) == MAX_EMBEDS or total + _size(embed) > EMBED_TOTAL:
            break
        embeds.append(embed)
        total += _size(embed)
    content = title(n)
    if len(embeds) < len(n.alerts):
        content += (
            f" (… and {len(n.alerts) - len(embeds)} more alerts, left out to fit Discord's limits)"
        )
    payload = {
        "content": truncate(content, 2000),
        "embeds": embeds,
        "allowed_mentions": {"parse": []},
    }
    return outgoing(n, payload)
