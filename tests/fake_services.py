"""Loopback HTTP receivers that behave like the services gpuwatch posts to: each checks a
message against that service's documented limits and refuses it (400) as the service would,
answers with the service's success status, and can be scripted to fail (429 with Retry-After,
5xx) or to go down (nothing listening) and come back on the same port."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SUCCESS = {
    "webhook": 200,
    "slack": 200,
    "mattermost": 200,
    "teams": 202,
    "discord": 204,
    "pagerduty": 202,
    "alertmanager": 200,
}


@dataclass(frozen=True)
class Received:
    time: float  # wall clock, when the request arrived
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def _problems(kind: str, body: bytes) -> list[str]:
    """What the real service would refuse in this message (REFERENCE.md's limits)."""
    try:
        data = json.loads(body)
    except ValueError:
        return ["not JSON"]
    out: list[str] = []
    if kind == "slack":
        blocks = [b for a in data.get("attachments", []) for b in a.get("blocks", [])]
        if not isinstance(data.get("text"), str):
            out.append("no text")
        if len(blocks) > 50:
            out.append(f"{len(blocks)} blocks > 50")
        for b in blocks:
            text = b.get("text", {}).get("text", "") if b["type"] == "section" else ""
            if len(text) > 3000:
                out.append(f"section of {len(text)} chars > 3000")
    elif kind == "mattermost":
        size = len(data.get("text", "")) + sum(
            len(a.get("text", "")) for a in data.get("attachments", [])
        )
        if size > 16383:
            out.append(f"{size} chars > 16383")
    elif kind == "teams":
        if len(body) > 28 * 1024:
            out.append(f"{len(body)} bytes > 28 KB")
        card = data["attachments"][0]
        if card["contentType"] != "application/vnd.microsoft.card.adaptive":
            out.append("not an Adaptive Card")
        if card["content"]["type"] != "AdaptiveCard":
            out.append("content is not an AdaptiveCard")
    elif kind == "discord":
        embeds = data.get("embeds", [])
        if len(data.get("content", "")) > 2000:
            out.append("content > 2000")
        if len(embeds) > 10:
            out.append("more than 10 embeds")
        total = 0
        for e in embeds:
            total += len(e.get("title", "")) + len(e.get("description", ""))
            if len(e.get("description", "")) > 4096 or len(e.get("title", "")) > 256:
                out.append("embed title or description too long")
            for f in e.get("fields", []):
                total += len(f["name"]) + len(f["value"])
                if len(f["value"]) > 1024:
                    out.append("field value > 1024")
        if total > 6000:
            out.append(f"embeds total {total} > 6000")
    elif kind == "pagerduty":
        if data.get("event_action") not in ("trigger", "resolve"):
            out.append("bad event_action")
        if not data.get("routing_key"):
            out.append("no routing_key")
        if len(data.get("dedup_key", "")) > 255:
            out.append("dedup_key > 255")
        if data.get("event_action") == "trigger":
            payload = data.get("payload", {})
            if not 0 < len(payload.get("summary", "")) <= 1024:
                out.append("summary missing or > 1024")
            if payload.get("severity") not in ("critical", "error", "warning", "info"):
                out.append("bad severity")
            if not payload.get("source"):
                out.append("no source")
    return out


class FakeService:
    def __init__(self, kind: str = "webhook") -> None:
        self.kind = kind
        self.received: list[Received] = []  # accepted (2xx) messages
        self.requests: list[Received] = []  # every request, scripted failures included
        self.refused: list[tuple[Received, list[str]]] = []
        self.script: deque[tuple[int, dict[str, str], bytes]] = deque()
        self.lock = threading.Lock()
        self.port = 0
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def respond(
        self, status: int, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> None:
        """The next request gets this answer instead of success."""
        self.script.append((status, headers or {}, body))

    def up(self) -> FakeService:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                got = Received(time.time(), self.path, dict(self.headers), body)
                with service.lock:
                    service.requests.append(got)
                    scripted = service.script.popleft() if service.script else None
                    problems = _problems(service.kind, body) if scripted is None else []
                    if problems:
                        service.refused.append((got, problems))
                    elif scripted is None:
                        service.received.append(got)
                if scripted is not None:
                    status, headers, reply = scripted
                elif problems:
                    status, headers, reply = 400, {}, "; ".join(problems).encode()
                else:
                    status, headers = SUCCESS[service.kind], {}
                    reply = b'{"status":"success"}' if service.kind == "pagerduty" else b""
                    reply = b"ok" if service.kind == "slack" else reply
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def down(self) -> None:
        """Nothing listens any more: connections are refused, as when a service is down."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def bodies(self) -> list[Any]:
        with self.lock:
            return [r.json for r in self.received]
