"""Assembling and running the daemon: source, store, sampling loop and HTTP listener."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import sqlite3
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from gpuwatch.acks import AckStore
from gpuwatch.api import Api, start_http
from gpuwatch.boot import current_boot_id
from gpuwatch.clock import Clock
from gpuwatch.config import Config, default_rule_interval
from gpuwatch.control import (
    CONTROL_MODE,
    PUSH_SOCKET_NAME,
    ControlApi,
    UnixSocket,
    socket_path,
    start_socket,
)
from gpuwatch.daemon import Daemon, EventLog
from gpuwatch.exporters.dcgm_source import DcgmSource
from gpuwatch.gctune import tune_gc
from gpuwatch.inventory import Inventory
from gpuwatch.journal import Journal
from gpuwatch.model import Event
from gpuwatch.notify.notifier import Notifier
from gpuwatch.nvml.device import NvmlModule
from gpuwatch.nvml.source import NvmlSource
from gpuwatch.reload import reload_daemon
from gpuwatch.rules.engine import RuleEngine
from gpuwatch.sdnotify import SystemdNotifier
from gpuwatch.source import Source
from gpuwatch.statedir import DIR_MODE, StateProblems, ensure_dir
from gpuwatch.store import Store
from gpuwatch.units import parse_listen
from gpuwatch.webconfig import WebGuard, load_web_config
from gpuwatch.yamlfile import FileError

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The daemon cannot start as configured; the message says why and what to do."""


class RulesError(StartupError):
    """The rule files have errors; the message lists each with file and line."""


class ListenError(StartupError):
    """The listen address cannot be bound (in use, not ours, not permitted)."""


def real_nvml() -> NvmlModule:
    import pynvml

    return pynvml


LOCK_NAME = ".lock"


