"""A real Alertmanager (Debian's prometheus-alertmanager) lists the daemon's
alerts, and they resolve there when they resolve here; checked through Alertmanager's own API."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import start_daemon, stop_daemon, wait_for

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = pytest.mark.skipif(
    ALERTMANAGER is None and not os.environ.get("GPUWATCH_REQUIRE_TOOLS"),
    reason="alertmanager not installed (Debian package 'prometheus-alertmanager')",
)

# Real time (Alertmanager judges endsAt by its own clock), so quick rules instead of the packs'
# minute-long windows: the brake alert resolves as soon as the brake lifts.
BRAKE = """
name: brake
node: {gpus: 8, model: H100, workload: training, seed: 1}
faults:
  - {kind: power_brake, gpu: 1, at: 3s, duration: 4s}
  - {kind: fall_off_bus, gpu: 3, at: 3s}
"""
RULES = """
groups:
  - name: quick
    rules:
      - alert: GpuPowerBrake
        expr: gpuwatch_gpu_clock_event_active{reason="hw_power_brake"} == 1
        labels: {severity: warning}
        annotations: {summary: "GPU {{ $labels.gpu }}: power brake asserted"}
      - alert: GpuFellOffBus
        expr: gpuwatch_gpu_lost == 1
        labels: {severity: critical}
        annotations: {summary: "GPU {{ $labels.gpu }} fell off the bus"}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def am_alerts(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(
        f"{url}/api/v2/alerts?active=true&silenced=true&inhibited=true", timeout=5
    ) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def test_alertmanager_lists_the_alerts_and_resolves_them_with_the_daemon(tmp_path: Path) -> None:
    assert ALERTMANAGER is not None
    port = free_port()
    (tmp_path / "am.yml").write_text("route: {receiver: nobody}\nreceivers: [{name: nobody}]\n")
    am_log = open(tmp_path / "am.log", "wb")  # noqa: SIM115 (kept open for the process)
    am = subprocess.Popen(
        [
            ALERTMANAGER,
            f"--config.file={tmp_path / 'am.yml'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--storage.path={tmp_path / 'am-data'}",
            "--cluster.listen-address=",
        ],
        stdout=am_log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    scenario = tmp_path / "brake.yaml"
    scenario.write_text(BRAKE)
    rules = tmp_path / "quick.yaml"
    rules.write_text(RULES)
    config = tmp_path / "gpuwatch.yaml"
    config.write_text(
        "node_name: gpu-node-7\n"
        f"rules: {{files: [{rules}]}}\n"
        "notify:\n"
        "  receivers:\n"
        f"    - {{name: fleet, type: alertmanager, url: '{url}'}}\n"
    )
    daemon = None
    try:
        wait_for(lambda: _answers(url), timeout=20)
        daemon = start_daemon(
            tmp_path, "--simulate", str(scenario), "--speed", "10", "-c", str(config)
        )

        def listed() -> set[tuple[str, str]]:
            return {(a["labels"]["alertname"], a["labels"].get("gpu", "")) for a in am_alerts(url)}

        wait_for(lambda: {("GpuPowerBrake", "1"), ("GpuFellOffBus", "3")} <= listed(), timeout=30)
        [brake] = [a for a in am_alerts(url) if a["labels"]["alertname"] == "GpuPowerBrake"]
        assert brake["labels"]["node"] == "gpu-node-7"
        assert brake["annotations"]["summary"]
        assert brake["status"]["state"] == "active"
        wait_for(lambda: ("GpuPowerBrake", "1") not in listed(), timeout=20)  # lifts at 7 s
        here = daemon.json("/api/v1/alerts")["data"]["alerts"]
        assert [a["labels"]["alertname"] for a in here if a["state"] == "firing"] == [
            "GpuFellOffBus"
        ]
        assert ("GpuFellOffBus", "3") in listed()  # still firing, still there
    finally:
        if daemon is not None:
            assert stop_daemon(daemon) == 0, daemon.log()
        am.terminate()
        am.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
