"""Assembling and running the daemon: source, store, sampling loop and HTTP listener."""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import signal
import sqlite3
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from gpuwatch.actions.drainer import SlurmDrainer
from gpuwatch.clock import Clock, within
from gpuwatch.config import Config
from gpuwatch.daemon import Daemon, EventLog
from gpuwatch.gctune import tune_gc
from gpuwatch.health.acks import AckStore
from gpuwatch.host.boot import current_boot_id
from gpuwatch.kernel.gpus import GpuDirectory
from gpuwatch.kernel.merge import EventMerger
from gpuwatch.model import Event
from gpuwatch.notify.notifier import Notifier
from gpuwatch.nvml.errors import NvmlModule
from gpuwatch.push.attribution import Attribution
from gpuwatch.reports.reporter import JobReports
from gpuwatch.rules.engine import RuleEngine
from gpuwatch.serve.api import Api, start_http
from gpuwatch.serve.control import (
    CONTROL_MODE,
    AppServer,
    ControlApi,
    UnixSocket,
    start_socket,
)
from gpuwatch.serve.listen import bind_tcp
from gpuwatch.serve.preflight import (
    StartupError,
    config_warnings,
    load_guard,
    load_rules,
    reach_warnings,
    socket_paths,
)
from gpuwatch.serve.pushserver import PushServer
from gpuwatch.serve.reload import Reloader
from gpuwatch.serve.sdnotify import SystemdNotifier
from gpuwatch.serve.sources import NoSourceError, make_source, make_watchers
from gpuwatch.serve.verdictfile import VerdictFile
from gpuwatch.serve.webconfig import WebGuard
from gpuwatch.state.journal import Journal
from gpuwatch.state.lock import StateDirError, StateDirLock, prepare_state_dir
from gpuwatch.state.statedir import DIR_MODE, StateProblems, ensure_dir
from gpuwatch.store.tsdb import Store
from gpuwatch.text.units import parse_listen

log = logging.getLogger(__name__)


class ListenError(StartupError):
    """The listen address cannot be bound (in use, not ours, not permitted)."""


def real_nvml() -> NvmlModule:
    import pynvml

    return pynvml


@dataclass
class Wired:
    """The daemon's components, each built with what it needs."""

    daemon: Daemon
    rules: RuleEngine
    journal: Journal
    notifier: Notifier
    reloader: Reloader
    reports: JobReports | None = None

    async def close(self) -> None:
        """Stop the notifier's senders and close what wiring opened: the outbox, the journal."""
        await self.notifier.stop()
        self.journal.close()


@dataclass
class Running:
    wired: Wired
    runner: web.AppRunner
    port: int
    sockets: list[UnixSocket]  # the control socket first, then the push socket
    guard: WebGuard | None = None
    lock: StateDirLock | None = None

    @property
    def daemon(self) -> Daemon:
        return self.wired.daemon

    @property
    def scheme(self) -> str:
        return "https" if self.guard is not None and self.guard.config.tls is not None else "http"

    @property
    def control_path(self) -> Path:
        return self.sockets[0].path

    @property
    def push_path(self) -> Path:
        return self.sockets[1].path

    @property
    def url(self) -> str:
        host, _ = parse_listen(self.daemon.config.listen)
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"{self.scheme}://{host if ':' not in host else f'[{host}]'}:{self.port}"

    async def stop(self) -> None:
        await self.runner.cleanup()
        for served in self.sockets:
            await served.close()
        await self.daemon.stop()
        await self.wired.close()
        if self.guard is not None:
            self.guard.close()
        if self.lock is not None:
            self.lock.release()


async def start(
    config: Config,
    nvml: NvmlModule | None,
    clock: Clock,
    reread: Callable[[], Config] | None = None,
) -> Running:
    try:
        state_dir, lock = prepare_state_dir(config.state_dir)
    except StateDirError as exc:
        raise StartupError(str(exc)) from None
    try:
        running = await _start(config, nvml, clock, state_dir, reread)
    except BaseException:
        lock.release()
        raise
    running.lock = lock
    running.daemon.cycle_listeners.append(lambda _: _keep_state_dir(running, state_dir))
    return running


def _keep_state_dir(running: Running, state_dir: Path) -> None:
    """After each cycle: a state directory removed under the daemon is recreated with its lock,
    its databases (with what they held) and the control socket; held journal entries are
    written once the disk takes them. A few stat calls when nothing is wrong."""
    try:
        ensure_dir(state_dir)
        if running.lock is not None:
            running.lock.renew()
        running.wired.journal.flush_if_needed()
        running.wired.notifier.db.reopen_if_unlinked()
    except (OSError, sqlite3.Error, StartupError) as exc:
        log.error("state directory %s: %s", state_dir, exc)
    for served in running.sockets:
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
) -> Wired:
    """The components `gpuwatch run` serves, each handed what it needs: one store for the
    daemon and the rules, the journal of this boot (the machine's unless `boot_id` says), the
    notifier linking back to `port`, and the reloader that sequences their reloads."""
    scheme = "https" if guard is not None and guard.config.tls is not None else "http"
    problems = StateProblems(state_dir)
    events = EventLog()
    merger = EventMerger(clock, events.publish)  # one XID seen by NVML and the kernel log
    try:
        source = make_source(config, nvml, clock, merger.publish, state_dir)
    except NoSourceError as exc:
        raise StartupError(str(exc)) from None
    store = Store(config.store.retention)
    rules = load_rules(config, state_dir, store, f"{scheme}://{config.node_name}:{port}")
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
    gpus = GpuDirectory()
    watchers = make_watchers(config, clock, merger.publish, gpus, journal)
    drainer = None
    if config.actions.slurm.enabled:
        drainer = SlurmDrainer(config.actions.slurm, config.node_name, clock, events.publish)
        watchers.append(drainer)
    daemon = Daemon(
        config,
        clock,
        source,
        events,
        watchers=watchers,
        gpus=gpus,
        store=store,
        rules=rules,
        journal=journal,
        acks=AckStore(state_dir),
        notifier=notifier,
        problems=problems,
        collectors=(notifier, problems),
    )
    if drainer is not None:
        observe = drainer.observe  # each cycle's verdict, once it is reached
        daemon.cycle_listeners.append(lambda now: observe(now, daemon.view.node_verdict))
    daemon.cycle_listeners.append(VerdictFile(daemon, state_dir).observe)
    reports = JobReports(state_dir, clock, events.publish)
    daemon.cycle_listeners.append(lambda now: reports.observe(now, daemon.view.batch))
    events.listeners.append(reports.on_event)
    reloader = Reloader(daemon, rules, notifier, guard, reread)
    return Wired(daemon, rules, journal, notifier, reloader, reports)


