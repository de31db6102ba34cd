"""The commands that need no daemon: checking rule files and config files, running rule
tests, and listing the XID catalog and the simulator's scenarios."""

from __future__ import annotations

import argparse
import sys

from gpuwatch.clients.config_text import config_text
from gpuwatch.clients.exits import EXIT_CONFIG
from gpuwatch.config import load_config
from gpuwatch.sim.scenario import builtin_names, load_scenario
from gpuwatch.text.yamlfile import FileError


def cmd_sim_list(_args: argparse.Namespace) -> int:
    from rich.table import Table

    from gpuwatch.clients.terminal import stdout_console

    table = Table(show_edge=False, header_style="bold")
    table.add_column("scenario")
    table.add_column("GPUs", justify="right")
    table.add_column("faults")
    table.add_column("description")
    for name in builtin_names():
        scenario = load_scenario(name)
        faults = ", ".join(sorted({f.kind for f in scenario.faults})) or "-"
        table.add_row(name, str(scenario.gpus), faults, scenario.description)
    stdout_console().print(table)
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    from gpuwatch.rules.files import load_rule_file
    from gpuwatch.rules.ruletest import run_test_files

    if args.rules_command == "test":
        return run_test_files(args.files)
    if args.rules_command == "backtest":
        from gpuwatch.clients.backtest import cmd_backtest

        return cmd_backtest(args)
    failed = False
    for path in args.files:
        print(f"Checking {path}")
        try:
            groups = load_rule_file(path)
        except FileError as exc:
            print("  FAILED:", file=sys.stderr)
            for problem in exc.problems:
                print(f"{problem}", file=sys.stderr)
            failed = True
        else:
            count = sum(len(g.rules) for g in groups)
            print(f"  SUCCESS: {count} rules found")
        print()
    return 1 if failed else 0


def cmd_xid(args: argparse.Namespace) -> int:
    from rich.table import Table

    from gpuwatch.clients.terminal import stdout_console
    from gpuwatch.xid.catalog import CATALOG
    from gpuwatch.xid.known import lookup

    if args.code is not None:
        xid = lookup(args.code)
        print(f"XID {xid.code}: {xid.meaning}")
        print(f"class:  {xid.xid_class}")
        print(f"action: {xid.action}")
        return 0 if args.code in CATALOG else 1
    table = Table(show_edge=False, header_style="bold")
    for column in ("XID", "class", "meaning", "action"):
        table.add_column(column, justify="right" if column == "XID" else "left")
    for code, xid in sorted(CATALOG.items()):
        table.add_row(str(code), xid.xid_class, xid.meaning, xid.action)
    stdout_console().print(table)
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    """The config and everything `run` loads from it (web config, rule files), each error
    on stderr and exit 2 as `run` would refuse it; warnings for what it would start with
    but not do as configured."""
    from gpuwatch.serve.preflight import check

    path = args.config or args.file
    try:
        config = load_config(path)
    except FileError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_CONFIG
    found = check(config)
    for error in found.errors:
        print(error, file=sys.stderr)
    for warning in found.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    name = path or "(no file: defaults)"
    if found.errors:
        print(f"{name}: FAILED: gpuwatch run would refuse to start with it", file=sys.stderr)
        return EXIT_CONFIG
    rules = found.rules
    loaded = f"{len(rules.files)} rule files, {len(rules.groups)} groups" if rules else ""
    print(f"{name}: OK ({loaded})")
    print(config_text(config))
    return 0
