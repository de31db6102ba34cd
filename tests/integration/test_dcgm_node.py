"""A DCGM-fed node end to end: `gpuwatch run --dcgm URL` against a server answering with real
dcgm-exporter captures, /metrics checked value by value and by promtool, and the shipped rule
packs firing on an XID that dcgm-exporter reports."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, parse_metrics, start_daemon, stop_daemon, wait_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm"
REAL = sorted((FIXTURES / "real").glob("*.prom"))
LINE = re.compile(r'^(\w+)\{gpu="(\d+)",(?:UUID|uuid)="[^"]+"[^}]*\} (\S+)$', re.M)


class FakeExporter:
    """dcgm-exporter's /metrics on a loopback port, answering with `text`."""

    def __init__(self, text: str) -> None:
        self.text = text
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = owner.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.handler = Handler
        self._serve(0)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def _serve(self, port: int) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self.handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def come_back(self) -> None:
        """Listen again on the same port, as a restarted dcgm-exporter does."""
        self._serve(int(self.server.server_address[1]))


@pytest.fixture
def exporter() -> Iterator[FakeExporter]:
    fake = FakeExporter("")
    yield fake
    fake.close()


def start_on(exporter: FakeExporter, text: str, directory: Path) -> DaemonProcess:
    """`gpuwatch run --dcgm` on the exporter answering `text`. Its kernel log is an empty
    file of the test's: the XIDs under test are dcgm-exporter's, and this machine's kernel
    log is not the node's."""
    exporter.text = text
    (directory / "kmsg").write_text("")
    config = directory / "gpuwatch.yaml"
    config.write_text(f"sources: {{kmsg: {{path: {directory / 'kmsg'}}}}}\n")
    return start_daemon(directory, "--dcgm", exporter.url, "-c", str(config))


def _capture(text: str, field: str) -> dict[str, float]:
    return {gpu: float(v) for name, gpu, v in LINE.findall(text) if name == field}


