"""What the actions and the notifier would have done with a backtest's alerts: for each node
(a target's `instance`) of the history, the drains the Slurm actions would have made for the
causes the alerts raise, where the circuit breaker would have held one, and each page every
receiver would have been sent.

It runs the daemon's own parts where they are pure: `raised_causes` (the causes an alert's
`cause` and `severity` make), `hold` (the breaker), `routes_for` and the Dispatcher
(Alertmanager's grouping, group_wait, group_interval, repeat_interval, inhibition), one
dispatcher a node as each node's daemon notifies for itself. What it cannot know:

- causes that are not alerts (the readings the daemon judges itself, an XID until a reset):
  only the rule files' alerts drain here, which is what a rule or `drain_on` change moves;
- the scheduler: the nodes of the history are one partition, none drained by anyone else,
  and a drain takes effect at once (no checkpoint grace);
- silences, and the receivers' answers: every page is sent the moment it is due.
"""

from __future__ import annotations

import fnmatch
from collections import defaultdict
from dataclasses import dataclass, replace

from gpuwatch.actions.breaker import hold
from gpuwatch.actions.config import SlurmActions
from gpuwatch.actions.drainer import drain_reason
from gpuwatch.actions.slurm import OWN_REASON_PREFIX, SlurmNode
from gpuwatch.health.raised import raised_causes
from gpuwatch.health.verdict import Cause, Health
from gpuwatch.model import NotifyAlert, fingerprint
from gpuwatch.notify.config import NotifyConfig, ReceiverConfig
from gpuwatch.notify.db import NotifyDb, Outgoing
from gpuwatch.notify.dispatch import Dispatcher
from gpuwatch.notify.message import Notification
from gpuwatch.notify.silences import Silences
from gpuwatch.rules.alerting import AlertingRule
from gpuwatch.rules.outgoing import alerts_to_send

PARTITION = "history"  # the one partition the breaker counts: every node of the history


@dataclass(frozen=True, slots=True)
class Action:
    node: str
    time: float
    action: str  # drain, held, resume
    message: str


@dataclass(frozen=True, slots=True)
class Page:
    receiver: str
    node: str
    time: float
    alerts: tuple[tuple[str, str], ...]  # (alertname, firing or resolved), as the page lists


@dataclass(slots=True)
class _Node:
    drained_at: float | None = None
    held: str = ""  # the breaker's message while it holds this node's drain
    clear_since: float | None = None  # since when no cause has made it unhealthy


class Aftermath:
    """Handed the alerting rules after each evaluation time (Backtest.run's `observe`)."""

    def __init__(
        self, slurm: SlurmActions | None, notify: NotifyConfig | None, nodes: set[str]
    ) -> None:
        self.slurm = slurm
        self.notify = notify
        self.nodes = nodes  # every node of the history: the breaker's partition (grows)
        self.actions: list[Action] = []
        self.pages: list[Page] = []
        self._state: dict[str, _Node] = defaultdict(_Node)
        self._dispatchers: dict[str, Dispatcher] = {}

    def observe(self, t: float, rules: list[AlertingRule]) -> None:
        by_node: dict[str, list[NotifyAlert]] = defaultdict(list)
        for alert in alerts_to_send(rules, ""):
            node = alert.label("instance") or "-"
            labels = tuple(sorted({**dict(alert.labels), "node": node}.items()))
            by_node[node].append(replace(alert, labels=labels, fingerprint=fingerprint(labels)))
        if self.slurm is not None:
            for node in sorted(self.nodes | set(by_node)):
                self._act(t, node, by_node.get(node, []))
        if self.notify is not None:
            for node in sorted(set(by_node) | set(self._dispatchers)):
                self._page(t, node, by_node.get(node, []))

    def finish(self, end: float) -> None:
        """Send what falls due by the end of the span."""
        for dispatcher in self._dispatchers.values():
            self._flush(dispatcher, end)

    # -- drains ----------------------------------------------------------------------------
    def _act(self, t: float, node: str, alerts: list[NotifyAlert]) -> None:
        assert self.slurm is not None
        state = self._state[node]
        # A job's alerts (rules over a job's series) page its route and never judge.
        firing = [
            (dict(a.labels), dict(a.annotations))
            for a in alerts
            if a.firing and a.label("provenance") != "job"
        ]
        causes = [r.cause for r in raised_causes(firing)]
        unhealthy = any(c.state is Health.UNHEALTHY for c in causes)
        wanted = tuple(
            c for c in causes if c.state is Health.UNHEALTHY and self._opted_in(c.key, self.slurm)
        )
        if unhealthy:
            state.clear_since = None
        elif state.clear_since is None:
            state.clear_since = t
        if wanted and state.drained_at is None:
            self._drain(t, node, state, wanted)
        elif not wanted:
            state.held = ""
            if (
                state.drained_at is not None
                and self.slurm.resume
                and state.clear_since is not None
                and t - state.clear_since >= self.slurm.resume_after
            ):
                state.drained_at = None
                self.actions.append(Action(node, t, "resume", f"resumed node {node}"))

    def _drain(self, t: float, node: str, state: _Node, causes: tuple[Cause, ...]) -> None:
        assert self.slurm is not None
        fleet = [
            SlurmNode(
                name,
                (PARTITION,),
                frozenset({"drain"} if self._state[name].drained_at is not None else {"idle"}),
                OWN_REASON_PREFIX if self._state[name].drained_at is not None else "",
                self._state[name].drained_at,
            )
            for name in sorted(self.nodes | {node})
        ]
        slurm = self.slurm
        held = hold(fleet, (PARTITION,), t, slurm.max_drained_fraction, slurm.max_drains_per_hour)
        if held is not None:
            if held.message != state.held:
                self.actions.append(Action(node, t, "held", f"drain held: {held.message}"))
            state.held = held.message
            return
        state.held, state.drained_at = "", t
        self.actions.append(Action(node, t, "drain", f"drained: {drain_reason(causes)}"))

    @staticmethod
    def _opted_in(key: str, slurm: SlurmActions) -> bool:
        return any(fnmatch.fnmatchcase(key, pattern) for pattern in slurm.drain_on)

    # -- pages -----------------------------------------------------------------------------
    def _page(self, t: float, node: str, alerts: list[NotifyAlert]) -> None:
        dispatcher = self._dispatchers.get(node)
        if dispatcher is None:
            assert self.notify is not None
            db = NotifyDb(None)
            dispatcher = Dispatcher(
                self.notify, db, Silences(db), self._render(node), node=node, external_url=""
            )
            self._dispatchers[node] = dispatcher
        self._flush(dispatcher, t)  # what fell due since the last evaluation, at its time
        dispatcher.update(t, alerts, {})
        self._flush(dispatcher, t)

    @staticmethod
    def _flush(dispatcher: Dispatcher, until: float) -> None:
        while (due := dispatcher.next_due()) is not None and due <= until:
            dispatcher.flush_due(due)

    def _render(self, node: str) -> _Capture:
        return _Capture(node, self.pages)


class _Capture:
    """The render step of one node's dispatcher: notes each page instead of formatting it."""

    def __init__(self, node: str, pages: list[Page]) -> None:
        self.node = node
        self.pages = pages

    def __call__(self, receiver: ReceiverConfig, n: Notification) -> Outgoing:
        listed = tuple((a.label("alertname"), a.status) for a in n.alerts)
        self.pages.append(Page(receiver.name, self.node, n.time, listed))
        return Outgoing(receiver.name, n.group_key, b"", {})
