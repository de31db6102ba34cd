"""A real Prometheus server scrapes the daemon and answers queries about it."""

from __future__ import annotations

import time
from pathlib import Path

from tests.prometheus_server import needs_prometheus, start_prometheus

pytestmark = needs_prometheus


def test_prometheus_scrapes_and_queries_the_daemon(run_daemon, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    daemon = run_daemon("--simulate", "healthy")
    prom = start_prometheus(tmp_path, [daemon.url.removeprefix("http://")])
    _query = prom.query
    try:
        deadline = time.monotonic() + 60
        temps: list[dict] = []  # type: ignore[type-arg]
        while time.monotonic() < deadline:
            try:
                temps = _query("gpuwatch_gpu_temperature_celsius")
                # Wait for 8 scrapes, so that rate() has a window's worth of samples.
                if len(temps) == 8 and _query("count_over_time(gpuwatch_up[10s]) >= 8"):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert len(temps) == 8, prom.log()
        assert {r["metric"]["gpu"] for r in temps} == {str(i) for i in range(8)}
        up = _query('up{job="gpuwatch"}')
        assert up[0]["value"][1] == "1"
        # Energy is a counter Prometheus can rate: a training H100 draws hundreds of watts.
        watts = _query("rate(gpuwatch_gpu_energy_joules_total[8s])")
        assert len(watts) == 8
        assert all(300 < float(r["value"][1]) < 710 for r in watts), watts
        # Joining on the info metric works as a fleet dashboard would use it.
        joined = _query("gpuwatch_gpu_power_watts * on(uuid) group_left(model) gpuwatch_gpu_info")
        assert {r["metric"]["model"] for r in joined} == {"NVIDIA H100 80GB HBM3"}
    finally:
        prom.stop()
