"""What the dashboard shows, fetched from daemons' JSON API: one snapshot per node per refresh.

Every request has a timeout, and a fleet's nodes are fetched concurrently, so one slow or dead
node costs its own row a timeout and never holds up the screen."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp
from gpuwatch.tui.http import HttpError, JsonClient

from gpuwatch.compat import TIMEOUT_ERRORS

NODE_TIMEOUT_S = 2.0
STREAM_SILENCE_S = 60.0  # the daemon sends a keepalive every 15 s; silence this long is a hang
HISTORY = "/api/v1/history?metric=utilization_ratio&range=10m&step=15s"


@dataclass(frozen=True)
class NodeSnapshot:
    url: str
    node: dict[str, Any] = field(default_factory=dict)  # /api/v1/node's data
    alerts: list[dict[str, Any]] = field(default_factory=list)  # firing and pending
    events: list[dict[str, Any]] = field(default_factory=list)  # newest last
    history: dict[str, list[float]] = field(default_factory=dict)  # GPU index -> utilization
    error: str = ""  # why this refresh failed; the last good data stays on screen, dimmed
    fetched_at: float = 0.0

    @property
    def name(self) -> str:
        return str(self.node.get("node") or self.url)


def keep_last_good(last: NodeSnapshot | None, got: NodeSnapshot) -> NodeSnapshot:
    """A failed refresh keeps the last good data, to show dimmed, with the new error."""
    if got.error and last is not None and last.node:
        return replace(last, error=got.error, fetched_at=got.fetched_at)
    return got


class NodeFeed(Protocol):
    """Where snapshots come from: daemons over HTTP, a Prometheus server, or fixed data."""

    async def fetch(self, url: str, detail: bool) -> NodeSnapshot: ...

    async def fetch_fleet(self, urls: list[str]) -> list[NodeSnapshot]:
        """Every node's row; a source that sees the whole fleet may name nodes of its own."""
        ...


# asyncio.TimeoutError: what aiohttp raises on 3.10, where it is not the builtin one.
FAILURES = (HttpError, TimeoutError, asyncio.TimeoutError, OSError, ValueError, KeyError, TypeError)


def api_data(answer: Any) -> Any:
    """An API answer's `data`; a request that failed raises what stopped it."""
    if isinstance(answer, Exception):
        raise answer
    return answer["data"]


def failure_reason(exc: BaseException) -> str:
    if isinstance(exc, TIMEOUT_ERRORS):
        return "no answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, json.JSONDecodeError):
        return "the answer is not JSON"
    return str(exc) or type(exc).__name__


class HttpFeed:
    def __init__(self, timeout: float = NODE_TIMEOUT_S, tls: ssl.SSLContext | None = None) -> None:
        self.client = JsonClient(timeout, tls)
        self.tls = tls
        self._session: aiohttp.ClientSession | None = None  # for the event stream only

    async def fetch(self, url: str, detail: bool) -> NodeSnapshot:
        """The node; with `detail`, also its alerts, events and utilization history."""
        if not detail:
            return (await self.fetch_fleet([url]))[0]
        base = url.rstrip("/")
        answers = await self.client.get_many(
            [
                f"{base}/api/v1/node",
                f"{base}/api/v1/alerts",
                f"{base}/api/v1/events?since=1h&limit=50",
                base + HISTORY,
            ]
        )
        try:
            node, alerts, events, history = (api_data(a) for a in answers)
            utilization = {
                series["metric"].get("gpu", ""): [float(v) for _, v in series["values"]]
                for series in history["result"]
            }
            return NodeSnapshot(
                url, node, alerts["alerts"], events["events"], utilization, fetched_at=time.time()
            )
        except FAILURES as exc:
            return NodeSnapshot(url, error=failure_reason(exc), fetched_at=time.time())

    async def fetch_fleet(self, urls: list[str]) -> list[NodeSnapshot]:
        """Every node's row, from one request each (its GPUs summarized), all at once: each
        waits at most the timeout, and a dead node costs only its own row."""
        answers = await self.client.get_many(
            [f"{u.rstrip('/')}/api/v1/node?gpus=summary" for u in urls]
        )
        now = time.time()
        snapshots = []
        for url, answer in zip(urls, answers, strict=True):
            try:
                snapshots.append(NodeSnapshot(url, node=api_data(answer), fetched_at=now))
            except FAILURES as exc:
                snapshots.append(NodeSnapshot(url, error=failure_reason(exc), fetched_at=now))
        return snapshots

    async def watch(self, url: str) -> AsyncIterator[str]:
        """The kinds of the events a daemon streams (`/api/v1/stream`), as they happen; ends
        when the stream does (the caller reconnects)."""
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.tls if self.tls is not None else True)
            self._session = aiohttp.ClientSession(connector=connector)
        stream_timeout = aiohttp.ClientTimeout(total=None, sock_read=STREAM_SILENCE_S)
        async with self._session.get(
            f"{url.rstrip('/')}/api/v1/stream", timeout=stream_timeout
        ) as r:
            r.raise_for_status()
            async for line in r.content:
                if line.startswith(b"event:"):
                    yield line[6:].strip().decode()

    async def close(self) -> None:
        await self.client.close()
        if self._session is not None:
            await self._session.close()
