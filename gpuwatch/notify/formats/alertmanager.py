"""A fleet Alertmanager, fed as Prometheus feeds it: `POST /api/v2/alerts` with every active
alert, re-sent while firing with endsAt = now + 4 * max(evaluation interval, 1 m), and each
resolved alert with its real endsAt. Alertmanager groups, silences and routes them itself."""

from __future__ import annotations

import json
from typing import Any

from gpuwatch.model import NotifyAlert
from gpuwatch.notify.db import Outgoing
from gpuwatch.text.timefmt import rfc3339

RESEND_S = 60.0  # Prometheus's resend delay


def api_url(base: str) -> str:
    base = base.rstrip("/")
    return base if base.endswith("/api/v2/alerts") else base + "/api/v2/alerts"


def render(
    receiver: str, alerts: list[NotifyAlert], now: float, interval: float, generator_url: str
) -> Outgoing:
    valid_for = 4 * max(interval, 60.0)
    payload: list[dict[str, Any]] = [
        {
            "labels": dict(a.labels),
            "annotations": dict(a.annotations),
            "startsAt": rfc3339(a.starts_at),
            "endsAt": rfc3339(now + valid_for if a.ends_at is None else a.ends_at),
            "generatorURL": generator_url,
        }
        for a in alerts
    ]
    body = json.dumps(payload, separators=(",", ":")).encode()
    key = f"{receiver}/{now:.3f}"
    headers = {"Content-Type": "application/json"}
    # Only the newest state matters: a newer send replaces one still waiting.
    return Outgoing(receiver, key, body, headers, coalesce_key=f"alertmanager:{receiver}")
