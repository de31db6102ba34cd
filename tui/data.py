"""What the dashboard shows, fetched from daemons' JSON API: one snapshot per node per refresh.

Every request has a timeout, and a fleet's nodes are fetched concurrently, so one slow or dead
node costs its own row a timeout and never holds up the screen."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp

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


class Source(Protocol):
    """Where snapshots come from: daemons over HTTP, a Prometheus server, or fixed data."""

    async def fetch(self, url: str, detail: bool) -> NodeSnapshot: ...

    async def fetch_fleet(self, urls: list[str]) -> list[NodeSnapshot]:
        """Every node's row; a source that sees the whole fleet may name nodes of its own."""
        ...


async def fetch_each(source: Source, urls: list[str]) -> list[NodeSnapshot]:
    """A fleet as separate nodes, fetched concurrently, each with its own timeout."""
    return list(await asyncio.gather(*(source.fetch(u, detail=False) for u in urls)))


class HttpSource:
    def __init__(self, timeout: float = NODE_TIMEOUT_S) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def _get(self, url: str) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        async with self._session.get(url) as response:
            response.raise_for_status()
            return (await response.json())["data"]

    async def fetch(self, url: str, detail: bool) -> NodeSnapshot:
        """The node and its alerts; with `detail`, its events and utilization history too."""
        base = url.rstrip("/")
        try:
            # A fleet row needs only the node, and of its GPUs only a summary.
            parts = [self._get(f"{base}/api/v1/node" + ("" if detail else "?gpus=summary"))]
            if detail:
                parts += [
                    self._get(f"{base}/api/v1/alerts"),
                    self._get(f"{base}/api/v1/events?since=1h&limit=50"),
                    self._get(base + HISTORY),
                ]
            got = await asyncio.gather(*parts)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError) as exc:
            return NodeSnapshot(url, error=_reason(exc), fetched_at=time.time())
        history: dict[str, list[float]] = {}
        if detail:
            for series in got[3]["result"]:
                history[series["metric"].get("gpu", "")] = [float(v) for _, v in series["values"]]
        return NodeSnapshot(
            url,
            node=got[0],
            alerts=got[1]["alerts"] if detail else [],
            events=got[2]["events"] if detail else [],
            history=history,
            fetched_at=time.time(),
        )

    async def fetch_fleet(self, urls: list[str]) -> list[NodeSnapshot]:
        return await fetch_each(self, urls)

    async def watch(self, url: str) -> AsyncIterator[str]:
        """The kinds of the events a daemon streams (`/api/v1/stream`), as they happen; ends
        when the stream does (the caller reconnects)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        stream_timeout = aiohttp.ClientTimeout(total=None, sock_read=STREAM_SILENCE_S)
        async with self._session.get(
            f"{url.rstrip('/')}/api/v1/stream", timeout=stream_timeout
        ) as r:
            r.raise_for_status()
            async for line in r.content:
                if line.startswith(b"event:"):
                    yield line[6:].strip().decode()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"HTTP {exc.status}"
    text = str(exc) or type(exc).__name__
    return text.split(" [")[0]  # aiohttp appends the OS error in brackets
