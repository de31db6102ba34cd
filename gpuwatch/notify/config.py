"""The `notify:` section of the config: receivers, the routing tree and inhibition rules.

Routing follows Alertmanager's route tree (matchers, group_by, group_wait, group_interval,
repeat_interval, continue, child routes inheriting from their parent). Without a `route`, every
receiver gets every hardware alert through gpuwatch's default tree: critical alerts one by one
at once, everything else folded into one message per node and alert name. A job's alerts
(`provenance="job"`) go to `job_receivers` only (by default every receiver but PagerDuty's:
a job's NaN is its owner's news, not the on-call's page), one message per node, job and alert
however many ranks fire.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwatch.notify.matchers import Matcher, parse_matcher
from gpuwatch.text.secrets import Secret, parse_secret
from gpuwatch.text.units import parse_duration
from gpuwatch.text.yamlfile import Checker, PathKey, YamlDoc, boolean, http_url, one_of, text

RECEIVER_TYPES = ("webhook", "slack", "mattermost", "teams", "discord", "pagerduty", "alertmanager")
PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
# Requests per second each service accepts from one webhook (REFERENCE.md); 0: no limit.
DEFAULT_RATE_LIMITS = {
    "webhook": 0.0,
    "slack": 1.0,
    "mattermost": 10.0,
    "teams": 4.0,
    "discord": 1.0,
    "pagerduty": 2.0,
    "alertmanager": 0.0,
}
ALL_LABELS = ("...",)  # group_by: [...] groups by every label: each alert alone


@dataclass(frozen=True, slots=True)
class ReceiverConfig:
    name: str
    type: str
    url: Secret
    send_resolved: bool = True
    rate_limit: float = 0.0  # requests per second, 0 for none
    timeout: float = 10.0
    routing_key: Secret | None = None  # PagerDuty's integration key


@dataclass(frozen=True, slots=True)
class Route:
    receivers: tuple[str, ...]
    matchers: tuple[Matcher, ...] = ()
    group_by: tuple[str, ...] = ("node", "alertname")
    group_wait: float = 30.0
    group_interval: float = 300.0
    repeat_interval: float = 4 * 3600.0
    continue_: bool = False
    routes: tuple[Route, ...] = ()
    name: str = "root"  # a stable path in the tree, part of each group's key


@dataclass(frozen=True, slots=True)
class InhibitRule:
    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...]


def _m(*texts: str) -> tuple[Matcher, ...]:
    return tuple(parse_matcher(t) for t in texts)


# A lost or unresponsive GPU silences that GPU's other alerts; a down backend, the node's.
GPU_GONE = 'alertname=~"GpuFellOffBus|GpuUnresponsive"'
DEFAULT_INHIBIT_RULES = (
    InhibitRule(_m(GPU_GONE), _m('alertname!~"GpuFellOffBus|GpuUnresponsive"'), ("node", "gpu")),
    InhibitRule(
        _m('alertname="GpuwatchBackendDown"'), _m('alertname!="GpuwatchBackendDown"'), ("node",)
    ),
)


JOB_GROUP_BY = ("node", "job", "alertname")


def default_route(receivers: tuple[str, ...], job_receivers: tuple[str, ...] = ()) -> Route:
    """A job's alerts to its owners' receivers, one message per job and alert; the hardware's
    critical alerts alone and at once (resolved within a minute), the rest folded per node
    and alert name after 30 s, so a burst of warnings is one message per incident."""
    jobs = Route(
        job_receivers,
        _m('provenance="job"'),
        group_by=JOB_GROUP_BY,
        group_wait=30.0,
        group_interval=300.0,
        name="root/job",
    )
    critical = Route(
        receivers,
        _m('severity="critical"'),
        group_by=ALL_LABELS,
        group_wait=0.0,
        group_interval=60.0,
        name="root/critical",
    )
    return Route(receivers, routes=(jobs, critical))


@dataclass(frozen=True, slots=True)
class NotifyConfig:
    receivers: tuple[ReceiverConfig, ...] = ()
    route: Route | None = None  # None: default_route over every receiver
    inhibit_rules: tuple[InhibitRule, ...] = DEFAULT_INHIBIT_RULES
    external_url: str = ""  # where a reader of a message can look; default the daemon's URL
    runbook_url: str = ""  # prefix for a per-alert runbook link: runbook_url + alertname
    job_receivers: tuple[str, ...] | None = None  # None: every receiver but PagerDuty's
    job_notifications_per_hour: int = 6  # per receiver and job; more wait for the next hour

    @property
    def jobs_to(self) -> tuple[str, ...]:
        if self.job_receivers is not None:
            return self.job_receivers
        return tuple(r.name for r in self.receivers if r.type != "pagerduty")

    @property
    def tree(self) -> Route:
        return self.route or default_route(tuple(r.name for r in self.receivers), self.jobs_to)

    def as_dict(self) -> dict[str, Any]:
        """For `config check`: the config file's own keys, so the output is a config that
        loads; secrets say where they come from, never what they are."""
        out: dict[str, Any] = {
            "receivers": [_receiver_dict(r) for r in self.receivers],
            # No route: the built-in one, which sends to every receiver and so has no
            # spelling in the file (a route names one receiver).
            **({"route": _route_dict(self.route, "")} if self.route is not None else {}),
            "inhibit_rules": [
                {
                    "source_matchers": [str(m) for m in i.source],
                    "target_matchers": [str(m) for m in i.target],
                    "equal": list(i.equal),
                }
                for i in self.inhibit_rules
            ],
        }
        for key in ("external_url", "runbook_url"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.job_receivers is not None:
            out["job_receivers"] = list(self.job_receivers)
        out["job_notifications_per_hour"] = self.job_notifications_per_hour
        return out


def _receiver_dict(r: ReceiverConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"name": r.name, "type": r.type}
    if r.url.source != "default":
        out["url"] = r.url.as_config()
    if r.routing_key is not None:
        out["routing_key"] = r.routing_key.as_config()
    out.update(send_resolved=r.send_resolved, rate_limit=r.rate_limit, timeout=r.timeout)
    return out


def _route_dict(route: Route, parent_receiver: str) -> dict[str, Any]:
    receiver = route.receivers[0] if route.receivers else ""
    out: dict[str, Any] = {"receiver": receiver} if receiver != parent_receiver else {}
    out.update(
        matchers=[str(m) for m in route.matchers],
        group_by=list(route.group_by),
        group_wait=route.group_wait,
        group_interval=route.group_interval,
        repeat_interval=route.repeat_interval,
    )
    if route.continue_:
        out["continue"] = True
    if route.routes:
        out["routes"] = [_route_dict(r, receiver) for r in route.routes]
    return out


# -- parsing -------------------------------------------------------------------------------
NOTIFY_KEYS = ("receivers", "route", "inhibit_rules", "external_url", "runbook_url",
               "job_receivers", "job_notifications_per_hour")  # fmt: skip
RECEIVER_KEYS = ("name", "type", "url", "send_resolved", "rate_limit", "timeout", "routing_key")
ROUTE_KEYS = (
    "receiver",
    "matchers",
    "group_by",
    "group_wait",
    "group_interval",
    "repeat_interval",
    "continue",
    "routes",
)


def _duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return seconds


def _positive(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"expected a number of requests per second (0: no limit), got {value!r}")
    return float(value)


def _labels(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"expected a list of label names (or ['...']), got {value!r}")
    return tuple(value)


def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"expected a list of receiver names ([] for none), got {value!r}")
    return tuple(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected a whole number of at least 1, got {value!r}")
    return value


def _matchers(value: Any) -> tuple[Matcher, ...]:
    if not isinstance(value, list):
        raise ValueError(f'expected a list of matchers such as severity="critical", got {value!r}')
    return tuple(parse_matcher(v) for v in value)


class _Parser:
    def __init__(self, r: Checker, doc: YamlDoc) -> None:
        self.r = r
        self.doc = doc
        self.base = Path(doc.file).parent

    def secret(self, data: dict[str, Any], path: PathKey, key: str) -> Secret | None:
        return self.r.value(data, path, key, lambda v: parse_secret(v, self.base), None)

    def receiver(self, raw: Any, path: PathKey, seen: set[str]) -> ReceiverConfig | None:
        r = self.r
        data = r.section(raw, path, RECEIVER_KEYS)
        ok = r.require(data, path, "name", "the name routes refer to")
        ok = r.require(data, path, "type", f"one of {', '.join(RECEIVER_TYPES)}") and ok
        name = r.value(data, path, "name", text, "")
        kind = r.value(data, path, "type", one_of(RECEIVER_TYPES), "")
        if name in seen:
            r.problems.append(self.doc.problem((*path, "name"), f"receiver {name!r} defined twice"))
        seen.add(name)
        url = self.secret(data, path, "url")
        if url is None and kind == "pagerduty":
            url = Secret(PAGERDUTY_URL, "default")
        elif url is None:
            r.require(data, path, "url", "where to POST")
            ok = False
        else:
            try:
                http_url(url.reveal())
            except ValueError as exc:
                r.problems.append(self.doc.problem((*path, "url"), str(exc)))
        routing_key = self.secret(data, path, "routing_key")
        if kind == "pagerduty" and routing_key is None:
            r.require(data, path, "routing_key", "PagerDuty's integration key")
            ok = False
        if not ok or url is None or kind not in DEFAULT_RATE_LIMITS:
            return None
        return ReceiverConfig(
            name=name,
            type=kind,
            url=url,
            send_resolved=r.value(data, path, "send_resolved", boolean, True),
            rate_limit=r.value(data, path, "rate_limit", _positive, DEFAULT_RATE_LIMITS[kind]),
            timeout=r.value(data, path, "timeout", _duration, 10.0) or 10.0,
            routing_key=routing_key,
        )

    def route(self, raw: Any, path: PathKey, parent: Route | None, names: set[str]) -> Route:
        r = self.r
        data = r.section(raw, path, ROUTE_KEYS)
        receiver = r.value(data, path, "receiver", text, "")
        if receiver and receiver not in names:
            r.problems.append(
                self.doc.problem((*path, "receiver"), f"no receiver named {receiver!r}")
            )
        if parent is None and not receiver:
            r.require(data, path, "receiver", "the root route's receiver")
        inherited = parent or Route(())
        route = Route(
            receivers=(receiver,) if receiver else inherited.receivers,
            matchers=r.value(data, path, "matchers", _matchers, ()),
            group_by=r.value(data, path, "group_by", _labels, inherited.group_by),
            group_wait=r.value(data, path, "group_wait", _duration, inherited.group_wait),
            group_interval=r.value(
                data, path, "group_interval", _duration, inherited.group_interval
            ),
            repeat_interval=r.value(
                data, path, "repeat_interval", _duration, inherited.repeat_interval
            ),
            continue_=r.value(data, path, "continue", boolean, False),
            name="/".join(str(p) for p in path) or "root",
        )
        if route.group_interval <= 0:
            r.problems.append(self.doc.problem((*path, "group_interval"), "must be above zero"))
        children = data.get("routes") or []
        if not isinstance(children, list):
            r.problems.append(self.doc.problem((*path, "routes"), "expected a list of routes"))
            children = []
        kids = tuple(
            self.route(c, (*path, "routes", i), route, names) for i, c in enumerate(children)
        )
        return Route(
            route.receivers,
            route.matchers,
            route.group_by,
            route.group_wait,
            route.group_interval,
            route.repeat_interval,
            route.continue_,
            kids,
            route.name,
        )

    def inhibit_rule(self, raw: Any, path: PathKey) -> InhibitRule:
        r = self.r
        data = r.section(raw, path, ("source_matchers", "target_matchers", "equal"))
        r.require(data, path, "source_matchers", "which alerts inhibit")
        r.require(data, path, "target_matchers", "which alerts they inhibit")
        return InhibitRule(
            r.value(data, path, "source_matchers", _matchers, ()),
            r.value(data, path, "target_matchers", _matchers, ()),
            r.value(data, path, "equal", _labels, ()),
        )


def parse_notify(r: Checker, doc: YamlDoc, raw: Any) -> NotifyConfig:
    if raw is None:
        return NotifyConfig()
    p = _Parser(r, doc)
    path: PathKey = ("notify",)
    data = r.section(raw, path, NOTIFY_KEYS)
    raw_receivers = data.get("receivers") or []
    if not isinstance(raw_receivers, list):
        r.problems.append(doc.problem((*path, "receivers"), "expected a list of receivers"))
        raw_receivers = []
    seen: set[str] = set()
    receivers = tuple(
        rc
        for i, item in enumerate(raw_receivers)
        if (rc := p.receiver(item, (*path, "receivers", i), seen)) is not None
    )
    route = p.route(data["route"], (*path, "route"), None, seen) if "route" in data else None
    inhibit: tuple[InhibitRule, ...] = DEFAULT_INHIBIT_RULES
    if "inhibit_rules" in data:
        items = data["inhibit_rules"] or []
        if not isinstance(items, list):
            r.problems.append(doc.problem((*path, "inhibit_rules"), "expected a list"))
            items = []
        inhibit = tuple(p.inhibit_rule(x, (*path, "inhibit_rules", i)) for i, x in enumerate(items))
    job_receivers = r.value(data, path, "job_receivers", _names, None)
    for i, name in enumerate(job_receivers or ()):
        if name not in seen:
            where = (*path, "job_receivers", i)
            r.problems.append(doc.problem(where, f"no receiver named {name!r}"))
    return NotifyConfig(
        receivers=receivers,
        route=route,
        inhibit_rules=inhibit,
        external_url=r.value(data, path, "external_url", http_url, ""),
        runbook_url=r.value(data, path, "runbook_url", http_url, ""),
        job_receivers=job_receivers,
        job_notifications_per_hour=r.value(data, path, "job_notifications_per_hour", _count, 6),
    )
