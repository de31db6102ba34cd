"""Rule files tried on recorded history: gpuwatch's own engine evaluates them at each of their
groups' evaluation times over a span of the past, reading the raw samples a Prometheus server
recorded, and says when each alert was pending and firing.

The samples come through `fetch` (the selector's raw samples in a span), a chunk of time at a
time, as far back before each evaluation as the rules read (a range, an offset, the 5-minute
lookback, a subquery); what no evaluation can read any more is dropped, so a week's history
costs the memory of a chunk and the rules' reach, not of the week.

Prometheus's stale markers, which its query API leaves out, are put back from each target's
`up` (rules/staleness.py), so a series that went away stops where Prometheus saw it stop.

The evaluation times are those Prometheus's rule manager would use for a group of that
interval whose offset is 0: the multiples of the interval, in Unix time. Alerts start inactive
at the span's start, as in a Prometheus that starts then: an alert already true waits out its
`for` again.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import groupby

import promql_parser as pp

from gpuwatch.promql.evaluator import DEFAULT_LOOKBACK_S, Evaluator
from gpuwatch.promql.history import history_needed
from gpuwatch.promql.memory import MemoryStorage
from gpuwatch.promql.values import NAME, Labels
from gpuwatch.promql.walk import nodes
from gpuwatch.rules.alerting import AlertingRule, AlertState, RuleGroup
from gpuwatch.rules.files import GroupDef
from gpuwatch.rules.staleness import UP, Points, Scrapes, Target, target_of
from gpuwatch.store.series import on_ms

# A selector's raw samples in (start, end]: (its labels with __name__, [(time, value), ...]).
Fetched = Iterable[tuple[Labels, list[tuple[float, float]]]]
FetchFn = Callable[[str, float, float], Fetched]
# Handed the alerting rules after each evaluation time (notify and the actions replayed).
Observe = Callable[[float, list[AlertingRule]], None]
CHUNK_S = 3600.0  # history read at a time
DEFAULT_INTERVAL_S = 60.0  # Prometheus's default evaluation_interval


@dataclass(frozen=True, slots=True)
class Interval:
    """An alert in one state from `start` up to, not including, `end` (None: still so when
    the span ended)."""

    labels: Labels  # the alert's, alertname included, sorted
    state: str  # pending or firing
    start: float
    end: float | None

    @property
    def alertname(self) -> str:
        return dict(self.labels).get("alertname", "")


def selector_text(node: pp.VectorSelector) -> str:
    """The selector as Prometheus's query API reads it: its name and matchers, no offset."""
    matchers = [
        f"{m.name}{_OPS[str(m.op)]}{_quoted(m.value)}"
        for m in node.matchers.matchers
        if not (node.name and m.name == NAME)
    ]
    if node.name and not matchers:
        return str(node.name)
    return f"{node.name or ''}{{{','.join(matchers)}}}"


_OPS = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selections(groups: list[GroupDef]) -> dict[str, float]:
    """Each selector the rules read, with how far before an evaluation they read it; not
    those of series the files record themselves, which the backtest makes (a Prometheus
    that loaded the same files has them too, from its own evaluations)."""
    out: dict[str, float] = {}
    recorded = {r.name for g in groups for r in g.rules if r.kind == "record"}
    for group in groups:
        for rule in group.rules:
            reach = history_needed(rule.expr, DEFAULT_LOOKBACK_S)
            longest = max(reach.values(), default=DEFAULT_LOOKBACK_S)
            for node, _depth in nodes(rule.expr):
                if isinstance(node, pp.VectorSelector) and node.name not in recorded:
                    text = selector_text(node)
                    # by name (a selector without one: all such of the rule, None)
                    got = reach.get(node.name or None, longest)
                    out[text] = max(out.get(text, 0.0), got)
    return out


def evaluation_times(interval: float, start: float, end: float) -> Iterator[float]:
    """The multiples of `interval` in [start, end]."""
    first = math.ceil(start / interval - 1e-9)
    last = math.floor(end / interval + 1e-9)
    return (k * interval for k in range(first, last + 1))


