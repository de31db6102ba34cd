"""Alerting and recording rules, and the Prometheus alert state machine.

pending -> firing once the condition has held for `for:`; a pending alert whose condition
clears is dropped silently; a firing one resolves (or keeps firing for `keep_firing_for`), and
a resolved alert is kept for 15 minutes so that it is reported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpuwatch.compat import StrEnum
from gpuwatch.model import Event, Provenance, Sample
from gpuwatch.promql.evaluator import Evaluator
from gpuwatch.promql.parse import QueryError, parse
from gpuwatch.promql.values import NAME, EvalError, Labels, Scalar, Vector, VSample, drop_name
from gpuwatch.rules.files import GroupDef, RuleDef
from gpuwatch.rules.provenance import rule_provenance
from gpuwatch.rules.template import QueryFn, TemplateData
from gpuwatch.rules.template.functions import FuncError
from gpuwatch.text.units import ascii_int
from gpuwatch.web.foreground import StepAside, never

log = logging.getLogger(__name__)

RESOLVED_RETENTION_S = 15 * 60.0
ALERT_SOURCE_PREFIX = "alert:"

# (source, time, samples): where rule results are written, one source per rule
Sink = Callable[[str, float, list[Sample]], None]


class AlertState(StrEnum):
    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"


@dataclass(slots=True)
class Alert:
    labels: Labels  # sorted, with alertname
    annotations: tuple[tuple[str, str], ...]
    state: AlertState
    value: float
    active_at: float
    fired_at: float | None = None
    resolved_at: float | None = None
    keep_firing_since: float | None = None

    @property
    def name(self) -> str:
        return dict(self.labels).get("alertname", "")


@dataclass(frozen=True, slots=True)
class Transition:
    """An alert changed state: what a journal and a notifier act on."""

    rule: str
    alert: Alert
    old: AlertState
    new: AlertState
    time: float

    def as_event(self) -> Event:
        labels, annotations = dict(self.alert.labels), dict(self.alert.annotations)
        state = "firing" if self.new == AlertState.FIRING else "resolved"
        summary = annotations.get("summary", "")
        gpu = labels.get("gpu", "")
        return Event(
            self.time,
            "alert",
            ascii_int(gpu),
            labels.get("uuid"),
            f"{self.rule} {state}" + (f": {summary}" if summary else ""),
            {"alertname": self.rule, "state": state, "severity": labels.get("severity", "")},
        )


@dataclass(slots=True)
class RuleStatus:
    health: str = "unknown"  # ok, err, unknown: as Prometheus's /api/v1/rules
    last_error: str = ""
    last_evaluation: float | None = None
    evaluation_seconds: float = 0.0


def _scalar_as_vector(value: object, t: float) -> Vector:
    if isinstance(value, Scalar):
        return [VSample((), value.value, t)]
    if isinstance(value, list) and all(isinstance(s, VSample) for s in value):
        return value
    raise EvalError("rule result is not a vector or scalar")


def _query_with(ev: Evaluator) -> QueryFn:
    """The templates' `query`: an instant query on the rules' own store, as Prometheus runs
    one against its own."""

    def query(expr: str, t: float) -> list[tuple[dict[str, str], float]]:
        try:
            vector = _scalar_as_vector(ev.eval(parse(expr), t), t)
        except (QueryError, EvalError) as exc:
            raise FuncError(str(exc)) from None
        return [(dict(s.metric), s.value) for s in vector]

    return query


class RecordingRule:
    def __init__(self, rule: RuleDef, group_labels: Labels, source: str) -> None:
        self.rule = rule
        self.source = source
        self.status = RuleStatus()
        self._labels = dict(group_labels) | {k: t.source for k, t in rule.labels}

    def evaluate(self, ev: Evaluator, t: float, sink: Sink) -> None:
        vector = _scalar_as_vector(ev.eval(self.rule.expr, t), t)
        seen: set[Labels] = set()
        out: list[Sample] = []
        relabel = self._labels
        for s in vector:
            if relabel:
                labels = {k: v for k, v in s.metric if k != NAME}
                for k, v in relabel.items():
                    if v:
                        labels[k] = v
                    else:
                        labels.pop(k, None)
                key = tuple(sorted(labels.items()))
            else:  # the metric is sorted already; dropping its name keeps it so
                key = drop_name(s.metric)
            if key in seen:
                raise EvalError(
                    "vector contains metrics with the same labelset after applying rule labels"
                )
            seen.add(key)
            out.append(Sample(self.rule.name, key, s.value))
        sink(self.source, t, out)


class AlertingRule:
    def __init__(
        self,
        rule: RuleDef,
        group_labels: Labels,
        source: str,
        external_labels: Mapping[str, str],
        alerts_metric: str,
        *,
        external_url: str = "",
        provenance: Provenance = Provenance.JOB,
    ) -> None:
        self.rule = rule
        self.source = source
        self.provenance = provenance  # the hardware's only when it reads hardware series only
        self.status = RuleStatus()
        self.active: dict[Labels, Alert] = {}
        self._group_labels = group_labels
        self._external = external_labels
        self._external_url = external_url
        self._alerts_metric = alerts_metric

    def _alert_for(self, s: VSample, query: QueryFn, t: float) -> tuple[Labels, Alert]:
        data = TemplateData(dict(s.metric), s.value, self._external, self._external_url, query, t)
        labels = {k: v for k, v in s.metric if k != NAME}
        labels.update(self._group_labels)
        for name, template in self.rule.labels:
            labels[name] = template.expand(data)
        labels = {k: v for k, v in labels.items() if v}
        labels["alertname"] = self.rule.name
        key = tuple(sorted(labels.items()))
        annotations = tuple((k, tpl.expand(data)) for k, tpl in self.rule.annotations)
        return key, Alert(key, annotations, AlertState.PENDING, s.value, t)

    def _blind_to(self, alert: Alert) -> bool:
        """Whether this firing alert is about a GPU the backend cannot see now: the rule reads
        the hardware's series and the alert names a GPU."""
        return (
            alert.state == AlertState.FIRING
            and self.provenance == Provenance.HARDWARE
            and any(k == "uuid" for k, _ in alert.labels)
        )

    def _keeps_firing(self, alert: Alert, t: float) -> bool:
        """keep_firing_for: a firing alert whose condition cleared fires on that long."""
        if alert.state != AlertState.FIRING or self.rule.keep_firing_for <= 0:
            return False
        if alert.keep_firing_since is None:
            alert.keep_firing_since = t
        return t - alert.keep_firing_since < self.rule.keep_firing_for

    def evaluate(
        self, ev: Evaluator, t: float, limit: int, sink: Sink, blind: bool = False
    ) -> list[Transition]:
        """One evaluation at `t`. `blind`: the GPU backend is down, so a GPU's firing alert
        whose series went with it keeps firing, unresolved, until the backend says again
        (an exporter's restart is no GPU's recovery)."""
        vector = _scalar_as_vector(ev.eval(self.rule.expr, t), t)
        current: dict[Labels, Alert] = {}
        query = _query_with(ev)
        for s in vector:
            key, alert = self._alert_for(s, query, t)
            if key in current:
                raise EvalError(
                    "vector contains metrics with the same labelset after applying alert labels"
                )
            current[key] = alert
        transitions: list[Transition] = []
        for key, alert in current.items():
            existing = self.active.get(key)
            if existing is not None and existing.state != AlertState.INACTIVE:
                existing.value, existing.annotations = alert.value, alert.annotations
                existing.keep_firing_since = None
            else:
                self.active[key] = alert
        active_count = 0
        for key, alert in list(self.active.items()):
            if key not in current:
                keep_firing = (blind and self._blind_to(alert)) or self._keeps_firing(alert, t)
                if alert.state == AlertState.PENDING or (
                    alert.resolved_at is not None and t - alert.resolved_at > RESOLVED_RETENTION_S
                ):
                    del self.active[key]
                if alert.state != AlertState.INACTIVE and not keep_firing:
                    old = alert.state
                    alert.state, alert.resolved_at = AlertState.INACTIVE, t
                    if old == AlertState.FIRING:
                        transitions.append(Transition(self.rule.name, alert, old, alert.state, t))
                if not keep_firing:
                    continue
            active_count += 1
            if alert.state == AlertState.PENDING and t - alert.active_at >= self.rule.hold:
                alert.state, alert.fired_at = AlertState.FIRING, t
                transitions.append(
                    Transition(self.rule.name, alert, AlertState.PENDING, AlertState.FIRING, t)
                )
        if limit > 0 and active_count > limit:
            self.active.clear()
            raise EvalError(f"exceeded limit of {limit} with {active_count} alerts")
        sink(self.source, t, self.series())
        return transitions

    def series(self) -> list[Sample]:
        """The ALERTS-style series of the pending and firing alerts."""
        return [
            Sample(self._alerts_metric, (*a.labels, ("alertstate", a.state.value)), 1.0)
            for a in self.active.values()
            if a.state != AlertState.INACTIVE
        ]


