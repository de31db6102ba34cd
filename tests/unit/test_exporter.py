from __future__ import annotations

from gpuwatch.exporters.prometheus import MetricsRenderer

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


def test_the_text_format_is_prometheus_clients_byte_for_byte() -> None:
    """The hand-written renderer against prometheus_client's own, on every kind of series:
    counters, gauges, untyped job metrics, label values that need escaping, special values."""
    from gpuwatch.exporters.prometheus import SnapshotCollector, TextRenderer
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    rows = [
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
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(rows))
    renderer = TextRenderer()
    assert renderer.render(rows) == generate_latest(registry)
    assert renderer.render(rows) == generate_latest(registry)  # from the kept lines
    # Values that change, including the ones equal but written apart (0.0 and -0.0), and
    # NaN, which equals nothing, then back.
    for values in ([0.0, -0.0, float("nan"), 1.0], [-0.0, 0.0, 2.0, float("nan")]):
        changed = zip(rows[:4], values, strict=True)
        rows = [(name, labels, value) for (name, labels, _), value in changed] + rows[4:]
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(rows))
        assert renderer.render(rows) == generate_latest(registry)

    # A family whose values are as before but one of whose series has gone, then is back;
    # one whose value is as before on another GPU.
    moved = [(n, (("gpu", "1"), ("uuid", "GPU-b")) if n == m.TEMPERATURE else ls, v)
             for n, ls, v in rows]  # fmt: skip
    for kept in (rows[:1] + rows[2:], rows, moved):
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(kept))
        assert renderer.render(kept) == generate_latest(registry)

    # Pushed metrics, described as such, in both writers alike.
    def describe(name: str) -> m.MetricDef | None:
        return m.pushed(name) if name.startswith("train_") else m.CATALOGUE.get(name)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(rows, describe))
    text = TextRenderer(describe).render(rows)
    assert text == generate_latest(registry)
    assert b"# TYPE train_step gauge\n" in text
    assert f"# HELP train_step {m.PUSHED_HELP}\n".encode() in text


def test_pushed_names_are_typed_so_both_formats_parse() -> None:
    """Whatever names a job pushes, each family appears once with a TYPE its name allows:
    prometheus_client's strict OpenMetrics parser takes the page, types as declared."""
    from gpuwatch.exporters.prometheus import SnapshotCollector
    from prometheus_client import CollectorRegistry
    from prometheus_client.openmetrics.exposition import generate_latest
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    job = (("job", "a"),)
    pushed = ["tokens_total", "loss", "loss_total", "lat_bucket", "lat_sum", "lat_count", "_total",
              "requests_total", "requests_created"]  # fmt: skip
    names = frozenset(pushed)
    rows = [(name, (*job, ("le", "1")) if name == "lat_bucket" else job, 1.0) for name in pushed]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(rows, lambda name: m.pushed(name, names.__contains__)))
    families = text_string_to_metric_families(generate_latest(registry).decode())
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
    from gpuwatch.exporters.prometheus import SnapshotCollector, TextRenderer
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    counter = [True]

    def describe(name: str) -> m.MetricDef | None:
        return m.MetricDef(name, "counter" if counter[0] else "untyped", "steps")

    rows = [("train_steps_total", (("job", "a"),), 7.0)]
    renderer = TextRenderer(describe)
    for counting in (True, False, True):
        counter[0] = counting
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(rows, describe))
        assert renderer.render(rows) == generate_latest(registry)
