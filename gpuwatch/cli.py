"""The `gpuwatch` command line (DESIGN §5)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import signal
import ssl
import sys
import tempfile
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import uvloop

from gpuwatch import __version__, logs
from gpuwatch.clients.address import EXIT_USAGE, daemon_url
from gpuwatch.clients.commands import (
    DEFAULT_URL,
    cmd_ack,
    cmd_events,
    cmd_health,
    cmd_job_report,
    cmd_silence,
    cmd_status,
    fail,
    read_hosts,
)
from gpuwatch.clients.local import cmd_config_check, cmd_rules, cmd_sim_list, cmd_xid
from gpuwatch.clients.tls import tls_context
from gpuwatch.clock import SystemClock
from gpuwatch.config import Config, load_config
from gpuwatch.serve.runner import ListenError, RulesError, Running, StartupError, real_nvml, serve
from gpuwatch.sim.host import SimHost, with_sim_host
from gpuwatch.sim.launch import simulated_host, simulated_library
from gpuwatch.sim.library import SimulatedNvml
from gpuwatch.text.printable import printable_json
from gpuwatch.text.units import parse_listen
from gpuwatch.text.yamlfile import FileError

log = logging.getLogger(__name__)

DEMO_LISTEN = "127.0.0.1:10040"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuwatch", description="GPU health daemon for fleets.")
    p.add_argument("--version", action="version", version=f"gpuwatch {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("-c", "--config", help="YAML config file (defaults apply without one)")
    run.add_argument("--listen", help="HOST:PORT to serve on (default 0.0.0.0:10040)")
    run.add_argument("--state-dir", help="where state is kept (default /var/lib/gpuwatch)")
    run.add_argument(
        "--web-config",
        metavar="FILE",
        help="TLS and basic auth for the listener: a Prometheus exporter-toolkit web-config file",
    )
    source = run.add_mutually_exclusive_group()
    source.add_argument(
        "--simulate",
        metavar="SCENARIO",
        help="sample a simulated node instead of NVML: a built-in scenario or a YAML file",
    )
    source.add_argument(
        "--dcgm",
        metavar="URL",
        help="read the GPUs through a dcgm-exporter (its /metrics URL) instead of NVML",
    )
    run.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="with --simulate: play the scenario this many times faster than real time",
    )

    demo = sub.add_parser("demo", help="the daemon on a simulated node, with the dashboard")
    demo.add_argument("scenario", nargs="?", default="demo")
    demo.add_argument("--listen", default=DEMO_LISTEN, help=f"HOST:PORT (default {DEMO_LISTEN})")
    demo.add_argument("--speed", type=float, default=1.0, help="play the scenario faster")
    demo.add_argument(
        "--once", action="store_true", help="print the table once after a few cycles and exit"
    )

    tui = sub.add_parser("tui", help="the dashboard: one node in depth, or a fleet")
    tui.add_argument("urls", nargs="*", metavar="URL", help=f"daemons (default {DEFAULT_URL})")
    tui.add_argument("--hosts", help="a file of daemon URLs or host[:port], one per line")
    tui.add_argument("--prometheus", metavar="URL", help="the fleet as a Prometheus server sees it")
    tui.add_argument("--refresh", type=float, default=1.0, help="seconds between refreshes")
    _ca_argument(tui)

    status = sub.add_parser("status", help="one-shot table of a node")
    status.add_argument("url", nargs="?", default=DEFAULT_URL)
    status.add_argument("--json", action="store_true", help="print the daemon's JSON")
    _ca_argument(status)

    health = sub.add_parser(
        "health",
        help="the node's verdict as an exit status: 0 healthy, 1 degraded, 2 unhealthy, "
        "3 unknown (no daemon answered, or it has no verdict yet)",
    )
    health.add_argument("url", nargs="?", default=DEFAULT_URL)
    health.add_argument(
        "--alive",
        action="store_true",
        help="ask the control socket instead whether the daemon itself works (samples keep "
        "coming): 0 yes, 1 stale, 3 unreachable; a liveness probe past TLS and passwords",
    )
    health.add_argument(
        "--local",
        action="store_true",
        help="ask the daemon on this host through its control socket, not its listener "
        "(whatever TLS or passwords the listener has): Slurm's health check and prolog",
    )
    health.add_argument("--state-dir", help="the daemon's state directory, for --alive and --local")
    health.add_argument(
        "--max-chars",
        type=int,
        metavar="N",
        help="cut the line to N characters (never inside one), as a Slurm reason wants",
    )
    health.add_argument(
        "--npd",
        action="store_true",
        help="exit as node-problem-detector's custom plugins do: 0 healthy or degraded, "
        "1 unhealthy, 2 unknown",
    )
    _ca_argument(health)

    report = sub.add_parser(
        "job-report",
        help="what happened to each GPU while a job ran on it: XIDs, ECC and remap changes, "
        "throttling, alerts (at the end of a batch script, or from Slurm's Epilog)",
    )
    report.add_argument("job", help="the job's id: Slurm's job id, a pod's UID")
    report.add_argument("url", nargs="?", default=DEFAULT_URL)
    report.add_argument("--json", action="store_true", help="print the report's JSON")
    _ca_argument(report)

    events = sub.add_parser("events", help="what happened on a node: XIDs, lost GPUs, alerts")
    events.add_argument("url", nargs="?", default=DEFAULT_URL)
    events.add_argument("--since", default="1h", help="a duration (1h), RFC 3339 time or Unix time")
    events.add_argument("--json", action="store_true", help="print the events as JSON lines")
    _ca_argument(events)

    ack = sub.add_parser(
        "ack", help="acknowledge a cause of a GPU's verdict (the keys are in `gpuwatch status`)"
    )
    ack.add_argument("gpu", help='the GPU: its index or UUID, or "node" for a missing GPU')
    ack.add_argument("cause", help="the cause's key, e.g. xid-48 or nvlink-crc")
    ack.add_argument("--note", default="", help="why, for the journal (a ticket, a name)")
    _socket_arguments(ack)

    silence = sub.add_parser("silence", help="silence notifications (on the daemon's socket)")
    silence_sub = silence.add_subparsers(dest="silence_command", required=True, metavar="ACTION")
    s_add = silence_sub.add_parser("add", help="silence alerts matching every matcher")
    s_add.add_argument(
        "matchers", nargs="+", metavar="MATCHER", help='e.g. gpu="3" alertname=~"Gpu.*"'
    )
    s_add.add_argument("--duration", default="2h", help="how long (default 2h)")
    s_add.add_argument("--comment", default="", help="why, for whoever looks later")
    s_add.add_argument("--author", default=os.environ.get("USER", ""), help="who (default $USER)")
    silence_sub.add_parser("list", help="silences, active, pending and expired")
    s_expire = silence_sub.add_parser("expire", help="end a silence now")
    s_expire.add_argument("id")
    for action in silence_sub.choices.values():
        _socket_arguments(action)

    rules = sub.add_parser("rules", help="check and unit-test Prometheus rule files")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True, metavar="SUBCOMMAND")
    rules_check = rules_sub.add_parser("check", help="check rule files (file:line on any error)")
    rules_check.add_argument("files", nargs="+", metavar="FILE")
    rules_test = rules_sub.add_parser("test", help="run promtool-format rule unit tests")
    rules_test.add_argument("files", nargs="+", metavar="FILE")

    xid = sub.add_parser("xid", help="what an XID means and what to do about it")
    xid.add_argument("code", nargs="?", type=int, help="the XID number (all of them without one)")

    sim = sub.add_parser("sim", help="the simulator")
    sim_sub = sim.add_subparsers(dest="sim_command", required=True, metavar="SUBCOMMAND")
    sim_sub.add_parser("list", help="built-in fault scenarios")

    config = sub.add_parser("config", help="configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    check = config_sub.add_parser("check", help="check a config file offline")
    check.add_argument("-c", "--config", help="YAML config file")
    check.add_argument("file", nargs="?", help="YAML config file (same as -c)")
    return p


def _ca_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ca-file",
        metavar="FILE",
        help="trust this CA for https URLs (a daemon with a web config); user:password@ in "
        "a URL is sent as basic auth",
    )


def _socket_arguments(parser: argparse.ArgumentParser) -> None:
    """How a command that changes a running daemon finds its control socket."""
    parser.add_argument("--state-dir", help="the daemon's state dir, to find its socket")
    parser.add_argument("--socket", help="the daemon's control socket (overrides --state-dir)")


def _config_of(args: argparse.Namespace, host: SimHost | None = None) -> Config:
    """The config file with what the command line (and a simulated node) sets over it: read
    at start, and again on each reload."""
    config = load_config(args.config).with_overrides(
        args.listen, args.state_dir, args.web_config, args.dcgm
    )
    return config if host is None else with_sim_host(config, host)


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
    from rich.console import Console

    from gpuwatch.clients.status import render_node
    from gpuwatch.serve.payloads import node_payload

    try:
        parse_listen(args.listen)
        simulated, clock = simulated_library(args.scenario, args.speed)
    except (FileError, ValueError) as exc:
        return fail(str(exc))
    state_dir = tempfile.mkdtemp(prefix="gpuwatch-demo-")
    log_path = f"{state_dir}/gpuwatch.log"
    config = Config(listen=args.listen, state_dir=state_dir)
    console = Console()

    async def show(running: Running) -> None:
        header = (
            f"gpuwatch demo: scenario '{args.scenario}', serving {running.url}/metrics "
            f"(log: {log_path})"
        )
        console.print(header, style="dim")
        from gpuwatch.sim.jobrun import run_simulated_job

        job = asyncio.create_task(run_simulated_job(running, simulated, args.scenario))
        try:
            if args.once:
                await asyncio.sleep(3)
                console.print(render_node(printable_json(node_payload(running.daemon))))
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
            served = with_sim_host(config, host)  # no file: a reload reads the same again
            uvloop.run(serve(served, real_nvml(), clock, show, lambda: served))
        except ListenError as exc:
            if args.listen != DEMO_LISTEN:
                return fail(str(exc), 1)
            # The default port is taken (a daemon already runs here?): take any free one.
            config = Config(listen="127.0.0.1:0", state_dir=state_dir)
            simulated, clock = simulated_library(args.scenario, args.speed)
            with simulated_host(simulated) as again:
                served = with_sim_host(config, again)
                uvloop.run(serve(served, real_nvml(), clock, show, lambda: served))
        except StartupError as exc:
            return fail(str(exc), 1)
    return 0


def cmd_tui(args: argparse.Namespace) -> int:
    from gpuwatch.gctune import tune_gc
    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.data import HttpFeed

    tune_gc()
    urls = list(args.urls)
    if args.hosts:
        try:
            urls += read_hosts(args.hosts)
        except OSError as exc:
            return fail(f"{args.hosts}: {exc.strerror}")
        except ValueError as exc:
            return fail(str(exc), EXIT_USAGE)
    if args.refresh <= 0:
        return fail("--refresh must be greater than zero")
    try:
        tls = tls_context(args.ca_file)
    except (OSError, ssl.SSLError) as exc:
        return fail(f"--ca-file {args.ca_file}: {exc}")
    if args.prometheus:
        from gpuwatch.tui.prometheus import PrometheusFeed

        fleet = PrometheusFeed(args.prometheus, tls=tls)
        GpuwatchApp(fleet, urls, args.refresh, fleet=True, detail=HttpFeed(tls=tls)).run()
        return 0
    GpuwatchApp(HttpFeed(tls=tls), urls or [DEFAULT_URL], args.refresh).run()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "run": cmd_run,
        "demo": cmd_demo,
        "status": cmd_status,
        "tui": cmd_tui,
        "health": cmd_health,
        "job-report": cmd_job_report,
        "events": cmd_events,
        "ack": cmd_ack,
        "silence": cmd_silence,
        "rules": cmd_rules,
        "xid": cmd_xid,
        "sim": cmd_sim_list,
        "config": cmd_config_check,
    }
    try:  # a daemon's address as operators type it, or a usage error (never "unreachable")
        if getattr(args, "url", None):  # "" beside --local or --alive: not asked
            args.url = daemon_url(args.url)
        if getattr(args, "urls", None):
            args.urls = [daemon_url(u) for u in args.urls]
    except ValueError as exc:
        return fail(str(exc), EXIT_USAGE)
    try:
        return commands[args.command](args)
    except BrokenPipeError:
        return _reader_gone()


EXIT_SIGPIPE = 128 + signal.SIGPIPE  # what a shell reports for a writer its reader left


def _reader_gone() -> int:
    """The reader of our output went away (`gpuwatch events --json | head -1`): that is the
    reader's choice, not an error to print a traceback for. What is still buffered would
    raise again when Python flushes at exit, so stdout is pointed at /dev/null first."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_SIGPIPE
