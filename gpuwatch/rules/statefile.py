"""Alert state on disk, so a restart neither re-fires an alert nor forgets its active-since time.

One JSON file in the state directory, replaced atomically (write, fsync, rename) whenever an
alert starts, changes state or goes away.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpuwatch.rules.alerting import Alert, AlertingRule, AlertState
from gpuwatch.state.atomicfile import read_json, set_aside_quietly, write_json

log = logging.getLogger(__name__)

VERSION = 1
FILE_NAME = "alerts.json"


def rule_key(rule: AlertingRule) -> str:
    return f"{rule.rule.file};{rule.rule.group};{rule.rule.name}"


def _alert_to_json(alert: Alert) -> dict[str, Any]:
    return {
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "state": alert.state.value,
        "value": alert.value if alert.value == alert.value else None,
        "active_at": alert.active_at,
        "fired_at": alert.fired_at,
        "resolved_at": alert.resolved_at,
        "keep_firing_since": alert.keep_firing_since,
    }


def _alert_from_json(data: dict[str, Any]) -> Alert:
    value = data.get("value")
    return Alert(
        labels=tuple(sorted((str(k), str(v)) for k, v in data["labels"].items())),
        annotations=tuple(sorted((str(k), str(v)) for k, v in data["annotations"].items())),
        state=AlertState(data["state"]),
        value=float("nan") if value is None else float(value),
        active_at=float(data["active_at"]),
        fired_at=_optional_time(data.get("fired_at")),
        resolved_at=_optional_time(data.get("resolved_at")),
        keep_firing_since=_optional_time(data.get("keep_firing_since")),
    )


def _optional_time(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"a time must be a number or null, not {value!r}")
    return float(value)


def signature(rules: Iterable[AlertingRule]) -> tuple[object, ...]:
    """What must be saved when it changes (values and annotations are refreshed each cycle)."""
    return tuple(
        (rule_key(r), key, a.state, a.active_at, a.keep_firing_since)
        for r in rules
        for key, a in r.active.items()
    )


def save(path: Path, rules: Iterable[AlertingRule]) -> None:
    payload = {
        "version": VERSION,
        "rules": {
            rule_key(r): [_alert_to_json(a) for a in r.active.values()] for r in rules if r.active
        },
    }
    write_json(path, payload)


def restore(path: Path, rules: Iterable[AlertingRule]) -> int:
    """Put saved alerts back into their rules; returns how many. A file of the wrong shape is
    set aside; a bad entry is skipped; neither is fatal."""
    data = read_json(path, "alert state")
    if data is None:
        return 0
    saved = data.get("rules") if isinstance(data, dict) else None
    if not isinstance(saved, dict) or not all(isinstance(v, list) for v in saved.values()):
        set_aside_quietly(path, 'alert state: expected {"rules": {rule: [alert, ...]}}')
        return 0
    count = 0
    for rule in rules:
        for item in saved.get(rule_key(rule), []):
            try:
                alert = _alert_from_json(item)
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                log.warning("alert state %s: skipping a saved alert: %s", path, exc)
                continue
            rule.active[alert.labels] = alert
            count += 1
    return count
