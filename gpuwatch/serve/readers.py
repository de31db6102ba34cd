"""What the daemon's readers (the HTTP API, the control socket, their JSON bodies) are handed:
every dependency named, each a narrow read-only view, as Prometheus's web.Options names what its
web handler reads. The readers never hold the Daemon itself."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Protocol

from gpuwatch.clock import Clock
from gpuwatch.config import Config
from gpuwatch.daemon import Daemon, EventLog
from gpuwatch.health.verdict import Verdict
from gpuwatch.health.view import NodeView
from gpuwatch.model import BackendState
from gpuwatch.push.jobs import JobInputs
from gpuwatch.reports.reporter import JobReports
from gpuwatch.rules.engine import RuleEngine
from gpuwatch.state.journal import Journal
from gpuwatch.store.tsdb import Store
from gpuwatch.web.foreground import Serving


class NodeState(Protocol):
    """The daemon as its readers see it: the last cycle, its verdict, and how sampling goes."""

    @property
    def config(self) -> Config: ...  # the running config (a reload replaces it)

    @property
    def view(self) -> NodeView: ...

    @property
    def backend(self) -> BackendState: ...

    @property
    def started_at(self) -> float: ...

    @property
    def last_cycle_end(self) -> float | None: ...

    @property
    def last_cycle_duration(self) -> float: ...

    def node_verdict_now(self) -> tuple[Verdict | None, str]: ...

    def sampling_problem(self) -> str: ...


@dataclass(frozen=True)
class ReaderOptions:
    node: NodeState
    clock: Clock
    store: Store  # read: /metrics, history, each GPU's latest values
    rules: RuleEngine | None  # read: alerts and rules
    journal: Journal | None  # read: events
    events: EventLog  # recent events, and a listener for each event stream while it is open
    cycle_listeners: list[Callable[[float], None]]  # told of each cycle, per event stream
    jobs: JobInputs  # pushes are written here, the one thing a reader adds to
    reports: JobReports | None = None
    # Held while /metrics is written, so that the rules' evaluation steps aside meanwhile.
    serving: Serving = nullcontext


def reader_options(
    daemon: Daemon,
    reports: JobReports | None = None,
    serving: Serving = nullcontext,
) -> ReaderOptions:
    """The readers' views of a built daemon, and nothing more of it."""
    return ReaderOptions(
        node=daemon,
        clock=daemon.clock,
        store=daemon.store,
        rules=daemon.rules,
        journal=daemon.journal,
        events=daemon.events,
        cycle_listeners=daemon.cycle_listeners,
        jobs=daemon.jobs,
        reports=reports,
        serving=serving,
    )
