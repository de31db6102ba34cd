"""/metrics, rendered at most once per sample cycle.

Rendering never happens per scrape: the first scrape after a new cycle takes a snapshot of the
store's current values by family (on the event loop, cheap), renders it in a worker thread,
and every later scrape of that cycle gets the cached bytes. The text format is written here,
each series' `name{labels}` built once and kept, and a family none of whose values changed
since the last render written as it was: prometheus_client's generate_latest took 15-40 us a
series (250 ms a render at 64 GPUs, 10k series), a line at a time 1.5 us. OpenMetrics, which
Prometheus asks for first (its scrapes' Accept header), is written the same way: its lines are
the text format's, its HELP escapes quotes too, a counter's family drops `_total`, an untyped
one is `unknown`, and the page ends in `# EOF`. prometheus_client's output is the reference for
both: tests render the same rows both ways and compare the bytes. The daemon itself no longer
imports prometheus_client for /metrics (4.4 MiB of its resident set).
"""

from __future__ import annotations

import asyncio
import gzip
import math
from array import array
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass

from gpuwatch.clock import Clock
from gpuwatch.metrics import CATALOGUE, MetricDef, MetricType
from gpuwatch.model import Labels
from gpuwatch.store.tsdb import Store
from gpuwatch.web.foreground import Serving

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

SnapshotRow = tuple[str, Labels, float]
Describe = Callable[[str], MetricDef | None]


def kind_and_help(describe: Describe, name: str) -> tuple[MetricType, str]:
    """A family's TYPE and HELP: the catalogue's, a pushed metric's, or untyped (a series a
    local recording rule wrote)."""
    definition = describe(name)
    return (definition.type, definition.help) if definition else ("untyped", name)


def wants_openmetrics(accept: str) -> bool:
    return "application/openmetrics-text" in accept


def go_float(value: float) -> str:
    """A sample value as Prometheus's Go clients write it (and prometheus_client after
    them): +Inf, -Inf, NaN; Python's shortest repr otherwise, except that a positive number
    of seven or more integer digits is written with an exponent, as Go switches sooner."""
    if value != value:  # noqa: PLR0124 (NaN)
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(float(value))
    dot = text.find(".")
    if value <= 0 or dot <= 6:
        return text
    digits = (text[1:dot] + text[dot + 1 :]).rstrip("0")
    mantissa = f"{text[0]}.{digits}".rstrip(".")
    return f"{mantissa}e+{dot - 1:02d}"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_help_om(text: str) -> str:
    return _escape_label(text)  # OpenMetrics escapes a quote in HELP too


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


Family = tuple[str, list[Labels], list[float]]  # a name, its series' labels and values


def families_of(rows: Iterable[SnapshotRow]) -> list[Family]:
    """Rows grouped by name, in order of first sight (the store already yields them so)."""
    out: dict[str, tuple[list[Labels], list[float]]] = {}
    for name, labels, value in rows:
        found = out.get(name)
        if found is None:
            found = out[name] = ([], [])
        found[0].append(labels)
        found[1].append(value)
    return [(name, labels, values) for name, (labels, values) in out.items()]


