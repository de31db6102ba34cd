from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from gpuwatch.exporters.prometheus import (
    Describe,
    MetricsRenderer,
    SnapshotRow,
    TextRenderer,
    go_float,
    kind_and_help,
)
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest as text_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as om_latest
from prometheus_client.utils import floatToGoString

from gpuwatch import metrics as m
from gpuwatch.clock import ManualClock
from gpuwatch.model import Sample
from gpuwatch.store.tsdb import Store

GPU0 = (("gpu", "0"), ("uuid", "GPU-a"))


async def test_renders_catalogue_types_and_caches_per_cycle() -> None:
    clock = ManualClock()
    store = Store(retention=3600)
    renderer = MetricsRenderer(store, clock)
    store.ingest(
        "nvml",
        clock.now(),
        [
            Sample(m.ENERGY, GPU0, 1234.5),
            Sample(m.TEMPERATURE, GPU0, 61.0),
            Sample("train_loss", (("job", "a"),), 2.5),
        ],
    )
    text = (await renderer.render(openmetrics=False, gzipped=False)).decode()
    assert "# TYPE gpuwatch_gpu_energy_joules_total counter" in text
    assert 'gpuwatch_gpu_energy_joules_total{gpu="0",uuid="GPU-a"} 1234.5' in text
    assert "# TYPE gpuwatch_gpu_temperature_celsius gauge" in text
    assert "# TYPE train_loss untyped" in text
    again = await renderer.render(openmetrics=False, gzipped=False)
    assert again == text.encode()
    # A new cycle renders anew; a series that went missing is gone from the output.
    clock.advance(1)
    store.ingest("nvml", clock.now(), [Sample(m.TEMPERATURE, GPU0, 62.0)])
    text = (await renderer.render(openmetrics=False, gzipped=False)).decode()
    assert "gpuwatch_gpu_energy_joules_total{" not in text
    assert 'gpuwatch_gpu_temperature_celsius{gpu="0",uuid="GPU-a"} 62.0' in text
    om = (await renderer.render(openmetrics=True, gzipped=False)).decode()
    assert om.endswith("# EOF\n")


async def test_values_older_than_the_lookback_are_not_exported() -> None:
    clock = ManualClock()
    store = Store(retention=3600)
    store.ingest("nvml", clock.now(), [Sample(m.TEMPERATURE, GPU0, 61.0)])
    clock.advance(301)
    text = (await MetricsRenderer(store, clock).render(openmetrics=False, gzipped=False)).decode()
    assert "gpuwatch_gpu_temperature_celsius{" not in text


class Oracle:
    """The rows as prometheus_client's own writers see them: a custom Collector yielding a
    family per name (a counter's without `_total`), sorted by name, on a private registry."""

    def __init__(self, rows: list[SnapshotRow], describe: Describe = m.CATALOGUE.get) -> None:
        self.rows = rows
        self._describe = describe

    def describe(self) -> list[Metric]:
        return []

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

    def write(self, openmetrics: bool) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)  # type: ignore[arg-type]
        latest: Callable[[CollectorRegistry], bytes] = om_latest if openmetrics else text_latest
        return bytes(latest(registry))


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_both_formats_are_prometheus_clients_byte_for_byte(openmetrics: bool) -> None:
    """The hand-written renderer against prometheus_client's own, on every kind of series:
    counters, gauges, untyped job metrics, label values that need escaping, special values."""
    rows: list[SnapshotRow] = [
        (m.ENERGY, GPU0, 1234.5),
        (m.ENERGY, (("gpu", "1"), ("uuid", "GPU-b")), 1e21),
        (m.TEMPERATURE, GPU0, 61.0),
        (m.UP, (), 1.0),
        ("train_loss", (("rank", "0"), ("job", 'a "quoted"\\path\nline')), float("nan")),
        ("train_step", (("job", "a"),), float("inf")),
        ("train_grad", (("job", "a"),), float("-inf")),
        ("train_lr", (("job", "a"),), 3e-05),
        (m.GPU_INFO, (("gpu", "0"), ("model", "NVIDIA H100 80GB HBM3"), ("uuid", "GPU-a")), 1.0),
    ]
    renderer = TextRenderer(openmetrics=openmetrics)
    assert renderer.render(rows) == Oracle(rows).write(openmetrics)
    assert renderer.render(rows) == Oracle(rows).write(openmetrics)  # from the kept lines
    # Values that change, including the ones equal but written apart (0.0 and -0.0), and
    # NaN, which equals nothing, then back.
    for values in ([0.0, -0.0, float("nan"), 1.0], [-0.0, 0.0, 2.0, float("nan")]):
        changed = zip(rows[:4], values, strict=True)
        rows = [(name, labels, value) for (name, labels, _), value in changed] + rows[4:]
        assert renderer.render(rows) == Oracle(rows).write(openmetrics)

    # A family whose values are as before but one of whose series has gone, then is back;
    # one whose value is as before on another GPU.
    moved = [(n, (("gpu", "1"), ("uuid", "GPU-b")) if n == m.TEMPERATURE else ls, v)
             for n, ls, v in rows]  # fmt: skip
    for kept in (rows[:1] + rows[2:], rows, moved):
        assert renderer.render(kept) == Oracle(kept).write(openmetrics)

    # Pushed metrics, described as such, in both writers alike; a HELP with a quote.
    def describe(name: str) -> m.MetricDef | None:
        if name == "train_lr":
            return m.MetricDef(name, "gauge", 'the "learning" rate\\n')
        return m.pushed(name) if name.startswith("train_") else m.CATALOGUE.get(name)

    text = TextRenderer(describe, openmetrics).render(rows)
    assert text == Oracle(rows, describe).write(openmetrics)
    assert b"# TYPE train_step gauge\n" in text
    assert f"# HELP train_step {m.PUSHED_HELP}\n".encode() in text


