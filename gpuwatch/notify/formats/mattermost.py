"""Mattermost incoming webhooks: Slack-compatible attachments, at most 16383 characters of text."""

from __future__ import annotations

from gpuwatch.notify.config import ReceiverConfig
from gpuwatch.notify.db import Outgoing
from gpuwatch.notify.formats.common import (
    alert_heading,
    alert_text,
    colour,
    link,
    outgoing,
    title,
    truncate,
)
from gpuwatch.notify.message import Notification

MAX_CHARS = 16383


def render(receiver: ReceiverConfig, n: Notification) -> Outgoing:
    parts = [f"**{alert_heading(a)}**\n{alert_text(n, a)}" for a in n.alerts]
    if link(n):
        parts.append(f"[Open in gpuwatch on {n.node}]({link(n)})")
    text = truncate("\n\n".join(parts), MAX_CHARS - len(title(n)) - 1)
    payload = {
        "text": title(n),
        "attachments": [{"fallback": title(n), "color": colour(n), "text": text}],
    }
    return outgoing(n, payload)
