"""The `gpuwatch` command line: parse the arguments, run the command (README lists them).

Only what a command needs is imported, once it is known which: `gpuwatch health` runs before
every job (Slurm's prolog) and at every health-check interval, and a daemon's imports
(the HTTP server, the rules engine, the simulator) would cost it most of its time.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence

from gpuwatch.clients.address import daemon_url
from gpuwatch.clients.exits import EXIT_USAGE, fail
from gpuwatch.clients.parser import build_parser

# Each command's module and function, imported when the command runs.
COMMANDS = {
    "run": ("gpuwatch.cli.serving", "cmd_run"),
    "demo": ("gpuwatch.cli.serving", "cmd_demo"),
    "status": ("gpuwatch.clients.commands", "cmd_status"),
    "tui": ("gpuwatch.cli.dashboard", "cmd_tui"),
    "health": ("gpuwatch.clients.commands", "cmd_health"),
    "job-report": ("gpuwatch.clients.commands", "cmd_job_report"),
    "events": ("gpuwatch.clients.commands", "cmd_events"),
    "ack": ("gpuwatch.clients.commands", "cmd_ack"),
    "silence": ("gpuwatch.clients.commands", "cmd_silence"),
    "rules": ("gpuwatch.clients.local", "cmd_rules"),
    "gpu": ("gpuwatch.clients.life", "cmd_gpu"),
    "xid": ("gpuwatch.clients.local", "cmd_xid"),
    "sim": ("gpuwatch.clients.local", "cmd_sim_list"),
    "config": ("gpuwatch.clients.local", "cmd_config_check"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:  # a daemon's address as operators type it, or a usage error (never "unreachable")
        if getattr(args, "url", None):  # "" beside --local or --alive: not asked
            args.url = daemon_url(args.url)
        if getattr(args, "urls", None):
            args.urls = [daemon_url(u) for u in args.urls]
    except ValueError as exc:
        return fail(str(exc), EXIT_USAGE)
    module, name = COMMANDS[args.command]
    command: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), name)
    try:
        return command(args)
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
