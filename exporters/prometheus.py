"""/metrics, rendered at most once per sample cycle.

Rendering never happens per scrape: the first scrape after a new cycle takes a snapshot of the
store's current values (on the event loop, cheap), renders it in a worker thread, and every
later scrape of that cycle gets the cached bytes. The text format is written here, with each
series' `name{labels}` built once and kept: prometheus_client's generate_latest took 15-40 us a
series (250 ms a render at 64 GPUs, 10k series). Its output is the reference: a test renders
the same rows both ways and compares the bytes. OpenMetrics, which scrapers ask for rarely,
still goes through prometheus_client (a custom Collector on a private registry).
"""

from __future__ import annotations

import asyncio
import gzip
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client import exposition as text_format
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics_format
from prometheus_client.utils import floatToGoString

from gpuwatch.clock import Clock
from gpuwatch.metrics import CATALOGUE, MetricDef, MetricType
from gpuwatch.model import Labels
from gpuwatch.store.tsdb import Store

TEXT_CONTENT_TYPE = text_format.CONTENT_TYPE_LATEST
OPENMETRICS_CONTENT_TYPE = openmetrics_format.CONTENT_TYPE_LATEST

SnapshotRow = tuple[str, Labels, float]
Describe = Callable[[str], MetricDef | None]


def kind_and_help(describe: Describe, name: str) -> tuple[MetricType, str]:
    """A family's TYPE and HELP: the catalogue's, a pushed metric's, or untyped (a series a
    local recording rule wrote)."""
    definition = describe(name)
    return (definition.type, definition.help) if definition else ("untyped", name)


def wants_openmetrics(accept: str) -> bool:
    return "application/openmetrics-text" in accept


class SnapshotCollector:
    """Yields metric families from a snapshot of (name, labels, value) rows."""

    def __init__(self, rows: list[SnapshotRow], describe: Describe = CATALOGUE.get) -> None:
        self.rows = rows
        self._describe = describe

    def describe(self) -> Iterable[Metric]:
        return []  # names are dynamic (job metrics); nothing to pre-register

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for name, labels, value in self.rows:
            family = families.get(name)
            if family is None:
                kind, help_text = kind_and_help(self._describe, name)
                base = name[: -len("_total")] if kind == "counter" else name
                family = families[name] = Metric(base, help_text, kind)
            family.add_sample(name, dict(labels), value)
        for name in sorted(families):
            yield families[name]


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class TextRenderer:
    """The Prometheus text format (0.0.4), as prometheus_client writes it, byte for byte."""

    def __init__(self, describe: Describe = CATALOGUE.get) -> None:
        # (name, labels) -> ('name{...} ', the value last rendered, its line): a series whose
        # value has not changed since the last render (most of them: the slow tier, errors at
        # 0, links up) costs a lookup; formatting a float took half a render.
        self._lines: dict[tuple[str, Labels], tuple[str, float, str]] = {}
        self._describe = describe

    def render(self, rows: list[SnapshotRow]) -> bytes:
        families: dict[str, list[tuple[Labels, float]]] = {}
        for name, labels, value in rows:
            families.setdefault(name, []).append((labels, value))
        lines = self._lines
        if len(lines) > 2 * len(rows) + 1024:  # series come and go; keep what is live
            lines.clear()
        out: list[str] = []
        for name in sorted(families):
            kind, help_text = kind_and_help(self._describe, name)
            out.append(f"# HELP {name} {_escape_help(help_text)}\n")
            out.append(f"# TYPE {name} {kind}\n")
            for labels, value in families[name]:
                key = (name, labels)
                known = lines.get(key)
                if known is not None and _same(known[1], value):
                    out.append(known[2])
                    continue
                if known is None:
                    pairs = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(labels))
                    prefix = f"{name}{{{pairs}}} " if labels else f"{name} "
                else:
                    prefix = known[0]
                line = f"{prefix}{floatToGoString(value)}\n"  # type: ignore[no-untyped-call]
                lines[key] = (prefix, value, line)
                out.append(line)
        return "".join(out).encode()


def _same(a: float, b: float) -> bool:
    """Whether two values render alike: NaN as NaN, and 0.0 apart from -0.0."""
    if a == b:
        return a != 0.0 or math.copysign(1.0, a) == math.copysign(1.0, b)
    return a != a and b != b  # noqa: PLR0124 (NaN)


@dataclass
class _Rendered:
    generation: int
    body: bytes
    gzipped: bytes | None = None


class MetricsRenderer:
    def __init__(self, store: Store, clock: Clock, describe: Describe = CATALOGUE.get) -> None:
        self._store = store
        self._clock = clock
        self._describe = describe
        self._lock = asyncio.Lock()
        self._cache: dict[bool, _Rendered] = {}
        self._text = TextRenderer(describe)

    def snapshot(self) -> list[SnapshotRow]:
        now = self._clock.now()
        return [(s.name, s.labels, s.last_value) for s in self._store.latest(now)]

    def render_rows(self, rows: list[SnapshotRow], openmetrics: bool) -> bytes:
        if not openmetrics:
            return self._text.render(rows)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(rows, self._describe))
        return bytes(openmetrics_format.generate_latest(registry))  # type: ignore[no-untyped-call]

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
