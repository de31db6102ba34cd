"""/api/v1/alerts and /api/v1/rules in the shapes of Prometheus's HTTP API."""

from __future__ import annotations

from typing import Any

from gpuwatch.rules.alerting import Alert, AlertingRule, AlertState, RecordingRule
from gpuwatch.rules.engine import RuleEngine
from gpuwatch.text.gofmt import format_e
from gpuwatch.text.timefmt import rfc3339


def alert_json(alert: Alert, rule: AlertingRule) -> dict[str, Any]:
    return {
        "labels": dict(alert.labels),
        "provenance": rule.provenance.value,
        "annotations": dict(alert.annotations),
        "state": alert.state.value,
        "activeAt": rfc3339(alert.active_at),
        "value": format_e(alert.value, upper=False),
    }


def _live(rule: AlertingRule) -> list[Alert]:
    return [a for a in rule.active.values() if a.state != AlertState.INACTIVE]


def alerts_payload(engine: RuleEngine) -> dict[str, Any]:
    return {"alerts": [alert_json(a, r) for r in engine.alerting_rules() for a in _live(r)]}


def _rule_json(rule: AlertingRule | RecordingRule) -> dict[str, Any]:
    common = {
        "name": rule.rule.name,
        "query": rule.rule.expr_text.strip(),
        "labels": {k: t.source for k, t in rule.rule.labels},
        "health": rule.status.health,
        "lastError": rule.status.last_error,
        "lastEvaluation": rfc3339(rule.status.last_evaluation),
        "evaluationTime": rule.status.evaluation_seconds,
    }
    if isinstance(rule, RecordingRule):
        return {**common, "type": "recording"}
    alerts = _live(rule)
    states = {a.state for a in alerts}
    state = "firing" if AlertState.FIRING in states else ("pending" if states else "inactive")
    return {
        **common,
        "type": "alerting",
        "provenance": rule.provenance.value,
        "state": state,
        "duration": rule.rule.hold,
        "keepFiringFor": rule.rule.keep_firing_for,
        "annotations": {k: t.source for k, t in rule.rule.annotations},
        "alerts": [alert_json(a, rule) for a in alerts],
    }


def rules_payload(engine: RuleEngine, kind: str = "") -> dict[str, Any]:
    """`kind` is Prometheus's `type` filter: "alert", "record" or "" for both."""
    groups = []
    for group in engine.groups:
        rules = [
            _rule_json(r)
            for r in group.rules
            if not kind or (kind == "alert") == isinstance(r, AlertingRule)
        ]
        groups.append(
            {
                "name": group.definition.name,
                "file": group.definition.file,
                "interval": engine.interval(group),
                "limit": group.definition.limit,
                "rules": rules,
                "lastEvaluation": rfc3339(group.last_evaluation),
                "evaluationTime": group.evaluation_seconds,
            }
        )
    return {"groups": groups, "lastReloadError": engine.last_reload_error}
