"""What the rules hand on after each evaluation. To the notifier: every alert that is firing,
or has fired and resolved within the engine's 15 minutes, as notify's own values. To the
verdict: the firing alerts' labels and annotations. The rules
know the notifier's alert type; the notifier knows nothing of rules (as Prometheus's rules
package builds notifier.Alerts in SendAlerts)."""

from __future__ import annotations

from collections.abc import Iterable

from gpuwatch.notify.alerts import NotifyAlert, fingerprint
from gpuwatch.rules.alerting import AlertingRule, AlertState


def alerts_to_send(rules: Iterable[AlertingRule], node: str) -> list[NotifyAlert]:
    """Firing and recently resolved alerts, the node's name added; pending ones are nobody's
    business yet."""
    out: list[NotifyAlert] = []
    for rule in rules:
        for alert in rule.active.values():
            if alert.state == AlertState.FIRING:
                ends_at = None
            elif alert.state == AlertState.INACTIVE and alert.fired_at is not None:
                ends_at = alert.resolved_at
            else:
                continue  # pending: nobody hears of it
            labels = tuple(sorted({"node": node, **dict(alert.labels)}.items()))
            out.append(
                NotifyAlert(
                    labels,
                    alert.annotations,
                    alert.active_at,
                    ends_at,
                    alert.value,
                    fingerprint(labels),
                )
            )
    return out


def firing_alerts(rules: Iterable[AlertingRule]) -> list[tuple[dict[str, str], dict[str, str]]]:
    """The labels and annotations of every firing alert, for the causes they raise."""
    return [
        (dict(alert.labels), dict(alert.annotations))
        for rule in rules
        for alert in rule.active.values()
        if alert.state == AlertState.FIRING
    ]


def cause_labels(rules: Iterable[AlertingRule]) -> set[str]:
    """The `cause` labels the alerting rules carry, as written."""
    return {template.source for r in rules for k, template in r.rule.labels if k == "cause"}
