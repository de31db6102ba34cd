"""`gpuwatch rules backtest FILE... --prometheus URL --from T --to T`: what rule files would have
done over a span of the past, evaluated by gpuwatch's engine on the raw samples a Prometheus
server recorded (its query API: a range selector at an instant returns the raw samples)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
from collections import defaultdict
from dataclasses import asdict
from urllib.parse import urlencode, urlsplit

from gpuwatch.actions.replay import Aftermath, Page
from gpuwatch.clients.exits import EXIT_UNREACHABLE, fail
from gpuwatch.clients.tls import open_url, redact
from gpuwatch.config import load_config
from gpuwatch.promql.values import Labels
from gpuwatch.rules.backtest import Backtest, Fetched, FetchFn, Interval
from gpuwatch.rules.files import load_rule_files
from gpuwatch.text.printable import one_line, printable
from gpuwatch.text.timefmt import parse_since, rfc3339
from gpuwatch.text.timefmt import utc_second as when
from gpuwatch.text.units import parse_duration
from gpuwatch.text.yamlfile import FileError

MAX_ANSWER_BYTES = 256 * 2**20  # one selector's chunk; past it, a shorter --chunk
TIMEOUT_S = 120.0  # Prometheus's own query timeout is 2 minutes


class HistoryError(Exception):
    pass


def prometheus_history(base: str, ca_file: str | None, timeout: float = TIMEOUT_S) -> FetchFn:
    """The raw samples of a selector in (start, end], from Prometheus's /api/v1/query."""

    def fetch(selector: str, start: float, end: float) -> Fetched:
        window = f"{max(1, round((end - start) * 1000))}ms"
        query = urlencode({"query": f"{selector}[{window}]", "time": f"{end:.3f}"})
        url = f"{base}/api/v1/query?{query}"
        try:
            with open_url(url, ca_file, timeout) as answer:
                body = answer.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:
            said = _error_of(exc.read(65536) if exc.fp is not None else b"") or str(exc)
            raise HistoryError(
                f"Prometheus refused {selector}[{window}]: {one_line(said, 500)}"
            ) from None
        if len(body) > MAX_ANSWER_BYTES:
            raise HistoryError(
                f"{selector}: one chunk's answer is over {MAX_ANSWER_BYTES >> 20} MiB; "
                "read shorter chunks (--chunk)"
            )
        try:
            data = json.loads(body)["data"]
            if data["resultType"] != "matrix":
                raise ValueError(f"a {data['resultType']}, not a matrix")
            return [
                (
                    tuple(sorted((str(k), str(v)) for k, v in r["metric"].items())),
                    [(float(t), float(v)) for t, v in r["values"]],
                )
                for r in data["result"]
            ]
        except (ValueError, KeyError, TypeError) as exc:
            raise HistoryError(f"{redact(base)}: not a Prometheus query answer: {exc}") from None

    return fetch


