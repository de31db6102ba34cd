"""The `gpuwatch` command line's arguments: every command, its options and their help."""

from __future__ import annotations

import argparse
import os
import sys

from gpuwatch import __version__
from gpuwatch.clients.address import DEFAULT_URL

DEMO_LISTEN = "127.0.0.1:10040"
DEMO_SPEED = 10.0


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its help as wide as the terminal found without shutil: argparse
    imports shutil (and the bz2, lzma and fnmatch modules it brings) to ask, for every
    argument added, in every command and in the daemon, which never prints help."""

    def _get_formatter(self) -> argparse.HelpFormatter:
        # Every argparse formatter takes `width`; typeshed's protocol names only `prog`.
        return self.formatter_class(prog=self.prog, width=_columns() - 2)  # type: ignore[call-arg]


def _columns() -> int:
    """The terminal's width as shutil.get_terminal_size reads it: $COLUMNS, else standard
    output's terminal, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gpuwatch", description="GPU health daemon for fleets.")
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
    demo.add_argument(
        "--speed",
        type=float,
        default=DEMO_SPEED,
        help=f"play the scenario this many times faster than real time (default {DEMO_SPEED:g}: "
        "the demo's ten minutes in one)",
    )
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
    _url_argument(status)
    status.add_argument("--json", action="store_true", help="print the daemon's JSON")
    _ca_argument(status)

    health = sub.add_parser(
        "health",
        help="the node's verdict as an exit status: 0 healthy, 1 degraded, 2 unhealthy, "
        "3 unknown (no daemon answered, or it has no verdict yet)",
    )
    _url_argument(health)
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
        "throttling, alerts (at the end of a batch script)",
    )
    report.add_argument("job", help="the job's id: Slurm's job id, a pod's UID")
    _url_argument(report)
    report.add_argument("--json", action="store_true", help="print the report's JSON")
    report.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when the daemon saw no such job and 3 when it cannot be asked (without: "
        "0 either way, said on stderr, so the report never fails the job it ends)",
    )
    _ca_argument(report)

    events = sub.add_parser("events", help="what happened on a node: XIDs, lost GPUs, alerts")
    _url_argument(events)
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
    backtest = rules_sub.add_parser(
        "backtest", help="what rule files would have done over a span of Prometheus's history"
    )
    backtest.add_argument("files", nargs="+", metavar="FILE")
    backtest.add_argument("--prometheus", required=True, metavar="URL", help="its base URL")
    backtest.add_argument(
        "--from", dest="start", required=True, help="a duration ago (7d), RFC 3339 or Unix time"
    )
    backtest.add_argument("--to", dest="end", default="0s", help="the same forms (default now)")
    backtest.add_argument(
        "--interval", default="1m", help="for groups without their own (default 1m)"
    )
    backtest.add_argument("--chunk", default="1h", help="history read at a time (default 1h)")
    backtest.add_argument(
        "-c",
        "--config",
        metavar="CONFIG",
        help="a gpuwatch config: replay its actions.slurm drains and notify receivers too",
    )
    backtest.add_argument("--json", action="store_true", help="each interval as a JSON line")
    _ca_argument(backtest)

    gpu = sub.add_parser("gpu", help="each GPU's life on this node, by serial; RMA evidence")
    gpu_sub = gpu.add_subparsers(dest="gpu_command", required=True, metavar="SUBCOMMAND")
    history = gpu_sub.add_parser(
        "history", help="what a GPU went through here (without SERIAL: every GPU held)"
    )
    history.add_argument("serial", nargs="?", metavar="SERIAL", help="its serial or UUID")
    history.add_argument("--json", action="store_true", help="print the record as JSON")
    rma = gpu_sub.add_parser("rma", help="write the evidence an RMA needs to a new folder")
    rma.add_argument("serial", metavar="SERIAL", help="its serial or UUID")
    rma.add_argument("-o", "--output", default=".", help="where to create the folder (default .)")
    for action in gpu_sub.choices.values():
        action.add_argument("--state-dir", help="the daemon's (default /var/lib/gpuwatch)")

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


def _url_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "url",
        nargs="?",
        default=DEFAULT_URL,
        metavar="DAEMON",
        help=f"the daemon: HOST, HOST:PORT (port 10040 if not given) or a URL (default "
        f"{DEFAULT_URL})",
    )


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