async def _start(
    config: Config,
    nvml: NvmlModule | None,
    clock: Clock,
    state_dir: Path,
    reread: Callable[[], Config] | None,
) -> Running:
    guard = load_guard(config)
    control_path, push_path = socket_paths(config)
    host, port = parse_listen(config.listen)
    try:
        listening = bind_tcp(host, port)
    except OSError as exc:
        raise ListenError(f"cannot listen on {config.listen}: {exc.strerror}") from exc
    bound = int(listening[0].getsockname()[1])
    try:
        wired = wire(config, nvml, clock, state_dir, bound, guard=guard, reread=reread)
    except BaseException:
        for sock in listening:
            sock.close()
        raise
    daemon, notifier = wired.daemon, wired.notifier
    runner = await start_http(Api(daemon, reports=wired.reports), listening, guard)
    await notifier.start()
    push = config.push
    stamp = Attribution(lambda: daemon.view.batch.gpus if daemon.view.batch else ()).stamp
    api = ControlApi(daemon, wired.reloader.reload, wired.rules, notifier.silences, stamp)
    sockets: list[UnixSocket] = []
    try:
        control = AppServer(api.app())
        sockets.append(await start_socket("control", control, control_path, CONTROL_MODE))
        pushes = PushServer(daemon.jobs, daemon.clock.now, stamp)
        mode, group = push.socket_mode, push.socket_group
        sockets.append(await start_socket("push", pushes, push_path, mode, group))
    except OSError as exc:
        for served in sockets:
            await served.close()
        await runner.cleanup()
        await wired.close()
        raise StartupError(f"cannot create a unix socket: {exc}") from exc
    for warning in reach_warnings(config, push_path):
        log.warning("%s", warning)
    for path in daemon.problems.damaged():
        daemon.events.publish(
            Event(clock.now(), "state_damaged", None, None,
                  f"state file {path.name.partition('.damaged-')[0]} was damaged: set aside as "
                  f"{path.name}", {"file": path.name})
        )  # fmt: skip
    await daemon.start()
    running = Running(wired, runner, bound, sockets, guard)
    log.info("gpuwatch serving on %s:%d (%s)", host, bound, running.scheme)
    return running


STOP_WITHIN_S = 8.0  # within 10 s, well inside systemd's TimeoutStopSec of 15 s


async def serve(
    config: Config,
    nvml: NvmlModule | None,
    clock: Clock,
    alongside: Callable[[Running], Coroutine[Any, Any, None]] | None = None,
    reread: Callable[[], Config] | None = None,
    *,
    reload_on_hangup: bool = True,
) -> None:
    """Run until SIGTERM/SIGINT (or `alongside` returns); SIGHUP reloads what `reread` reads
    (unless `reload_on_hangup` is off: a demo in a terminal ends with it instead).
    Under systemd, say READY=1 once serving, and feed its watchdog while samples are current."""
    systemd = SystemdNotifier()
    running = await start(config, nvml, clock, reread)
    tune_gc()
    systemd.ready(_status(running))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    background: set[asyncio.Task[Any]] = set()

    async def reload() -> None:
        systemd.reloading()
        await running.wired.reloader.reload()  # logs what it did, or why it did nothing
        systemd.ready(_status(running))

    def on_hangup() -> None:
        task = asyncio.create_task(reload(), name="reload")
        background.add(task)
        task.add_done_callback(background.discard)

    if reload_on_hangup:
        loop.add_signal_handler(signal.SIGHUP, on_hangup)
    watchdog = asyncio.create_task(systemd.keep_watchdog(running.daemon.sampling_problem))
    background.add(watchdog)
    waiters: list[asyncio.Task[Any]] = [asyncio.create_task(stop.wait())]
    if alongside is not None:
        waiters.append(asyncio.create_task(alongside(running)))
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        systemd.stopping()
        for task in [*waiters, *background]:
            task.cancel()
        log.info("gpuwatch stopping")
        # Should the event loop itself be stuck (the timeout below needs it), every thread's
        # stack goes to stderr and the process exits, rather than waiting for SIGKILL.
        faulthandler.dump_traceback_later(STOP_WITHIN_S + 1.5, exit=True)
        try:
            await within(running.stop(), STOP_WITHIN_S)
        except TimeoutError:
            log.error("not stopped cleanly within %.0f s; exiting anyway", STOP_WITHIN_S)
        faulthandler.cancel_dump_traceback_later()
        log.info("gpuwatch stopped")


def _status(running: Running) -> str:
    gpus = len(running.daemon.view.batch.gpus) if running.daemon.view.batch else 0
    interval = running.daemon.config.sampling.interval
    return f"sampling {gpus} GPUs every {interval:g}s; serving on port {running.port}"
