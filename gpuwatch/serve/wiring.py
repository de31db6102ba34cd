"""Building the daemon's components, each handed what it needs at construction: the source,
one store for the daemon and the rules, the rules engine, the journal, the notifier, what acts
on each cycle's verdict, and the reloader. Nothing is attached afterwards."""

from __future__ import annotations

import asyncio
import logging
import signal
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.actions.advice import CheckpointAdvisor
from gpuwatch.actions.drainer import SlurmDrainer
from gpuwatch.clock import Clock
from gpuwatch.config import Config
from gpuwatch.daemon import CycleOutput, Daemon, EventLog
from gpuwatch.health.acks import AckStore
from gpuwatch.health.view import NodeView
from gpuwatch.host.boot import current_boot_id
from gpuwatch.kernel.gpus import GpuDirectory
from gpuwatch.kernel.merge import EventMerger
from gpuwatch.life.book import FILE_NAME as LIFE_FILE
from gpuwatch.life.book import LifeBook
from gpuwatch.life.recorder import LifeRecorder
from gpuwatch.model import Event
from gpuwatch.notify.notifier import Notifier
from gpuwatch.nvml.errors import NvmlModule
from gpuwatch.push.jobs import JobInputs
from gpuwatch.reports.reporter import JobReports
from gpuwatch.rules.engine import RuleEngine
from gpuwatch.rules.outgoing import hardware_firing_names
from gpuwatch.serve.control import UnixSocket
from gpuwatch.serve.preflight import StartupError, config_warnings, load_rules
from gpuwatch.serve.readers import ReaderOptions, reader_options
from gpuwatch.serve.reload import Reloader
from gpuwatch.serve.sources import NoSourceError, make_source, make_watchers
from gpuwatch.serve.verdictfile import VerdictFile
from gpuwatch.serve.webconfig import WebGuard
from gpuwatch.state.journal import Journal
from gpuwatch.state.lock import StateDirLock
from gpuwatch.state.statedir import DIR_MODE, StateProblems, ensure_dir
from gpuwatch.store.tsdb import Store
from gpuwatch.web.foreground import Foreground

log = logging.getLogger(__name__)


class StateKeeper:
    """After each cycle: a state directory removed under the daemon is recreated with its lock,
    its databases (with what they held) and the sockets it was handed; held journal entries are
    written once the disk takes them. A few stat calls when nothing is wrong."""

    def __init__(
        self, state_dir: Path, journal: Journal, notifier: Notifier, lock: StateDirLock | None
    ) -> None:
        self.state_dir = state_dir
        self.journal = journal
        self.notifier = notifier
        self.lock = lock
        self.sockets: list[UnixSocket] = []

    def keep(self, served: UnixSocket) -> None:
        """A socket to recreate should its file go."""
        self.sockets.append(served)

    def after_cycle(self, _now: float, _view: NodeView) -> None:
        try:
            ensure_dir(self.state_dir)
            if self.lock is not None:
                self.lock.renew()
            self.journal.flush_if_needed()
            self.notifier.db.reopen_if_unlinked()
        except (OSError, sqlite3.Error, StartupError) as exc:
            log.error("state directory %s: %s", self.state_dir, exc)
        for served in self.sockets:
            if not served.closed and not served.path.exists() and served.recreating is None:
                served.recreating = asyncio.create_task(_recreate_socket(served))


async def _recreate_socket(served: UnixSocket) -> None:
    try:
        served.path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        await served.listen()
        log.error("%s socket %s was removed: recreated it", served.name, served.path)
    except OSError as exc:
        log.error("%s socket %s: cannot recreate it: %s", served.name, served.path, exc)
    finally:
        served.recreating = None


@dataclass
class Wired:
    """The daemon's components, each built with what it needs."""

    daemon: Daemon
    rules: RuleEngine
    journal: Journal
    notifier: Notifier
    reloader: Reloader
    reports: JobReports
    keeper: StateKeeper
    readers: ReaderOptions  # what the HTTP API and the control socket are handed
    life: LifeRecorder

    async def close(self) -> None:
        """Stop the notifier's senders and close what wiring opened: the outbox, the journal,
        the life record."""
        await self.notifier.stop()
        self.journal.close()
        self.life.close(self.daemon.clock.now())
        self.life.book.close()


