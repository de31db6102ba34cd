"""The commands that run a daemon: `gpuwatch run` (on NVML, a dcgm-exporter or a simulated
node) and `gpuwatch demo` (a simulated node with the dashboard on it). The simulator is
imported only when a simulated node is asked for: a daemon on a GPU host never loads it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import uvloop

from gpuwatch import logs
from gpuwatch.clients.exits import fail
from gpuwatch.clients.parser import DEMO_LISTEN
from gpuwatch.clock import Clock, SystemClock
from gpuwatch.config import Config, load_config
from gpuwatch.serve.preflight import RulesError, StartupError
from gpuwatch.serve.runner import ListenError, Running, real_nvml, serve
from gpuwatch.text.printable import printable_json
from gpuwatch.text.units import parse_listen
from gpuwatch.text.yamlfile import FileError

if TYPE_CHECKING:
    from gpuwatch.sim.host import SimHost
    from gpuwatch.sim.library import SimulatedNvml


def _config_of(args: argparse.Namespace, host: SimHost | None = None) -> Config:
    """The config file with what the command line (and a simulated node) sets over it: read
    at start, and again on each reload."""
    config = load_config(args.config).with_overrides(
        args.listen, args.state_dir, args.web_config, args.dcgm
    )
    if host is None:
        return config
    from gpuwatch.sim.host import with_sim_host

    return with_sim_host(config, host)


def cmd_run(args: argparse.Namespace) -> int:
    # Files the daemon creates (the outbox with receivers' keys, its -wal, the journal) are its
    # own, whoever starts it and whatever the umask: 0600, directories 0700.
    os.umask(0o077)
    try:
        config = _config_of(args)
        if args.listen is not None:
            parse_listen(args.listen)
        if args.dcgm is not None and not args.dcgm.startswith(("http://", "https://")):
            raise ValueError(f"--dcgm {args.dcgm!r}: expected an http:// or https:// URL")
        if args.speed <= 0:
            raise ValueError("--speed must be greater than zero")
        if args.speed != 1.0 and not args.simulate:
            raise ValueError("--speed only applies with --simulate")
        simulated: SimulatedNvml | None = None
        if args.simulate:
            from gpuwatch.sim.launch import simulated_library

            simulated, clock = simulated_library(
                args.simulate, args.speed, config.state_dir, config.node_name
            )
            nvml = real_nvml()
        elif config.sources.dcgm_url is not None:
            nvml, clock = None, SystemClock()  # NVML is not loaded at all
        else:
            nvml, clock = real_nvml(), SystemClock()
    except (FileError, ValueError) as exc:
        return fail(str(exc))
    logs.setup(config.log.level, config.log.format)
    alongside = None
    if simulated is not None:  # a simulated node, with its training job if it has one
        from gpuwatch.sim.jobrun import run_simulated_job

        node = simulated

        def alongside(running: Running) -> Coroutine[Any, Any, None]:
            return run_simulated_job(running, node, args.simulate)

    try:
        with contextlib.ExitStack() as stack:
            host = None
            if simulated is not None:
                from gpuwatch.sim.host import with_sim_host
                from gpuwatch.sim.launch import simulated_host

                host = stack.enter_context(simulated_host(simulated, config.node_name))
                config = with_sim_host(config, host)
            reread = functools.partial(_config_of, args, host)
            uvloop.run(serve(config, nvml, clock, alongside, reread))
    except RulesError as exc:
        return fail(str(exc))
    except StartupError as exc:
        return fail(str(exc), 1)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    # Imported by the demo only, as the simulator is: the daemon need not hold them.
    import shutil
    import tempfile

    from gpuwatch.sim.launch import simulated_library

    try:
        parse_listen(args.listen)
        simulated, clock = simulated_library(args.scenario, args.speed)
    except (FileError, ValueError) as exc:
        return fail(str(exc))
    state_dir = tempfile.mkdtemp(prefix="gpuwatch-demo-")
    try:
        code = _demo(args, simulated, clock, state_dir)
    except BaseException:
        print(f"gpuwatch demo: its state and log are kept in {state_dir}", file=sys.stderr)
        raise
    if code == 0:
        shutil.rmtree(state_dir, ignore_errors=True)  # a demo leaves nothing behind
    else:
        print(f"gpuwatch demo: its log is kept in {state_dir}/gpuwatch.log", file=sys.stderr)
    return code


def _demo(args: argparse.Namespace, simulated: SimulatedNvml, clock: Clock, state_dir: str) -> int:
    from rich.console import Console

    from gpuwatch.clients.status import render_node
    from gpuwatch.serve.payloads import node_payload
    from gpuwatch.sim.launch import simulated_host, simulated_library

    log_path = f"{state_dir}/gpuwatch.log"
    config = Config(listen=args.listen, state_dir=state_dir)
    console = Console()

    async def show(running: Running) -> None:
        header = (
            f"gpuwatch demo: scenario '{args.scenario}' at {args.speed:g}x real time (--speed), "
            f"serving {running.url}/metrics (log: {log_path})"
        )
        console.print(header, style="dim")
        from gpuwatch.sim.jobrun import run_simulated_job

        job = asyncio.create_task(run_simulated_job(running, simulated, args.scenario))
        try:
            if args.once:
                await asyncio.sleep(3)
                console.print(render_node(printable_json(node_payload(running.wired.readers))))
                return
            from gpuwatch.tui.app import GpuwatchApp
            from gpuwatch.tui.data import HttpFeed

            # The dashboard on the simulated node; quitting it stops the demo.
            await GpuwatchApp(HttpFeed(), [running.url]).run_async()
        finally:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job

    with open(log_path, "a", encoding="utf-8") as log_file, simulated_host(simulated) as host:
        logs.setup("info", "logfmt", log_file)
        try:
            _serve_demo(config, host, clock, show)
        except ListenError as exc:
            if args.listen != DEMO_LISTEN:
                return fail(str(exc), 1)
            # The default port is taken (a daemon already runs here?): take any free one.
            config = Config(listen="127.0.0.1:0", state_dir=state_dir)
            simulated, clock = simulated_library(args.scenario, args.speed)
            with simulated_host(simulated) as again:
                _serve_demo(config, again, clock, show)
        except StartupError as exc:
            return fail(str(exc), 1)
    return 0


def _serve_demo(
    config: Config,
    host: SimHost,
    clock: Clock,
    show: Callable[[Running], Coroutine[Any, Any, None]],
) -> None:
    from gpuwatch.sim.host import with_sim_host

    _end_on_hangup(config.state_dir, str(host.directory))
    served = with_sim_host(config, host)  # no file: a reload reads the same again
    uvloop.run(serve(served, real_nvml(), clock, show, lambda: served, reload_on_hangup=False))


def _end_on_hangup(*directories: str) -> None:
    """The demo's terminal is gone (an SSH session dropped, tmux killed): end at once, as a
    program in a terminal does, removing what it made. A plain signal handler, not the
    loop's: the loop may be stuck handing frames to a terminal that no longer takes them,
    and a demo left so would hold its port for good, answering nothing."""

    import shutil

    def hangup(signum: int, _frame: object) -> None:
        for directory in directories:
            shutil.rmtree(directory, ignore_errors=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGHUP, hangup)