class Backtest:
    def __init__(
        self,
        groups: list[GroupDef],
        fetch: FetchFn,
        *,
        default_interval: float = DEFAULT_INTERVAL_S,
        external_labels: Mapping[str, str] | None = None,
        chunk: float = CHUNK_S,
    ) -> None:
        self.definitions = groups
        self.fetch = fetch
        self.default_interval = default_interval
        self.external = dict(external_labels or {})
        self.chunk = chunk
        self.selections = selections(groups)
        # What any rule reads back (of a series the files record too: `max_over_time(r[30m])`
        # of a record `r`), plus a chunk: what is kept of the history.
        reach = [
            max(history_needed(r.expr, DEFAULT_LOOKBACK_S).values(), default=DEFAULT_LOOKBACK_S)
            for g in groups
            for r in g.rules
        ]
        self.keep = max(reach, default=DEFAULT_LOOKBACK_S) + chunk
        # Rules that failed, by name: (evaluations failed, the last error).
        self.failures: dict[str, tuple[int, str]] = {}
        self.samples_read = 0
        self.instances: set[str] = set()  # the targets the history has samples of
        self.scrapes = Scrapes()

    def run(self, start: float, end: float, observe: Observe | None = None) -> list[Interval]:
        """Each alert's pending and firing intervals over [start, end], in order of start.
        `observe` is handed the alerting rules after each evaluation time's groups have run
        (what the notifier and the actions would have seen then)."""
        groups = [RuleGroup.build(d, self.external) for d in self.definitions]
        # Each group's times, merged as they come: a year at 1 s is never a list.
        times = [
            _numbered(order, evaluation_times(self._interval(group), start, end))
            for order, group in enumerate(groups)
        ]
        schedule = groupby(heapq.merge(*times), key=lambda due: due[0])
        alerting = [r for g in groups for r in g.rules if isinstance(r, AlertingRule)]
        storage = MemoryStorage()
        evaluator = Evaluator(storage, subquery_step=self.default_interval)
        reach = max(self.selections.values(), default=DEFAULT_LOOKBACK_S)
        read_until = start - reach
        opened: dict[tuple[Labels, str], float] = {}
        done: list[Interval] = []
        for t, due in schedule:
            while read_until < t:
                upto = max(min(read_until + self.chunk, end), t)
                self._read(storage, read_until, upto)
                read_until = upto
                storage.trim(read_until - self.keep)
            now: set[tuple[Labels, str]] = set()
            ran: set[str] = set()
            for _, order in due:
                group = groups[order]
                group.evaluate(evaluator, t, storage.ingest)
                for rule in group.rules:
                    if rule.status.health == "err":
                        failed, _ = self.failures.get(rule.rule.name, (0, ""))
                        self.failures[rule.rule.name] = (failed + 1, rule.status.last_error)
                    if isinstance(rule, AlertingRule):
                        ran.add(rule.rule.name)
                        now.update(
                            (alert.labels, alert.state.value)
                            for alert in rule.active.values()
                            # resolved alerts are kept a while, as Prometheus does
                            if alert.state != AlertState.INACTIVE
                        )
            for key in [k for k in opened if k not in now and _name(k[0]) in ran]:
                done.append(Interval(key[0], key[1], opened.pop(key), t))
            for key in now - opened.keys():
                opened[key] = t
            if observe is not None:
                observe(t, alerting)
        done += [Interval(labels, state, since, None) for (labels, state), since in opened.items()]
        return sorted(done, key=lambda i: (i.start, i.labels, i.state))

    def _interval(self, group: RuleGroup) -> float:
        return group.definition.interval or self.default_interval

    def _read(self, storage: MemoryStorage, start: float, end: float) -> None:
        chunk: dict[Labels, Points] = {}
        for selector in self.selections:
            for metric, points in self.fetch(selector, start, end):
                if metric in chunk:
                    continue  # read by another selector too
                chunk[metric] = [(round(t * 1000), value) for t, value in points]
                self.samples_read += len(points)
                instance = dict(metric).get("instance")
                if instance:
                    self.instances.add(instance)
        ups: dict[Target, list[int]] = {}
        for metric, points in self.fetch(UP, start, end):
            target = target_of(metric)
            if target is not None:
                ups[target] = sorted(round(t * 1000) for t, _ in points)
        self.scrapes.mark(chunk, ups)
        for metric, marked in chunk.items():
            series = storage.series(metric)
            for ms, value in marked:
                series.add(on_ms(ms / 1000), value)


def _numbered(order: int, times: Iterator[float]) -> Iterator[tuple[float, int]]:
    return ((t, order) for t in times)


def _name(labels: Labels) -> str:
    return dict(labels).get("alertname", "")
