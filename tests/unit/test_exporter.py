from __future__ import annotations

from gpuwatch.exporters.prometheus import MetricsRenderer

from gpuwatch import metrics as m
from gpuwatch.clock import ManualClock
from gpuwatch.model import Sample
from gpuwatch.store import Store

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
