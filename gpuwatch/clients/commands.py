"""The commands that ask a running daemon: `status`, `health` and `events` over its HTTP API,
`ack` and `silence` over its control socket. The socket's client is imported by the commands
that use it: one over HTTP does without it."""

from __future__ import annotations

import argparse
import contextlib
import json
import urllib.error
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatch.clients.address import daemon_url
from gpuwatch.clients.exits import EXIT_UNREACHABLE, ControlError, fail
from gpuwatch.clients.tls import open_url, redact
from gpuwatch.health.line import health_line
from gpuwatch.reports.text import text as report_text
from gpuwatch.text.printable import one_line, printable, printable_json
from gpuwatch.web.plainhttp import HungUpError


def _control(
    args: argparse.Namespace, method: str, url: str, body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    """(exit status, the reply's data) of one request on the daemon's control socket; the
    exit status is 3 when the daemon cannot be reached and 1 when it refuses, said on stderr."""
    from gpuwatch.clients.control import default_socket, request

    path = Path(args.socket) if args.socket else default_socket(args.state_dir)
    try:
        status, reply = request(path, method, url, body)
    except ControlError as exc:
        return fail(str(exc), EXIT_UNREACHABLE), None
    if status != 200:
        return fail(printable(str(reply.get("error", f"HTTP {status}"))), 1), None
    return 0, printable_json(reply["data"])


def _why(exc: Exception) -> str:
    """Why a request to a daemon failed, in a word or two."""
    if isinstance(exc, HungUpError):
        # What a TLS listener without a word for plain HTTP does (an older gpuwatch's).
        return f"{exc} (if the daemon has a web config with TLS, give an https:// URL)"
    if isinstance(exc, urllib.error.HTTPError) and exc.code == 400:
        with contextlib.suppress(OSError, ValueError):
            if b"HTTPS server" in exc.read(4096):
                return "HTTP 400: the daemon serves TLS: give an https:// URL"
    if isinstance(exc, urllib.error.HTTPError):
        hint = " (check user:password@ in the URL)" if exc.code == 401 else ""
        return f"HTTP {exc.code} {exc.reason}{hint}"
    return str(getattr(exc, "reason", exc))


def _fetch_json(url: str, ca_file: str | None) -> Any:
    with open_url(url, ca_file, timeout=5) as response:
        return printable_json(json.load(response))


def read_hosts(path: str) -> list[str]:
    """Daemon URLs from a hosts file: a URL, or host[:port] (port 10040 by default), per line;
    blank lines and # comments ignored. ValueError names the line that is no address."""
    urls = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            urls.append(daemon_url(entry))
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
    return urls


def cmd_status(args: argparse.Namespace) -> int:
    from gpuwatch.clients.status import render_node
    from gpuwatch.clients.terminal import stdout_console

    base = args.url.rstrip("/")
    try:
        payload = _fetch_json(f"{base}/api/v1/node", args.ca_file)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return fail(f"{redact(base)} unreachable: {_why(exc)}", EXIT_UNREACHABLE)
    node = payload.get("data", {})
    if args.json:
        print(json.dumps(node, indent=2))
    else:
        stdout_console().print(render_node(node))
    return 0


HEALTH_EXIT = {"healthy": 0, "degraded": 1, "unhealthy": 2}
# node-problem-detector's custom plugins: 0 OK, 1 NonOK, 2 Unknown. A degraded node is OK:
# its condition would otherwise mark it for every warning-class XID.
NPD_EXIT = {0: 0, 1: 0, 2: 1, EXIT_UNREACHABLE: 2}


def cmd_health(args: argparse.Namespace) -> int:
    """One line and an exit status, for Slurm's HealthCheckProgram, NHC or a cron job."""
    if args.alive:
        return _alive(args.state_dir)
    base = args.url.rstrip("/")
    if args.local:
        from gpuwatch.clients.control import default_socket, request

        path = default_socket(args.state_dir)
        where = str(path)

        def fetch() -> Any:
            status, reply = request(path, "GET", "/api/v1/node")
            if status != 200:
                raise ValueError(f"HTTP {status}")
            return reply
    else:
        where = redact(base)

        def fetch() -> Any:
            return _fetch_json(f"{base}/api/v1/node", args.ca_file)

    status = _health(where, fetch, args.max_chars)
    return NPD_EXIT[status] if args.npd else status


def _health(base: str, fetch: Callable[[], Any], limit: int | None = None) -> int:
    """The verdict as one line, made safe once here for whatever reads it: a terminal, the
    health check's drain reason, the prolog's message in slurmd's log."""

    def say(line: str) -> None:
        print(one_line(line, limit))

    try:
        payload = fetch()
    except ControlError as exc:
        say(f"unreachable: {exc}")
        return EXIT_UNREACHABLE
    except (urllib.error.URLError, OSError, ValueError) as exc:
        say(f"unreachable: {base}: {_why(exc)}")
        return EXIT_UNREACHABLE
    node = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(node, dict):  # a proxy's page, another service: no verdict to read
        say(f"unreachable: {base}: the answer is not a gpuwatch daemon's node")
        return EXIT_UNREACHABLE
    say(health_line(node, base))
    return HEALTH_EXIT.get(str(node.get("verdict")), EXIT_UNREACHABLE)


def _alive(state_dir: str | None) -> int:
    """Whether the daemon samples, over its control socket (a pod's exec probe)."""
    from gpuwatch.clients.control import default_socket, request

    path = default_socket(state_dir)
    try:
        status, reply = request(path, "GET", "/healthz")
    except ControlError as exc:
        print(f"unreachable: {exc}")
        return EXIT_UNREACHABLE
    if status == 200:
        print("alive: sampling is current")
        return 0
    print(f"stale: {reply.get('problem') or f'HTTP {status}'}")
    return 1


def _refusal(exc: urllib.error.HTTPError) -> str:
    """Why the daemon refused: the API's own error, else the HTTP status."""
    try:
        return str(json.load(exc).get("error", exc.reason))
    except (ValueError, AttributeError):  # not the API's JSON: a proxy, the listener's auth
        return f"HTTP {exc.code} {exc.reason}"


def cmd_job_report(args: argparse.Namespace) -> int:
    """The job's report as a few lines (for the job's output, at the end of its batch
    script), or its JSON. Where there is none (a job that never held a GPU, one that ran
    while the daemon was down, no daemon answering) it says why on stderr and still exits
    0: as a batch script's last command its status is the job's, and gpuwatch not having
    seen something must fail no job. --strict gives 1 (no such job) and 3 (not asked)."""
    base = args.url.rstrip("/")
    url = f"{base}/api/v1/jobs/{urllib.parse.quote(args.job, safe='')}/report"
    try:
        made = _fetch_json(url, args.ca_file).get("data", {})
    except urllib.error.HTTPError as exc:
        code = fail(f"no report: {redact(base)}: {_refusal(exc)}", 1)
        return code if args.strict else 0
    except (urllib.error.URLError, OSError, ValueError) as exc:
        code = fail(f"no report: {redact(base)} unreachable: {_why(exc)}", EXIT_UNREACHABLE)
        return code if args.strict else 0
    print(json.dumps(made, indent=1) if args.json else report_text(made))
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    base = args.url.rstrip("/")
    query = urllib.parse.urlencode({"since": args.since})
    try:
        payload = _fetch_json(f"{base}/api/v1/events?{query}", args.ca_file)
    except urllib.error.HTTPError as exc:
        return fail(f"{redact(base)}: {_refusal(exc)}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return fail(f"{redact(base)} unreachable: {_why(exc)}", EXIT_UNREACHABLE)
    events = payload.get("data", {}).get("events", [])
    for event in events:
        if args.json:
            print(json.dumps(event))
            continue
        gpu = event.get("gpu")
        gpu_text = "-" if gpu is None else f"GPU {gpu}"
        print(f"{event['time']}  {event['kind']:<16} {gpu_text:<7} {event['message']}")
    if not events and not args.json:
        print(f"no events since {args.since}")
    return 0


def cmd_ack(args: argparse.Namespace) -> int:
    body = {"gpu": args.gpu, "cause": args.cause, "note": args.note}
    code, data = _control(args, "POST", "/api/v1/ack", body)
    if code == 0:
        print(f"acknowledged: {data['reason']}")
    return code


def cmd_silence(args: argparse.Namespace) -> int:
    if args.silence_command == "add":
        body = {
            "matchers": args.matchers,
            "duration": args.duration,
            "comment": args.comment,
            "createdBy": args.author,
        }
        code, data = _control(args, "POST", "/api/v1/silences", body)
    elif args.silence_command == "expire":
        silence = urllib.parse.quote(args.id, safe="")
        code, data = _control(args, "DELETE", f"/api/v1/silence/{silence}")
    else:
        code, data = _control(args, "GET", "/api/v1/silences")
    for s in data if isinstance(data, list) else [data] if data else []:
        print(
            f"{s['id']}  {s['status']['state']:<8} until {s['endsAt']}  {' '.join(s['matchers'])}"
            f"  by {s['createdBy']}" + (f": {s['comment']}" if s["comment"] else "")
        )
    return code