def wire(
    config: Config,
    nvml: NvmlModule | None,
    clock: Clock,
    state_dir: Path,
    port: int,
    *,
    guard: WebGuard | None = None,
    boot_id: str | None = None,
    reread: Callable[[], Config] | None = None,
    lock: StateDirLock | None = None,
) -> Wired:
    """The components `gpuwatch run` serves, each handed what it needs: one store for the
    daemon and the rules, the journal of this boot (the machine's unless `boot_id` says), the
    notifier linking back to `port`, what acts on each verdict, and the reloader that sequences
    their reloads. `lock`, the state directory's, is renewed after each cycle."""
    scheme = "https" if guard is not None and guard.config.tls is not None else "http"
    problems = StateProblems(state_dir)
    events = EventLog()
    merger = EventMerger(clock, events.publish)  # one XID seen by NVML and the kernel log
    try:
        source = make_source(config, nvml, clock, merger.publish, state_dir)
    except NoSourceError as exc:
        raise StartupError(str(exc)) from None
    store = Store(config.store.retention)
    foreground = Foreground()  # /metrics pages, which the rules' evaluation steps aside for
    own_url = f"{scheme}://{config.node_name}:{port}"
    rules = load_rules(config, state_dir, store, own_url, foreground.step_aside)
    for warning in config_warnings(config, rules):
        log.warning("%s", warning)
    boot = current_boot_id() if boot_id is None else boot_id
    try:
        journal = Journal(state_dir, config.journal.retention, boot, problems)
    except sqlite3.Error as exc:
        raise StartupError(f"journal in {state_dir}: {exc}") from exc
    try:
        notifier = Notifier(
            config.notify,
            state_dir,
            clock,
            node=config.node_name,
            external_url=f"{scheme}://{config.node_name}:{port}",
            interval=rules.default_interval,
            problems=problems,
        )
    except sqlite3.Error as exc:
        journal.close()
        raise StartupError(f"notification outbox in {state_dir}: {exc}") from exc
    try:
        book = LifeBook(state_dir / LIFE_FILE, problems)
    except sqlite3.Error as exc:
        journal.close()
        notifier.db.close()
        raise StartupError(f"GPU life record in {state_dir}: {exc}") from exc
    life = LifeRecorder(book, config.node_name, boot)
    gpus = GpuDirectory()
    watchers = make_watchers(config, clock, merger.publish, gpus, journal)
    reports = JobReports(state_dir, clock, events.publish)
    keeper = StateKeeper(state_dir, journal, notifier, lock)
    jobs = JobInputs(config.push.limits, config.push.textfile_dir)
    advisor = _advisor(config, jobs, rules, events.publish)
    outputs: list[CycleOutput] = [keeper, VerdictFile(state_dir), reports, advisor, life]
    if config.actions.slurm.enabled:
        drainer = SlurmDrainer(
            config.actions.slurm,
            config.node_name,
            clock,
            events.publish,
            advised_since=lambda: jobs.advice.since if jobs.advice is not None else None,
            grace=config.actions.checkpoint.drain_grace,
        )
        watchers.append(drainer)  # started and stopped with the watchers; its metrics read so
        outputs.append(drainer)
    daemon = Daemon(
        config,
        clock,
        source,
        events,
        watchers=watchers,
        outputs=outputs,
        event_listeners=[reports.on_event, life.on_event],
        gpus=gpus,
        store=store,
        jobs=jobs,
        rules=rules,
        journal=journal,
        acks=AckStore(state_dir),
        notifier=notifier,
        problems=problems,
        collectors=(notifier, problems, life),
    )
    reloader = Reloader(
        lambda: daemon.config,
        daemon.apply,
        rules=rules,
        notifier=notifier,
        guard=guard,
        reread=reread,
    )
    readers = reader_options(daemon, reports, foreground.serving)
    return Wired(daemon, rules, journal, notifier, reloader, reports, keeper, readers, life)


def _advisor(
    config: Config, jobs: JobInputs, rules: RuleEngine, publish: Callable[[Event], None]
) -> CheckpointAdvisor:
    """The checkpoint advice: for actions.checkpoint.advise_on and the causes a drain is coming for;
    an empty `on` turns it off, drains and all."""
    checkpoint = config.actions.checkpoint
    on = checkpoint.advise_on
    on = (*on, *config.actions.slurm.drain_on) if on else ()

    def firing() -> list[str]:
        return hardware_firing_names(rules.alerting_rules())

    named = checkpoint.signal
    number = int(getattr(signal, f"SIG{named}")) if named else None
    return CheckpointAdvisor(on, jobs, firing, publish, signal=number)
