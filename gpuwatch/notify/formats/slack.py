"""Slack incoming webhooks: `text` for notifications, an attachment with the severity colour
holding Block Kit sections. Slack allows 50 blocks and 3000 characters a section. Whatever came
from a label, annotation or job is escaped in mrkdwn; the header is plain_text, shown as is."""

from __future__ import annotations

from typing import Any

from gpuwatch.notify.config import ReceiverConfig
from gpuwatch.notify.db import Outgoing
from gpuwatch.notify.formats.common import (
    alert_heading,
    alert_text,
    colour,
    link,
    outgoing,
    slack_escape,
    title,
    truncate,
)
from gpuwatch.notify.message import Notification

MAX_BLOCKS = 50
SECTION_CHARS = 3000


def blocks(n: Notification) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": truncate(title(n), 150)}}
    ]
    room = MAX_BLOCKS - 2  # the header, and the footer with the link or the count left out
    for i, alert in enumerate(n.alerts):
        if i == room:
            left = len(n.alerts) - room
            out.append(_context(f"… and {left} more alerts, left out to fit Slack's limits"))
            return out
        heading = alert_heading(alert, slack_escape)
        text = f"*{heading}*\n{alert_text(n, alert, slack_escape)}"
        out.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": truncate(text, SECTION_CHARS)}}
        )
    if link(n):
        out.append(_context(f"<{link(n)}|Open in gpuwatch on {slack_escape(n.node)}>"))
    return out


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": truncate(text, 2000)}]}


def render(receiver: ReceiverConfig, n: Notification) -> Outgoing:
    payload = {
        "text": title(n, slack_escape),
        "attachments": [{"color": colour(n), "blocks": blocks(n)}],
    }
    return outgoing(n, payload)