class TextRenderer:
    """The Prometheus text format (0.0.4), or OpenMetrics 1.0, as prometheus_client writes
    them, byte for byte."""

    def __init__(self, describe: Describe = CATALOGUE.get, openmetrics: bool = False) -> None:
        self.openmetrics = openmetrics
        # name -> (its labels and values' bits last rendered, its text): a family none of
        # whose values changed since the last render (the slow tier between reads, error
        # counts at 0, links up) is written as it was, after two comparisons. At 64 GPUs most
        # of the 10k series are in such families between two scrapes. Bits, not floats:
        # equal bits write equal text (0.0 and -0.0 differ), compared in C.
        self._families: dict[str, tuple[str, list[Labels], bytes, str]] = {}
        # (name, labels) -> ('name{...} ', the value last rendered, its line): in a family
        # that changed, a series that did not costs a lookup; formatting a float took half
        # a render.
        self._lines: dict[tuple[str, Labels], tuple[str, float, str]] = {}
        self._describe = describe

    def render(self, rows: list[SnapshotRow]) -> bytes:
        return self.render_families(families_of(rows))

    def render_families(self, families: list[Family]) -> bytes:
        lines, kept = self._lines, self._families
        rows = sum(len(values) for _, _, values in families)
        if len(lines) > 2 * rows + 1024:  # series come and go; keep what is live
            lines.clear()
        if len(kept) > 2 * len(families) + 64:
            kept.clear()
        out: list[str] = []
        for name, labels, values in sorted(families, key=_name):
            # TYPE and HELP too: a pushed name's depend on the other names on the page.
            head = self._head(name)
            before = kept.get(name)
            bits = array("d", values).tobytes()
            if (
                before is not None
                and before[2] == bits
                and before[0] == head
                and before[1] == labels
            ):
                out.append(before[3])
                continue
            text = head + self._family(name, labels, values)
            kept[name] = (head, labels, bits, text)
            out.append(text)
        if self.openmetrics:
            out.append("# EOF\n")
        return "".join(out).encode()

    def _head(self, name: str) -> str:
        """A family's HELP and TYPE lines."""
        kind, help_text = kind_and_help(self._describe, name)
        if not self.openmetrics:
            return f"# HELP {name} {_escape_help(help_text)}\n# TYPE {name} {kind}\n"
        base = name.removesuffix("_total") if kind == "counter" else name
        shown = "unknown" if kind == "untyped" else kind
        return f"# HELP {base} {_escape_help_om(help_text)}\n# TYPE {base} {shown}\n"

    def _family(self, name: str, labels: list[Labels], values: list[float]) -> str:
        """A family's series lines."""
        out: list[str] = []
        lines = self._lines
        for one, value in zip(labels, values, strict=True):
            key = (name, one)
            known = lines.get(key)
            # The same nonzero value (most lines of a family that changed) is tested inline.
            if known is not None and (
                (known[1] == value and value != 0.0) or _same(known[1], value)
            ):
                out.append(known[2])
                continue
            if known is None:
                pairs = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(one))
                prefix = f"{name}{{{pairs}}} " if one else f"{name} "
            else:
                prefix = known[0]
            line = f"{prefix}{go_float(value)}\n"
            lines[key] = (prefix, value, line)
            out.append(line)
        return "".join(out)


def _name(family: Family) -> str:
    return family[0]


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
    def __init__(
        self,
        store: Store,
        clock: Clock,
        describe: Describe = CATALOGUE.get,
        serving: Serving = nullcontext,
    ) -> None:
        """`serving()` is held while a page is written: work that can wait steps aside."""
        self._store = store
        self._clock = clock
        self._describe = describe
        self._serving = serving
        self._lock = asyncio.Lock()
        self._cache: dict[bool, _Rendered] = {}
        self._writers = {False: TextRenderer(describe), True: TextRenderer(describe, True)}

    def snapshot(self) -> list[Family]:
        """The store's current values by family, taken on the event loop (the store yields
        a family's series together)."""
        out: list[Family] = []
        name = None
        labels: list[Labels] = []
        values: list[float] = []
        for s in self._store.latest(self._clock.now()):
            if s.name != name:
                name, labels, values = s.name, [], []
                out.append((name, labels, values))
            labels.append(s.labels)
            values.append(s.last_value)
        return out

    def render_snapshot(self, families: list[Family], openmetrics: bool) -> bytes:
        return self._writers[openmetrics].render_families(families)

    async def render(self, openmetrics: bool, gzipped: bool) -> bytes:
        async with self._lock:
            generation = self._store.generation
            cached = self._cache.get(openmetrics)
            if cached is None or cached.generation != generation:
                with self._serving():
                    families = self.snapshot()
                    body = await asyncio.to_thread(self.render_snapshot, families, openmetrics)
                cached = self._cache[openmetrics] = _Rendered(generation, body)
            if not gzipped:
                return cached.body
            if cached.gzipped is None:
                with self._serving():
                    cached.gzipped = await asyncio.to_thread(gzip.compress, cached.body, 1)
            return cached.gzipped