def _error_of(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", ""))[:500]
    except (ValueError, AttributeError):
        return ""


def cmd_backtest(args: argparse.Namespace) -> int:
    now = time.time()
    try:
        start, end = parse_since(args.start, now), parse_since(args.end, now)
        interval = parse_duration(args.interval)
        chunk = parse_duration(args.chunk)
    except ValueError as exc:
        return fail(str(exc))
    if end > now:
        return fail(f"--to ({rfc3339(end)}) is in the future: Prometheus has no history there")
    if end <= start:
        return fail(f"--to ({rfc3339(end)}) is not after --from ({rfc3339(start)})")
    if urlsplit(args.prometheus).scheme not in ("http", "https"):
        return fail(f"--prometheus {args.prometheus!r}: expected an http:// or https:// URL")
    if interval <= 0 or chunk <= 0:
        return fail("--interval and --chunk must be longer than 0s")
    try:
        groups = load_rule_files(args.files)
    except FileError as exc:
        return fail(str(exc))
    base = args.prometheus.rstrip("/")
    test = Backtest(
        groups, prometheus_history(base, args.ca_file), default_interval=interval, chunk=chunk
    )
    aftermath = None
    if args.config:
        try:
            config = load_config(args.config)
        except FileError as exc:
            return fail(str(exc))
        slurm = config.actions.slurm if config.actions.slurm.drain_on else None
        notify = config.notify if config.notify.receivers else None
        aftermath = Aftermath(slurm, notify, test.instances)
    try:
        intervals = test.run(start, end, aftermath.observe if aftermath else None)
    except HistoryError as exc:
        return fail(str(exc))
    except (urllib.error.URLError, OSError) as exc:
        return fail(f"Prometheus {redact(base)} unreachable: {exc}", EXIT_UNREACHABLE)
    if aftermath is not None:
        aftermath.finish(end)
    if args.json:
        for i in intervals:
            print(json.dumps(interval_json(i)))
        for a in aftermath.actions if aftermath else ():
            print(json.dumps({"kind": "action", **asdict(a), "time": rfc3339(a.time)}))
        for p in aftermath.pages if aftermath else ():
            print(json.dumps({"kind": "page", **asdict(p), "time": rfc3339(p.time)}))
        return _failed(test.failures)
    text = report(intervals, start, end, test.samples_read)
    if aftermath is not None:
        text += aftermath_report(aftermath)
    sys.stdout.write(text)
    return _failed(test.failures)


def _failed(failures: dict[str, tuple[int, str]]) -> int:
    """Rules that failed to evaluate would have failed in Prometheus too: said, exit 1."""
    for name, (count, error) in sorted(failures.items()):
        said = one_line(error, 300)
        print(
            f"gpuwatch: rule {printable(name)} failed {count} evaluations: {said}", file=sys.stderr
        )
    return 1 if failures else 0


def interval_json(i: Interval) -> dict[str, object]:
    return {
        "kind": "interval",
        "alertname": i.alertname,
        "labels": dict(i.labels),
        "state": i.state,
        "start": rfc3339(i.start),
        "end": rfc3339(i.end),
    }


def report(intervals: list[Interval], start: float, end: float, samples: int) -> str:
    """The firing intervals, by alert and node (the `instance` label), as an operator reads
    them before shipping a rule."""
    firing = [i for i in intervals if i.state == "firing"]
    lines = [
        f"{when(start)} to {when(end)} UTC: {samples} samples read; "
        f"{len(firing)} firing intervals of {len({i.alertname for i in firing})} alerts "
        f"on {len({_node(i.labels) for i in firing})} nodes",
    ]
    by_alert: dict[str, list[Interval]] = defaultdict(list)
    for i in firing:
        by_alert[i.alertname].append(i)
    for name in sorted(by_alert):
        found = by_alert[name]
        nodes = {_node(i.labels) for i in found}
        lines += ["", f"{printable(name)}: {len(found)} intervals on {len(nodes)} nodes"]
        for i in sorted(found, key=lambda i: (_node(i.labels), i.start)):
            upto = when(i.end) if i.end is not None else "(still firing)"
            took = _took((i.end if i.end is not None else end) - i.start)
            rest = " ".join(
                f'{k}="{printable(v)}"' for k, v in i.labels if k not in ("alertname", "instance")
            )
            lines.append(f"  {_node(i.labels):<24} {when(i.start)} -> {upto:<19} {took:>7}  {rest}")
    return "\n".join(lines) + "\n"


def aftermath_report(done: Aftermath) -> str:
    """The drains and pages, when a config was given."""
    lines = [""]
    if done.slurm is None:
        lines.append("Drains: the config drains on nothing (actions.slurm.drain_on)")
    else:
        slurm = done.slurm
        lines.append(
            f"Drains (drain_on: {', '.join(slurm.drain_on)}; the {len(done.nodes)} nodes of "
            f"the history as one partition, max_drained_fraction {slurm.max_drained_fraction:g}"
            f"): {sum(a.action == 'drain' for a in done.actions)} drains, "
            f"{sum(a.action == 'held' for a in done.actions)} held"
        )
        lines += [
            f"  {printable(a.node):<24} {when(a.time)}  {a.action:<7} {printable(a.message)}"
            for a in done.actions
        ]
    lines.append("")
    if done.notify is None:
        lines.append("Pages: the config has no receivers (notify.receivers)")
    else:
        lines.append(f"Pages: {len(done.pages)}")
        by_receiver: dict[str, list[Page]] = defaultdict(list)
        for page in done.pages:
            by_receiver[page.receiver].append(page)
        for receiver in sorted(by_receiver):
            pages = by_receiver[receiver]
            lines.append(f"  {printable(receiver)}: {len(pages)} pages")
            for page in pages:
                said = ", ".join(f"{printable(name)} {status}" for name, status in page.alerts)
                lines.append(f"    {when(page.time)}  {printable(page.node):<24} {said}")
    return "\n".join(lines) + "\n"


def _node(labels: Labels) -> str:
    return printable(dict(labels).get("instance", "-"))


def _took(seconds: float) -> str:
    if seconds < 60:
        return f"{round(seconds)}s"
    minutes = round(seconds / 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"
