"""What the rules hand on after each evaluation. To the notifier: every alert that is firing,
or has fired and resolved within the engine's 15 minutes, as notify's own values. To the
verdict: the firing alerts' labels and annotations. The rules
know the notifier's alert type; the notifier knows nothing of rules (as Prometheus's rules
package builds notifier.Alerts in SendAlerts).

A job's alerts leave with the label `provenance="job"`, so routes can send them to the job's
owners; only the hardware's reach the verdict, and through it the actions. The hardware's
carry no such label (routes match them with `provenance!="job"`): their labels, and so the
fingerprints and group keys a receiver already knows (a PagerDuty incident's), stay as they
were. The daemon's `node` and `provenance` win over labels of the same name a series or a
rule carried."""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

from gpuwatch.model import NotifyAlert, Provenance, fingerprint
from gpuwatch.rules.alerting import AlertingRule, AlertState
from gpuwatch.rules.files import load_rule_files, shipped_packs


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
            mine = dict(alert.labels)
            mine["node"] = node
            if rule.provenance is Provenance.JOB:
                mine["provenance"] = Provenance.JOB.value
            else:
                mine.pop("provenance", None)
            labels = tuple(sorted(mine.items()))
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


def hardware_firing_names(rules: Iterable[AlertingRule]) -> list[str]:
    """The names of the hardware's firing alerts (a job's may not advise or judge)."""
    return [
        rule.rule.name
        for rule in rules
        if rule.provenance is Provenance.HARDWARE
        and any(a.state == AlertState.FIRING for a in rule.active.values())
    ]


def firing_alerts(rules: Iterable[AlertingRule]) -> list[tuple[dict[str, str], dict[str, str]]]:
    """The labels and annotations of every firing alert of the hardware's, for the causes
    they raise: a job's alerts page its route and judge nothing."""
    return [
        (dict(alert.labels), dict(alert.annotations))
        for rule in rules
        if rule.provenance is Provenance.HARDWARE
        for alert in rule.active.values()
        if alert.state == AlertState.FIRING
    ]


def cause_labels(rules: Iterable[AlertingRule]) -> set[str]:
    """The `cause` labels the hardware's alerting rules carry, as written."""
    return {
        template.source
        for r in rules
        if r.provenance is Provenance.HARDWARE
        for k, template in r.rule.labels
        if k == "cause"
    }


@cache
def shipped_causes() -> tuple[str, ...]:
    """The causes the packs shipped with gpuwatch raise, each as its `cause` label is written;
    one written per port or device (a template) has no one name, and is left out. Without
    them loaded, the verdict does not judge what they judge (error rates, page counts, a
    lasting stall, the NVLink fabric, a GPU at its slowdown temperature)."""
    out: set[str] = set()
    for group in load_rule_files(shipped_packs()):
        for rule in group.rules:
            causes = [t.source for name, t in rule.labels if name == "cause"]
            out.update(c for c in causes if rule.kind == "alert" and "{{" not in c)
    return tuple(sorted(out))
