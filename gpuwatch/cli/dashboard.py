"""`gpuwatch tui`: the dashboard, on one node or a fleet."""

from __future__ import annotations

import argparse
import ssl

from gpuwatch.clients.address import DEFAULT_URL
from gpuwatch.clients.commands import read_hosts
from gpuwatch.clients.exits import EXIT_USAGE, fail
from gpuwatch.clients.tls import tls_context


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
