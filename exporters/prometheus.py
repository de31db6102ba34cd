"""/metrics: a custom Collector on a private registry, rendered at most once per sample cycle.

Rendering costs microseconds per series, so it never happens per scrape: the first scrape
after a new cycle takes a snapshot of the store's current values (on the event loop, cheap),
renders it in a worker thread, and every later scrape of that cycle gets the cached bytes.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client import exposition as text_format
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics_format

from gpuwatch.clock import Clock
from gpuwatch.metrics import CATALOGUE
from gpuwatch.model import Labels
from gpuwatch.store import Store

TEXT_CONTENT_TYPE = text_format.CONTENT_TYPE_LATEST
OPENMETRICS_CONTENT_TYPE = openmetrics_format.CONTENT_TYPE_LATEST

SnapshotRow = tuple[str, Labels, float]


def wants_openmetrics(accept: str) -> bool:
    return "application/openmetrics-text" in accept


class SnapshotCollector:
    """Yields metric families from a snapshot of (name, labels, value) rows."""

    def __init__(self, rows: list[SnapshotRow]) -> None:
        self.rows = rows

    def describe(self) -> Iterable[Metric]:
        return []  # names are dynamic (job metrics); nothing to pre-register

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for name, labels, value in self.rows:
            family = families.get(name)
            if family is None:
                definition = CATALOGUE.get(name)
                kind = definition.type if definition else "untyped"
                help_text = definition.help if definition else name
                base = name[: -len("_total")] if kind == "counter" else name
                family = families[name] = Metric(base, help_text, kind)
            family.add_sample(name, dict(labels), value)
        for name in sorted(families):
            yield families[name]


@dataclass
class _Rendered:
    generation: int
    body: bytes
    gzipped: bytes | None = None


class MetricsRenderer:
    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._lock = asyncio.Lock()
        self._cache: dict[bool, _Rendered] = {}

    def snapshot(self) -> list[SnapshotRow]:
        now = self._clock.now()
        return [(s.name, s.labels, s.last_value) for s in self._store.latest(now)]

    @staticmethod
    def render_rows(rows: list[SnapshotRow], openmetrics: bool) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(rows))
        if openmetrics:
            return bytes(openmetrics_format.generate_latest(registry))  # type: ignore[no-untyped-call]
        return text_format.generate_latest(registry)

    async def render(self, openmetrics: bool, gzipped: bool) -> bytes:
        async with self._lock:
            generation = self._store.generation
            cached = self._cache.get(openmetrics)
            if cached is None or cached.generation != generation:
                rows = self.snapshot()
                body = await asyncio.to_thread(self.render_rows, rows, openmetrics)
                cached = self._cache[openmetrics] = _Rendered(generation, body)
            if not gzipped:
                return cached.body
            if cached.gzipped is None:
                cached.gzipped = await asyncio.to_thread(gzip.compress, cached.body, 1)
            return cached.gzipped