def _served(daemon: DaemonProcess, name: str) -> dict[str, float]:
    return {labels["gpu"]: v for labels, v in parse_metrics(daemon.metrics()).get(name, [])}


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.stem)
def test_a_real_capture_is_served_as_gpuwatch_metrics(
    path: Path, exporter: FakeExporter, tmp_path: Path
) -> None:
    text = path.read_text()
    daemon = start_on(exporter, text, tmp_path)
    try:
        wait_for(lambda: _served(daemon, "gpuwatch_gpu_up"))
        assert parse_metrics(daemon.metrics())["gpuwatch_up"][0][1] == 1.0
        gpus = set(_capture(text, "DCGM_FI_DEV_SM_CLOCK"))
        assert set(_served(daemon, "gpuwatch_gpu_up")) == gpus
        for field, metric, scale in (
            ("DCGM_FI_DEV_GPU_TEMP", "gpuwatch_gpu_temperature_celsius", 1.0),
            ("DCGM_FI_DEV_POWER_USAGE", "gpuwatch_gpu_power_watts", 1.0),
            ("DCGM_FI_DEV_FB_USED", "gpuwatch_gpu_memory_used_bytes", 2.0**20),
            ("DCGM_FI_DEV_GPU_UTIL", "gpuwatch_gpu_utilization_ratio", 0.01),
        ):
            expected = {g: v * scale for g, v in _capture(text, field).items()}
            assert _served(daemon, metric) == pytest.approx(expected), metric
        exposition = daemon.metrics()
        node = daemon.json("/api/v1/node")["data"]
        assert node["backend"]["name"] == "dcgm" and node["backend"]["up"] is True
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed")
    lint = subprocess.run(
        ["promtool", "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (lint.returncode, lint.stdout + lint.stderr) == (0, "")


def test_a_dcgm_xid_fires_the_shipped_xid_alert_and_a_failed_scrape_is_reported(
    exporter: FakeExporter, tmp_path: Path
) -> None:
    text = (FIXTURES / "h100_8gpu_nvlink_dcgm46.prom").read_text()
    daemon = start_on(exporter, text, tmp_path)
    try:
        wait_for(lambda: len(_served(daemon, "gpuwatch_gpu_up")) == 8)
        # GPU 2's last XID becomes 48 (a double-bit ECC error): one XID event.
        exporter.text = re.sub(
            r'(DCGM_FI_DEV_XID_ERROR\{gpu="2",[^}]*)err_code="0",err_msg="No Error"\} 0',
            r'\1err_code="48",err_msg="DBE"} 48',
            text,
        )
        assert exporter.text != text

        def xid_alert() -> bool:
            alerts = daemon.json("/api/v1/alerts")["data"]["alerts"]
            return any(
                a["labels"]["alertname"] == "GpuXidCritical"
                and a["labels"].get("gpu") == "2"
                and a["state"] == "firing"
                for a in alerts
            )

        wait_for(xid_alert, timeout=20)
        counted = parse_metrics(daemon.metrics())["gpuwatch_gpu_xid_errors_total"]
        assert [(labels["gpu"], labels["xid"], v) for labels, v in counted] == [("2", "48", 1.0)]
        events = daemon.json("/api/v1/events?kind=xid")["data"]["events"]
        assert [e["gpu"] for e in events] == [2] and events[0]["message"].startswith("XID 48")
        # The exporter goes away: gpuwatch_up 0 with the reason, and back when it returns.
        exporter.text = "garbage {\n"
        wait_for(lambda: parse_metrics(daemon.metrics())["gpuwatch_up"][0][1] == 0.0)
        reason = daemon.json("/api/v1/node")["data"]["backend"]["reason"]
        assert reason.startswith(f"dcgm-exporter {exporter.url}: not Prometheus text format")
        exporter.text = text
        wait_for(lambda: parse_metrics(daemon.metrics())["gpuwatch_up"][0][1] == 1.0)
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def test_an_exporter_restart_is_no_gpus_recovery_and_is_blamed_on_the_exporter(
    exporter: FakeExporter, tmp_path: Path
) -> None:
    text = (FIXTURES / "h100_8gpu_nvlink_dcgm46.prom").read_text()
    daemon = start_on(exporter, text, tmp_path)

    def fell_off(state: str) -> list[dict[str, str]]:
        events = daemon.json("/api/v1/events?kind=alert")["data"]["events"]
        return [e for e in events if e["message"].startswith(f"GpuFellOffBus {state}")]

    try:
        wait_for(lambda: len(_served(daemon, "gpuwatch_gpu_up")) == 8)
        # dcgm-exporter stops listing GPU 3, as it does a GPU fallen off the bus.
        without_3 = "\n".join(line for line in text.splitlines() if 'gpu="3"' not in line)
        exporter.text = without_3
        wait_for(lambda: fell_off("firing"))
        # The exporter restarts: refused for a few of gpuwatch's cycles, then back.
        exporter.close()
        wait_for(lambda: parse_metrics(daemon.metrics())["gpuwatch_up"][0][1] == 0.0)

        def causes() -> list[dict[str, str]]:
            return list(daemon.json("/api/v1/node")["data"]["causes"])

        # A scrape in flight at the close may be reset; the ones after it are refused.
        wait_for(lambda: any("Connection refused" in c["reason"] for c in causes()))
        [cause] = causes()
        assert "Connection refused" in cause["reason"], cause
        assert cause["action"].startswith("check that dcgm-exporter runs and answers"), cause
        assert "driver" not in cause["action"]
        time.sleep(3)  # the rules evaluate several times while the GPUs cannot be seen
        exporter.come_back()
        wait_for(lambda: parse_metrics(daemon.metrics())["gpuwatch_up"][0][1] == 1.0)
        wait_for(lambda: _served(daemon, "gpuwatch_gpu_lost").get("3") == 1.0)
        # GPU 3 never came back: the journal says it fell off once, and nothing since.
        assert len(fell_off("firing")) == 1, fell_off("firing")
        assert fell_off("resolved") == []
        alerts = daemon.json("/api/v1/alerts")["data"]["alerts"]
        assert [
            a["labels"]["gpu"]
            for a in alerts
            if a["labels"]["alertname"] == "GpuFellOffBus" and a["state"] == "firing"
        ] == ["3"]
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
