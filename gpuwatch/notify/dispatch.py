"""Routing, grouping, inhibition, silences and deduplication: Alertmanager's pipeline, on the node.

Every evaluation hands the dispatcher the whole set of alerts. Each alert is routed down the
tree into aggregation groups (route + group_by labels). A group is flushed group_wait after it
is created and every group_interval after that; a flush notifies a receiver when the group has a
firing alert it was not told about, when alerts it was told about resolved, or when
repeat_interval has passed (Alertmanager's rules, with its notification log kept in notify.db).
Inhibited or silenced firing alerts are left out; their resolution is still sent to a receiver
that was told they fired.

A notification that carries only jobs' alerts (`provenance="job"`) goes into its receiver's
job lane, behind the hardware's, and each receiver takes at most
`job_notifications_per_hour` of them per job: one more waits in its group, nothing lost,
until the hour allows it. A job that flaps its NaN, or a user pushing under many names, cannot
drown the channel.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from gpuwatch.model import Labels, NotifyAlert
from gpuwatch.notify.budget import JobBudget, lane_of
from gpuwatch.notify.config import ALL_LABELS, InhibitRule, NotifyConfig, ReceiverConfig, Route
from gpuwatch.notify.db import JOB_LANE, LogEntry, NotifyDb, Outgoing
from gpuwatch.notify.matchers import matches_all
from gpuwatch.notify.message import GpuIdentity, Notification
from gpuwatch.notify.silences import Silences

log = logging.getLogger(__name__)

Render = Callable[[ReceiverConfig, Notification], Outgoing]


def routes_for(route: Route, labels: Mapping[str, str]) -> list[Route]:
    """The routes an alert ends in: the deepest matching ones, as Alertmanager walks its tree."""
    if not matches_all(route.matchers, labels):
        return []
    out: list[Route] = []
    for child in route.routes:
        found = routes_for(child, labels)
        if found:
            out.extend(found)
            if not child.continue_:
                break
    return out or [route]


def inhibited(alerts: list[NotifyAlert], rules: tuple[InhibitRule, ...]) -> set[str]:
    """Fingerprints of firing alerts that a firing source alert inhibits."""
    firing = [a for a in alerts if a.firing]
    out: set[str] = set()
    for rule in rules:
        sources = [dict(a.labels) for a in firing if matches_all(rule.source, dict(a.labels))]
        if not sources:
            continue
        keys = {tuple(s.get(name, "") for name in rule.equal) for s in sources}
        for alert in firing:
            labels = dict(alert.labels)
            targeted = matches_all(rule.target, labels) and not matches_all(rule.source, labels)
            if targeted and tuple(labels.get(name, "") for name in rule.equal) in keys:
                out.add(alert.fingerprint)
    return out


@dataclass
class _Group:
    key: str
    route: Route
    labels: Labels
    next_flush: float
    alerts: dict[str, NotifyAlert] = field(default_factory=dict)
    muted: set[str] = field(default_factory=set)


class Dispatcher:
    def __init__(
        self,
        config: NotifyConfig,
        db: NotifyDb,
        silences: Silences,
        render: Render,
        *,
        node: str,
        external_url: str,
    ) -> None:
        self.config = config
        self.tree = config.tree
        self.receivers = {r.name: r for r in config.receivers}
        self.db = db
        self.silences = silences
        self.render = render
        self.node = node
        self.external_url = external_url
        self.groups: dict[str, _Group] = {}
        self._log = db.log_entries()
        self._gpus: Mapping[str, GpuIdentity] = {}
        self._silences_seen = silences.generation
        self.render_failures: Counter[str] = Counter()  # by receiver
        self.job_budget = JobBudget(config.job_notifications_per_hour)

    def update(
        self, now: float, alerts: list[NotifyAlert], gpus: Mapping[str, GpuIdentity]
    ) -> None:
        """Take the current alerts into their groups; groups due now are flushed by flush_due."""
        self._gpus = gpus
        muted = inhibited(alerts, self.config.inhibit_rules)
        seen: set[tuple[str, str]] = set()
        for alert in alerts:
            labels = dict(alert.labels)
            if alert.firing and self.silences.silenced(labels, now):
                muted.add(alert.fingerprint)
            for route in routes_for(self.tree, labels):
                group_labels = _group_labels(route, labels)
                key = f"{route.name}:{_render_labels(group_labels)}"
                seen.add((key, alert.fingerprint))
                group = self.groups.get(key)
                if group is None:
                    if not alert.firing and not self._told_firing(key, route, alert.fingerprint):
                        continue  # nobody was told it fired: its resolution is no news
                    group = _Group(key, route, group_labels, now + route.group_wait)
                    self.groups[key] = group
                group.alerts[alert.fingerprint] = alert
        silences_changed = self.silences.generation != self._silences_seen
        self._silences_seen = self.silences.generation
        for group in self.groups.values():
            was_muted = group.muted
            group.muted = {fp for fp in group.alerts if fp in muted}
            if silences_changed and was_muted - group.muted:
                group.next_flush = now  # an expired silence: tell at once, not a group_interval on
            for fp, alert in list(group.alerts.items()):
                if alert.firing and (group.key, fp) not in seen:
                    # Gone without resolving (its rule was removed): resolved as of now.
                    group.alerts[fp] = _resolved(alert, now)

    def _told_firing(self, key: str, route: Route, fp: str) -> bool:
        """Was a receiver of this group told the alert fired? (A lookup per receiver, not a
        scan of the whole log for every resolved alert on every evaluation.)"""
        entries = (self._log.get((key, receiver)) for receiver in route.receivers)
        return any(entry is not None and fp in entry.firing for entry in entries)

    def next_due(self) -> float | None:
        return min((g.next_flush for g in self.groups.values()), default=None)

    def flush_due(self, now: float) -> int:
        """Flush every group that is due; returns how many notifications went to the outbox.

        Nothing is remembered as told until the outbox has committed it: when the commit
        raises (a full disk), the groups stay due and the same news is tried again."""
        due = [group for group in self.groups.values() if group.next_flush <= now]
        items: list[Outgoing] = []
        log: list[tuple[str, str, LogEntry | None]] = []
        for group in due:
            for receiver in group.route.receivers:
                self._flush(now, group, receiver, items, log)
        if items or log:
            self.db.enqueue(now, items, log)
        for key, receiver_name, entry in log:
            if entry is None:
                self._log.pop((key, receiver_name), None)
            else:
                self._log[(key, receiver_name)] = entry
        for group in due:
            group.next_flush = now + group.route.group_interval
            for fp, alert in list(group.alerts.items()):
                if not alert.firing:
                    del group.alerts[fp]
            if not group.alerts:
                del self.groups[group.key]
        return len(items)

    def _flush(
        self,
        now: float,
        group: _Group,
        receiver_name: str,
        items: list[Outgoing],
        log: list[tuple[str, str, LogEntry | None]],
    ) -> None:
        receiver = self.receivers.get(receiver_name)
        if receiver is None:
            return
        firing = [a for a in group.alerts.values() if a.firing and a.fingerprint not in group.muted]
        resolved = [a for a in group.alerts.values() if not a.firing]
        firing_ids = frozenset(a.fingerprint for a in firing)
        resolved_ids = frozenset(a.fingerprint for a in resolved)
        entry = self._log.get((group.key, receiver_name))
        if not _needs_update(
            entry,
            firing_ids,
            resolved_ids,
            send_resolved=receiver.send_resolved,
            repeat=group.route.repeat_interval,
            now=now,
        ):
            return
        told = entry.firing if entry is not None else frozenset()
        told_resolved = [a for a in resolved if a.fingerprint in told and receiver.send_resolved]
        shown = sorted(firing, key=_order) + sorted(told_resolved, key=_order)
        lane = lane_of(shown)
        if shown and lane == JOB_LANE and not self.job_budget.allows(now, receiver_name, shown):
            return  # not remembered as told: it goes out once the hour allows
        if shown:
            notification = Notification(
                receiver=receiver_name,
                group_key=group.key,
                group_labels=group.labels,
                alerts=tuple(shown),
                time=now,
                node=self.node,
                external_url=self.config.external_url or self.external_url,
                runbook_url=self.config.runbook_url,
                gpus=self._gpus,
            )
            outgoing = self._render(receiver, notification)
            if outgoing is None:
                return  # not remembered as told: tried again at the next flush
            items.append(replace(outgoing, lane=lane))
            if lane == JOB_LANE:
                self.job_budget.spend(now, receiver_name, shown)
        new_entry = LogEntry(firing_ids, resolved_ids, now) if firing_ids else None
        log.append((group.key, receiver_name, new_entry))

    def _render(self, receiver: ReceiverConfig, notification: Notification) -> Outgoing | None:
        """One group's message for one receiver. A label or annotation a format cannot take
        costs that one message its decorations, never the batch: it is rendered again from
        plain ASCII text, and only if that fails too is it left out (and tried again)."""
        try:
            return self.render(receiver, notification)
        except Exception:
            self.render_failures[receiver.name] += 1
            log.exception(
                "receiver %s: cannot render the notification for group %s; sending it as "
                "plain text",
                receiver.name,
                notification.group_key,
            )
        try:
            return self.render(receiver, _plain(notification))
        except Exception:
            log.exception(
                "receiver %s: cannot render group %s even as plain text; left out",
                receiver.name,
                notification.group_key,
            )
            return None


def _needs_update(
    entry: LogEntry | None,
    firing: frozenset[str],
    resolved: frozenset[str],
    *,
    send_resolved: bool,
    repeat: float,
    now: float,
) -> bool:
    """Alertmanager's DedupStage: is there news for this receiver?"""
    if entry is None:
        return bool(firing)
    if not firing <= entry.firing:
        return True
    if not firing:
        return bool(entry.firing)  # everything it was told about has resolved
    if send_resolved and not resolved <= entry.resolved:
        return True
    return entry.time + repeat <= now


def _plain(n: Notification) -> Notification:
    """The notification with every label and annotation as printable ASCII, no GPU details."""

    def plain(pairs: Labels) -> Labels:
        return tuple((_ascii(k), _ascii(v)) for k, v in pairs)

    alerts = tuple(
        replace(a, labels=plain(a.labels), annotations=plain(a.annotations)) for a in n.alerts
    )
    return replace(n, group_labels=plain(n.group_labels), alerts=alerts, gpus={})


def _ascii(text: str) -> str:
    return "".join(c if " " <= c <= "~" else f"\\u{ord(c):04x}" for c in text)


def _order(alert: NotifyAlert) -> tuple[float, Labels]:
    return (alert.starts_at, alert.labels)


def _resolved(alert: NotifyAlert, now: float) -> NotifyAlert:
    return NotifyAlert(
        alert.labels, alert.annotations, alert.starts_at, now, alert.value, alert.fingerprint
    )


def _group_labels(route: Route, labels: Mapping[str, str]) -> Labels:
    if route.group_by == ALL_LABELS:
        return tuple(sorted(labels.items()))
    return tuple(sorted((k, labels[k]) for k in route.group_by if k in labels))


def _render_labels(labels: Labels) -> str:
    return "{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in labels) + "}"