def test_values_are_written_as_go_writes_them() -> None:
    values = [0.0, -0.0, 1.0, -1.0, 0.1, 123456.7, 999999.0, 1000000.0, 1234567.5, 1e21, 1e-7,
              -1234567.0, 2.5e15, 4.503599627370497e15, float("inf"), float("-inf"), float("nan"),
              5e-324, 1.7976931348623157e308, 12345678901234567890.0]  # fmt: skip
    for value in values:
        assert go_float(value) == floatToGoString(value), value  # type: ignore[no-untyped-call]


def test_pushed_names_are_typed_so_both_formats_parse() -> None:
    """Whatever names a job pushes, each family appears once with a TYPE its name allows:
    prometheus_client's strict OpenMetrics parser takes the page, types as declared."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    job = (("job", "a"),)
    pushed = ["tokens_total", "loss", "loss_total", "lat_bucket", "lat_sum", "lat_count", "_total",
              "requests_total", "requests_created"]  # fmt: skip
    names = frozenset(pushed)
    rows = [(name, (*job, ("le", "1")) if name == "lat_bucket" else job, 1.0) for name in pushed]

    def describe(name: str) -> m.MetricDef | None:
        return m.pushed(name, names.__contains__)

    page = TextRenderer(describe, openmetrics=True).render(rows)
    assert page == Oracle(rows, describe).write(openmetrics=True)
    families = text_string_to_metric_families(page.decode())
    assert sorted((f.name, f.type) for f in families) == [
        ("_total", "unknown"),  # a counter of no name at all
        ("lat_bucket", "unknown"),
        ("lat_count", "unknown"),
        ("lat_sum", "unknown"),
        ("loss", "gauge"),
        ("loss_total", "unknown"),  # beside a pushed `loss`: as a counter it would be `loss` too
        ("requests_created", "unknown"),  # a counter's part, pushed alone: its own family
        ("requests_total", "unknown"),
        ("tokens", "counter"),
    ]


def test_a_familys_type_follows_what_describes_it_even_when_its_values_stand() -> None:
    """A pushed name's TYPE depends on the other names on the page (train_steps_total is a
    counter until train_steps appears): the text written last time is not reused then."""
    counter = [True]

    def describe(name: str) -> m.MetricDef | None:
        return m.MetricDef(name, "counter" if counter[0] else "untyped", "steps")

    rows: list[SnapshotRow] = [("train_steps_total", (("job", "a"),), 7.0)]
    for openmetrics in (False, True):
        renderer = TextRenderer(describe, openmetrics)
        for counting in (True, False, True):
            counter[0] = counting
            assert renderer.render(rows) == Oracle(rows, describe).write(openmetrics)
