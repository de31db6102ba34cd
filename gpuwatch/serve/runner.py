"""Starting and running the daemon: the state directory, the listener, the wired components
(serve/wiring.py), the sockets and the sampling loop, and stopping them in reverse."""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import signal
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwatch.clock import Clock, within
from gpuwatch.config import Config
from gpuwatch.daemon import Daemon
from gpuwatch.gctune import tune_gc, tune_switching
from gpuwatch.model import Event
from gpuwatch.nvml.errors import NvmlModule
from gpuwatch.push.attribution import Attribution
from gpuwatch.serve.api import Api, Listener, start_http
from gpuwatch.serve.control import (
    CONTROL_MODE,
    ControlApi,
    UnixSocket,
    control_server,
    start_socket,
)
from gpuwatch.serve.listen import bind_tcp
from gpuwatch.serve.preflight import (
    StartupError,
    load_guard,
    reach_warnings,
    socket_paths,
)
from gpuwatch.serve.pushserver import PushServer
from gpuwatch.serve.sdnotify import SystemdNotifier
from gpuwatch.serve.webconfig import WebGuard
from gpuwatch.serve.wiring import Wired, wire
from gpuwatch.state.lock import StateDirError, prepare_state_dir
from gpuwatch.text.units import parse_listen

log = logging.getLogger(__name__)


class ListenError(StartupError):
    """The listen address cannot be bound (in use, not ours, not permitted)."""


def real_nvml() -> NvmlModule:
    import pynvml

    return pynvml


@dataclass
class Running:
    wired: Wired
    runner: Listener
    port: int
    sockets: list[UnixSocket]  # the control socket first, then the push socket
    guard: WebGuard | None
    # What start opened, each with its closing step, closed in reverse order by stop.
    opened: AsyncExitStack

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
        """Every step of start undone, the last first: the sockets and the listener (no
        reader asks a stopping daemon), the sampling loop, its watchers and source, the
        notifier and the journal, the web config's watch, the lock."""
        await self.opened.aclose()


async def start(
    config: Config,
    nvml: NvmlModule | None,
    clock: Clock,
    reread: Callable[[], Config] | None = None,
) -> Running:
    """Each step of starting pushes its undoing; a step that fails undoes those before it, in
    reverse, and a started daemon's stop undoes them all the same way."""
    opened = AsyncExitStack()
    try:
        return await _start(config, nvml, clock, reread, opened)
    except BaseException:
        await opened.aclose()
        raise


async def _start(
    config: Config,
    nvml: NvmlModule | None,
    clock: Clock,
    reread: Callable[[], Config] | None,
    opened: AsyncExitStack,
) -> Running:
    try:
        state_dir, lock = prepare_state_dir(config.state_dir)
    except StateDirError as exc:
        raise StartupError(str(exc)) from None
    opened.callback(lock.release)
    guard = load_guard(config)
    if guard is not None:
        opened.callback(guard.close)
    control_path, push_path = socket_paths(config)
    host, port = parse_listen(config.listen)
    try:
        listening = bind_tcp(host, port)
    except OSError as exc:
        raise ListenError(f"cannot listen on {config.listen}: {exc.strerror}") from exc
    for sock in listening:
        opened.callback(sock.close)  # the listener's, once it serves; closing twice is nothing
    bound = int(listening[0].getsockname()[1])
    wired = wire(config, nvml, clock, state_dir, bound, guard=guard, reread=reread, lock=lock)
    opened.push_async_callback(wired.close)
    daemon, notifier = wired.daemon, wired.notifier
    await notifier.start()  # its senders stop with wired.close
    for path in daemon.problems.damaged():
        daemon.events.publish(
            Event(
                clock.now(),
                "state_damaged",
                None,
                None,
                f"state file {path.name.partition('.damaged-')[0]} was damaged: set aside as "
                f"{path.name}",
                {"file": path.name},
            )
        )
    # The daemon before its readers, so that they stop first: a health check asking while
    # the daemon stops finds no daemon, never a stopped loop read as an unhealthy node.
    opened.push_async_callback(daemon.stop)  # also what a start failing half-way started
    await daemon.start()
    options = wired.readers
    runner = await start_http(Api(options), listening, guard)
    opened.push_async_callback(runner.cleanup)
    stamp = Attribution(lambda: daemon.view.batch.gpus if daemon.view.batch else ()).stamp
    api = ControlApi(options, daemon.acknowledge, wired.reloader.reload, notifier.silences, stamp)
    pushes = PushServer(daemon.jobs, clock.now, stamp)
    push = config.push
    sockets: list[UnixSocket] = []
    for name, server, path, mode, group in (
        ("control", control_server(api.app()), control_path, CONTROL_MODE, None),
        ("push", pushes, push_path, push.socket_mode, push.socket_group),
    ):
        try:
            served = await start_socket(name, server, path, mode, group)
        except OSError as exc:
            raise StartupError(f"cannot create a unix socket: {exc}") from exc
        opened.push_async_callback(served.close)
        sockets.append(served)
        wired.keeper.keep(served)
    for warning in reach_warnings(config, push_path):
        log.warning("%s", warning)
    running = Running(wired, runner, bound, sockets, guard, opened)
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
    tune_switching()
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
