"""What every format shares: the idempotency key, titles, truncation with a marker."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from gpuwatch.model import NotifyAlert
from gpuwatch.notify.db import Outgoing
from gpuwatch.notify.message import Notification, alert_details
from gpuwatch.text.timefmt import rfc3339

MARKER = "… [truncated]"
SEVERITY_COLOURS = {"critical": "#d1242f", "warning": "#d4a72c", "info": "#0969da"}
RESOLVED_COLOUR = "#1a7f37"

Escape = Callable[[str], str]  # makes text from a label, annotation or job plain for a service


def as_is(text: str) -> str:
    return text


def slack_escape(text: str) -> str:
    """Slack's three control characters as its docs ("Escaping text") define them: a label
    holding `<!channel>`, `<@U123>` or `<https://evil|click>` is shown, not acted on."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+!|~])")
_MENTION = re.compile(r"@(?=\w)")


def markdown_escape(text: str) -> str:
    """Mattermost's Markdown, backslash-escaped so a label cannot make a link or emphasis,
    and its mentions (`@channel`, `@here`, `@all`, `@someone`) broken by a word joiner (U+2060)
    so they notify nobody; they still read the same."""
    return _MENTION.sub("@\u2060", _MARKDOWN_SPECIAL.sub(r"\\\1", text))


def digest(text: str, size: int = 16) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:size]


def idempotency_key(n: Notification) -> str:
    """The same notification always has the same key, across retries and restarts."""
    alerts = ",".join(f"{a.fingerprint}:{a.status}" for a in n.alerts)
    return f"{n.receiver}/{digest(n.group_key)}/{n.status}/{digest(alerts)}/{n.time:.3f}"


def outgoing(n: Notification, payload: Any, extra: dict[str, str] | None = None) -> Outgoing:
    key = idempotency_key(n)
    headers = {"Content-Type": "application/json", "Idempotency-Key": key, **(extra or {})}
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    return Outgoing(n.receiver, key, body, headers)


def truncate(text: str, limit: int) -> str:
    """At most `limit` characters; a cut text ends with the marker, so a reader knows."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - len(MARKER))] + MARKER


def severity(alert: NotifyAlert) -> str:
    return alert.label("severity") or "warning"


def colour(n: Notification) -> str:
    if n.status == "resolved":
        return RESOLVED_COLOUR
    worst = "critical" if any(severity(a) == "critical" for a in n.firing) else "warning"
    return SEVERITY_COLOURS[worst]


def title(n: Notification, esc: Escape = as_is) -> str:
    """`[FIRING:2] GpuFellOffBus on gpu-node-7`, as Alertmanager's default templates say it."""
    names = sorted({a.label("alertname") for a in n.alerts})
    what = ", ".join(names) if len(names) <= 3 else f"{names[0]} and {len(names) - 1} more"
    count = len(n.firing) if n.status == "firing" else len(n.resolved)
    return f"[{n.status.upper()}:{count}] {esc(what)} on {esc(n.node)}"


def alert_heading(alert: NotifyAlert, esc: Escape = as_is) -> str:
    summary = alert.annotation("summary") or alert.label("alertname")
    state = "RESOLVED" if not alert.firing else severity(alert).upper()
    return f"{state}: {esc(summary)}"


def alert_text(n: Notification, alert: NotifyAlert, esc: Escape = as_is) -> str:
    """What happened, since when, the value, and the details a person acts on, as lines;
    `esc` makes what came from labels, annotations and jobs plain text for the service."""
    lines = []
    if alert.annotation("description"):
        lines.append(esc(alert.annotation("description")))
    since = f"since {rfc3339(alert.starts_at)}"
    if not alert.firing and alert.ends_at is not None:
        since += f", resolved {rfc3339(alert.ends_at)}"
    lines.append(f"{since}; value {alert.value:g}")
    lines.extend(f"{name}: {esc(text)}" for name, text in alert_details(n, alert))
    if n.runbook(alert):
        lines.append(f"Runbook: {esc(n.runbook(alert))}")
    return "\n".join(lines)


def link(n: Notification) -> str:
    return f"{n.external_url.rstrip('/')}/api/v1/alerts" if n.external_url else ""
