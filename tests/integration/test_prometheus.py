"""Acceptance 3: a real Prometheus server scrapes the daemon and answers queries about it."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus not installed"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _query(base: str, expr: str) -> list[dict]:  # type: ignore[type-arg]
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=5) as response:
        payload = json.load(response)
    assert payload["status"] == "success"
    return payload["data"]["result"]  # type: ignore[no-any-return]


def test_prometheus_scrapes_and_queries_the_daemon(run_daemon, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    daemon = run_daemon("--simulate", "healthy")
    target = daemon.url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: gpuwatch\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = _free_port()
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        temps: list[dict] = []  # type: ignore[type-arg]
        while time.monotonic() < deadline:
            try:
                temps = _query(base, "gpuwatch_gpu_temperature_celsius")
                # Wait for 8 scrapes, so that rate() has a window's worth of samples.
                if len(temps) == 8 and _query(base, "count_over_time(gpuwatch_up[10s]) >= 8"):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert len(temps) == 8, (tmp_path / "prometheus.log").read_text()[-2000:]
        assert {r["metric"]["gpu"] for r in temps} == {str(i) for i in range(8)}
        up = _query(base, 'up{job="gpuwatch"}')
        assert up[0]["value"][1] == "1"
        # Energy is a counter Prometheus can rate: a training H100 draws hundreds of watts.
        watts = _query(base, "rate(gpuwatch_gpu_energy_joules_total[8s])")
        assert len(watts) == 8
        assert all(300 < float(r["value"][1]) < 710 for r in watts), watts
        # Joining on the info metric works as a fleet dashboard would use it.
        joined = _query(
            base, "gpuwatch_gpu_power_watts * on(uuid) group_left(model) gpuwatch_gpu_info"
        )
        assert {r["metric"]["model"] for r in joined} == {"NVIDIA H100 80GB HBM3"}
    finally:
        prom.terminate()
        prom.wait(timeout=20)