class StateDirLock:
    """The state directory held by one daemon alone: an flock on its lock file, which the
    kernel releases when the process ends, however it ends. Taken before anything in the
    directory is opened, so a second daemon is refused before it touches the first's state."""

    def __init__(self, state: Path) -> None:
        self.path = state / LOCK_NAME
        self._fd = self._take(state)

    def _take(self, state: Path) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StartupError(
                f"state directory {state} is in use by another gpuwatch (pid {holder});"
                " stop it, or give this one its own --state-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return fd

    def renew(self) -> None:
        """Take the lock again on a new file if the old one was deleted (the directory removed
        under the daemon): a lock on an unlinked file keeps no second daemon out."""
        if self._fd >= 0 and not self.path.exists():
            os.close(self._fd)
            self._fd = -1
            self._fd = self._take(self.path.parent)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def prepare_state_dir(path: str) -> tuple[Path, StateDirLock]:
    state = Path(path)
    hint = "pass --state-dir DIR or set state_dir in the config"
    try:
        state.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        probe = state / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise StartupError(f"state directory {path}: {exc.strerror}; {hint}") from exc
    try:
        state.chmod(DIR_MODE)
    except OSError as exc:  # writable but not ours: say so, and go on
        log.warning("state directory %s: cannot make it private (%s)", path, exc.strerror)
    try:
        return state, StateDirLock(state)
    except OSError as exc:
        raise StartupError(f"state directory {path}: {exc.strerror}; {hint}") from exc


@dataclass
class Running:
    daemon: Daemon
    runner: web.AppRunner
    port: int
    sockets: list[UnixSocket]  # the control socket first, then the push socket
    scheme: str = "http"
    lock: StateDirLock | None = None

    @property
    def control_path(self) -> Path:
        return self.sockets[0].path

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
        if self.daemon.notifier is not None:
            await self.daemon.notifier.stop()
        if self.daemon.journal is not None:
            self.daemon.journal.close()
        if self.daemon.web_guard is not None:
            self.daemon.web_guard.close()
        if self.lock is not None:
            self.lock.release()


def load_rules(config: Config, state_dir: Path) -> RuleEngine:
    _, port = parse_listen(config.listen)
    engine = RuleEngine(
        Store(config.store.retention),
        config.rules.files,
        default_rule_interval(config.rules, config.sampling),
        state_dir,
        # where an alert's reader can look, as the notifier links to it
        config.notify.external_url or f"http://{config.node_name}:{port}",
    )
    try:
        engine.load()
    except FileError as exc:
        raise RulesError(f"rule files:\n{exc}") from exc
    return engine


def make_source(
    config: Config, nvml: NvmlModule | None, clock: Clock, events: EventLog, state_dir: Path
) -> Source:
    """dcgm-exporter when sources.dcgm.url (or --dcgm) names one, else NVML."""
    inventory = Inventory(state_dir)
    if config.sources.dcgm_url is not None:
        return DcgmSource(
            config.sources.dcgm_url,
            clock,
            config.sampling.deadline,
            events.publish,
            inventory,
        )
    if nvml is None:
        raise StartupError("no GPU source: NVML was not loaded and no dcgm-exporter is set")
    return NvmlSource(nvml, clock, config.sampling, events.publish, inventory)


async def start(config: Config, nvml: NvmlModule | None, clock: Clock) -> Running:
    state_dir, lock = prepare_state_dir(config.state_dir)
    try:
        running = await _start(config, nvml, clock, state_dir)
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
    daemon = running.daemon
    try:
        ensure_dir(state_dir)
        if running.lock is not None:
            running.lock.renew()
        if daemon.journal is not None:
            daemon.journal.flush_if_needed()
        if daemon.notifier is not None:
            daemon.notifier.db.reopen_if_unlinked()
    except (OSError, sqlite3.Error, StartupError) as exc:
        log.error("state directory %s: %s", state_dir, exc)
    for served in running.sockets:
        if not served.path.exists() and served.recreating is None:
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


def build_daemon(
    config: Config,
    nvml: NvmlModule | None,
    clock: Clock,
    state_dir: Path,
    rules: RuleEngine,
    *,
    boot_id: str | None = None,
    web_guard: WebGuard | None = None,
) -> Daemon:
    """The daemon `gpuwatch run` serves, before its listeners and notifier: its source, rules,
    journal (of this boot, the machine's unless `boot_id` says) and acknowledgements."""
    problems = StateProblems(state_dir)
    boot = current_boot_id() if boot_id is None else boot_id
    try:
        journal = Journal(state_dir, config.journal.retention, boot, problems)
    except sqlite3.Error as exc:
        raise StartupError(f"journal in {state_dir}: {exc}") from exc
    events = EventLog()
    source = make_source(config, nvml, clock, events, state_dir)
    return Daemon(
        config,
        clock,
        source,
        events,
        rules=rules,
        journal=journal,
        acks=AckStore(state_dir),
        problems=problems,
        web_guard=web_guard,
    )


async def _start(config: Config, nvml: NvmlModule | None, clock: Clock, state_dir: Path) -> Running:
    guard = None
    if config.web_config is not None:
        try:
            guard = WebGuard(load_web_config(config.web_config))
        except FileError as exc:
            raise StartupError(f"web config:\n{exc}") from exc
    rules = load_rules(config, state_dir)
    daemon = build_daemon(config, nvml, clock, state_dir, rules, web_guard=guard)
    events, problems = daemon.events, daemon.problems
    host, port = parse_listen(config.listen)
    try:
        runner, bound = await start_http(Api(daemon), host, port, guard)
    except OSError as exc:
        raise ListenError(f"cannot listen on {config.listen}: {exc.strerror}") from exc
    try:
        daemon.notifier = Notifier(
            config.notify,
            state_dir,
            clock,
            node=config.node_name,
            external_url=f"http://{config.node_name}:{bound}",
            interval=rules.default_interval,
            problems=problems,
        )
    except sqlite3.Error as exc:
        await runner.cleanup()
        raise StartupError(f"notification outbox in {state_dir}: {exc}") from exc
    await daemon.notifier.start()
    control_path = socket_path(config.state_dir)
    push = config.push
    push_path = Path(push.socket) if push.socket else control_path.with_name(PUSH_SOCKET_NAME)
    api, sockets = ControlApi(daemon), []
    try:
        if _same_path(push_path, control_path):
            raise OSError(f"push.socket {push_path} is the control socket: give it its own path")
        sockets.append(await start_socket("control", api.app(), control_path, CONTROL_MODE))
        sockets.append(
            await start_socket(
                "push", api.push_app(), push_path, push.socket_mode, push.socket_group
            )
        )
    except OSError as exc:
        for served in sockets:
            await served.close()
        await daemon.notifier.stop()
        await runner.cleanup()
        raise StartupError(f"cannot create a unix socket: {exc}") from exc
    for path in problems.damaged():
        events.publish(
            Event(clock.now(), "state_damaged", None, None,
                  f"state file {path.name.partition('.damaged-')[0]} was damaged: set aside as "
                  f"{path.name}", {"file": path.name})
        )  # fmt: skip
    await daemon.start()
    scheme = "https" if guard is not None and guard.config.tls is not None else "http"
    log.info("gpuwatch serving on %s:%d (%s)", host, bound, scheme)
    return Running(daemon, runner, bound, sockets, scheme)


def _same_path(a: Path, b: Path) -> bool:
    """The same file once `..` and links are resolved (at start-up, before either exists)."""
    return os.path.realpath(a) == os.path.realpath(b)


STOP_WITHIN_S = 8.0  # within 10 s, well inside systemd's TimeoutStopSec of 15 s


async def serve(
    config: Config,
    nvml: NvmlModule | None,
    clock: Clock,
    alongside: Callable[[Running], Coroutine[Any, Any, None]] | None = None,
) -> None:
    """Run until SIGTERM/SIGINT (or until `alongside` returns); SIGHUP reloads. Under systemd,
    say READY=1 once sampling and serving, and keep its watchdog fed while samples are current."""
    systemd = SystemdNotifier()
    running = await start(config, nvml, clock)
    tune_gc()
    systemd.ready(_status(running))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    background: set[asyncio.Task[Any]] = set()

    async def reload() -> None:
        systemd.reloading()
        await reload_daemon(running.daemon)  # logs what it did, or why it did nothing
        systemd.ready(_status(running))

    def on_hangup() -> None:
        task = asyncio.create_task(reload(), name="reload")
        background.add(task)
        task.add_done_callback(background.discard)

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
        try:
            await asyncio.wait_for(running.stop(), STOP_WITHIN_S)
        except TimeoutError:
            log.error("not stopped cleanly within %.0f s; exiting anyway", STOP_WITHIN_S)
        log.info("gpuwatch stopped")


def _status(running: Running) -> str:
    gpus = len(running.daemon.view.batch.gpus) if running.daemon.view.batch else 0
    interval = running.daemon.config.sampling.interval
    return f"sampling {gpus} GPUs every {interval:g}s; serving on port {running.port}"
