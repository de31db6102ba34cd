"""Mattermost incoming webhooks: Slack-compatible attachments, at most 16383 characters of text.
Whatever came from a label, annotation or job is Markdown-escaped and its mentions broken."""

from __future__ import annotations

from gpuwatch.notify.config import ReceiverConfig
from gpuwatch.notify.db import Outgoing
from gpuwatch.notify.formats.common import (
    alert_heading,
    alert_text,
    colour,
    link,
    markdown_escape,
    outgoing,
    title,
    truncate,
)
from gpuwatch.notify.message import Notification

MAX_CHARS = 16383


def render(receiver: ReceiverConfig, n: Notification) -> Outgoing:
    esc = markdown_escape
    parts = [f"**{alert_heading(a, esc)}**\n{alert_text(n, a, esc)}" for a in n.alerts]
    if link(n):
        parts.append(f"[Open in gpuwatch on {esc(n.node)}]({link(n)})")
    heading = title(n, esc)
    text = truncate("\n\n".join(parts), MAX_CHARS - len(heading) - 1)
    payload = {
        "text": heading,
        "attachments": [{"fallback": heading, "color": colour(n), "text": text}],
    }
    return outgoing(n, payload)
