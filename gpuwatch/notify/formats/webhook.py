"""Alertmanager's webhook payload, version 4, field for field, so existing consumers work."""

from __future__ import annotations

from typing import Any

from gpuwatch.model import NotifyAlert
from gpuwatch.notify.config import ReceiverConfig
from gpuwatch.notify.db import Outgoing
from gpuwatch.notify.formats.common import link, outgoing
from gpuwatch.notify.message import Notification
from gpuwatch.text.timefmt import rfc3339

ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt for an alert still firing


def alert_json(n: Notification, alert: NotifyAlert) -> dict[str, Any]:
    return {
        "status": alert.status,
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "startsAt": rfc3339(alert.starts_at),
        "endsAt": ZERO_TIME if alert.ends_at is None else rfc3339(alert.ends_at),
        "generatorURL": link(n),
        "fingerprint": alert.fingerprint,
    }


def render(receiver: ReceiverConfig, n: Notification) -> Outgoing:
    payload = {
        "receiver": n.receiver,
        "status": n.status,
        "alerts": [alert_json(n, a) for a in n.alerts],
        "groupLabels": dict(n.group_labels),
        "commonLabels": n.common_labels(),
        "commonAnnotations": n.common_annotations(),
        "externalURL": n.external_url,
        "version": "4",
        "groupKey": n.group_key,
        "truncatedAlerts": 0,
    }
    return outgoing(n, payload)