Rule = AlertingRule | RecordingRule


@dataclass
class RuleGroup:
    definition: GroupDef
    rules: list[Rule] = field(default_factory=list)
    last_evaluation: float | None = None
    evaluation_seconds: float = 0.0

    @classmethod
    def build(
        cls,
        definition: GroupDef,
        external_labels: Mapping[str, str] | None = None,
        alerts_metric: str = "ALERTS",
        external_url: str = "",
        provenance: Mapping[tuple[str, int], Provenance] | None = None,
    ) -> RuleGroup:
        """`provenance` is every loaded rule's (records in other groups decide it too); by
        default, what this group alone shows."""
        group = cls(definition)
        external = external_labels or {}
        if provenance is None:
            provenance = rule_provenance([definition])
        for i, rule in enumerate(definition.rules):
            source = f"{rule.kind}:{definition.key}:{i}"
            if rule.kind == "alert":
                group.rules.append(
                    AlertingRule(
                        rule,
                        definition.labels,
                        source,
                        external,
                        alerts_metric,
                        external_url=external_url,
                        provenance=provenance[definition.key, i],
                    )
                )
            else:
                group.rules.append(RecordingRule(rule, definition.labels, source))
        return group

    def evaluate(
        self,
        ev: Evaluator,
        t: float,
        sink: Sink,
        blind: bool = False,
        aside: StepAside | None = None,
    ) -> list[Transition]:
        """Evaluate every rule in order at `t`; a failing rule is marked and the rest go on.
        `blind`: the GPU backend is down (AlertingRule.evaluate). `aside`, called before each
        rule (and by the evaluator as it reads), waits while a client is served; the group's
        and the rules' durations leave that wait out."""
        transitions: list[Transition] = []
        started = time.perf_counter()
        aside = aside if aside is not None else StepAside(never, 0.0)
        waited_before = aside.waited
        for rule in self.rules:
            aside()
            rule_started, rule_waited = time.perf_counter(), aside.waited
            try:
                if isinstance(rule, AlertingRule):
                    transitions += rule.evaluate(ev, t, self.definition.limit, sink, blind)
                else:
                    rule.evaluate(ev, t, sink)
            except EvalError as exc:
                rule.status.health, rule.status.last_error = "err", str(exc)
                sink(rule.source, t, [])
            except Exception as exc:  # a bug must cost one rule, never the daemon
                log.exception("rule %s failed", rule.rule.name)
                rule.status.health, rule.status.last_error = "err", f"internal error: {exc}"
                sink(rule.source, t, [])
            else:
                rule.status.health, rule.status.last_error = "ok", ""
            rule.status.last_evaluation = t
            own = time.perf_counter() - rule_started - (aside.waited - rule_waited)
            rule.status.evaluation_seconds = max(0.0, own)
        self.last_evaluation = t
        own = time.perf_counter() - started - (aside.waited - waited_before)
        self.evaluation_seconds = max(0.0, own)
        return transitions
