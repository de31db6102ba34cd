"""The simulated demo node on /metrics, every sampling metric, promtool-clean."""

from __future__ import annotations

import gzip
import importlib.metadata
import platform
import re
import shutil
import subprocess

import pytest

import gpuwatch
from gpuwatch.sim.driver import DEFAULT_PROFILE, PROFILES
from tests.conftest import parse_metrics

GPU_METRICS = [
    "gpuwatch_gpu_up",
    "gpuwatch_gpu_info",
    "gpuwatch_gpu_temperature_celsius",
    "gpuwatch_gpu_memory_temperature_celsius",
    "gpuwatch_gpu_power_watts",
    "gpuwatch_gpu_power_limit_watts",
    "gpuwatch_gpu_energy_joules_total",
    "gpuwatch_gpu_utilization_ratio",
    "gpuwatch_gpu_memory_bandwidth_utilization_ratio",
    "gpuwatch_gpu_memory_used_bytes",
    "gpuwatch_gpu_memory_total_bytes",
    "gpuwatch_gpu_sm_clock_hertz",
    "gpuwatch_gpu_memory_clock_hertz",
    "gpuwatch_gpu_clock_event_active",
    "gpuwatch_gpu_ecc_errors_total",
    "gpuwatch_gpu_remapped_rows",
    "gpuwatch_gpu_row_remap_pending",
    "gpuwatch_gpu_row_remap_failed",
    "gpuwatch_gpu_pcie_replays_total",
    "gpuwatch_gpu_pcie_link_generation",
    "gpuwatch_gpu_pcie_link_width",
    "gpuwatch_gpu_nvlink_bytes_total",
    "gpuwatch_gpu_nvlink_errors_total",
    "gpuwatch_gpu_nvlink_link_up",
    "gpuwatch_gpu_recovery_action",
]
# What the host shows beside NVML: the demo node's InfiniBand ports, its PCI bus, its kernel log.
HOST_METRICS = [
    "gpuwatch_ib_port_info",
    "gpuwatch_ib_port_state",
    "gpuwatch_ib_port_physical_state",
    "gpuwatch_ib_port_up",
    "gpuwatch_ib_port_rate_bytes_per_second",
    "gpuwatch_ib_port_errors_total",
    "gpuwatch_ib_port_data_bytes_total",
    "gpuwatch_pci_gpus",
    "gpuwatch_pci_gpu_unlisted",
    "gpuwatch_pci_device_up",
    "gpuwatch_pcie_aer_errors_total",
    "gpuwatch_kmsg_up",
    "gpuwatch_kmsg_driver_lines_total",
]
KMSG_LINES = "gpuwatch_kmsg_driver_lines_total"
SELF_METRICS = [
    "gpuwatch_up",
    "gpuwatch_sample_duration_seconds",
    "gpuwatch_last_sample_timestamp_seconds",
    "gpuwatch_nvml_abandoned_workers",
]


@pytest.fixture
def demo(run_daemon):  # type: ignore[no-untyped-def]
    # Speed 10: the demo's first XID (45 s in) arrives after 4.5 s of real time.
    daemon = run_daemon("--simulate", "demo", "--speed", "10")
    return daemon


def test_every_sampling_metric_for_all_eight_gpus(demo) -> None:  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + 10
    while True:
        families = parse_metrics(demo.metrics())
        lines = {labels["kind"] for labels, _ in families.get(KMSG_LINES, [])}
        seen = "gpuwatch_gpu_xid_errors_total" in families and "xid" in lines
        if seen or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for name in GPU_METRICS:
        gpus = {labels.get("gpu") for labels, _ in families.get(name, [])}
        assert gpus == {str(i) for i in range(8)}, f"{name}: GPUs {sorted(gpus, key=str)}"
    for name in SELF_METRICS:
        assert name in families, name
    # NVML deadline misses: one series per GPU, and one without labels for driver-level calls.
    timeout_gpus = {labels.get("gpu") for labels, _ in families["gpuwatch_nvml_timeouts_total"]}
    assert timeout_gpus == {None} | {str(i) for i in range(8)}
    assert families["gpuwatch_up"] == [({}, 1.0)]
    [(build, one)] = families["gpuwatch_build_info"]
    assert one == 1.0 and build["version"] == gpuwatch.__version__
    assert build["nvidia_ml_py_version"] == importlib.metadata.version("nvidia-ml-py")
    assert build["python_version"] == platform.python_version()
    for name in HOST_METRICS:
        assert name in families, name
    ports = {labels["device"] for labels, _ in families["gpuwatch_ib_port_up"]}
    assert ports == {f"mlx5_{i}" for i in range(8)}
    # Each NIC sits under its GPU's PCIe switch: the GPU-NIC affinity.
    near = {labels["device"]: labels["gpus"] for labels, _ in families["gpuwatch_ib_port_info"]}
    assert near == {f"mlx5_{i}": str(i) for i in range(8)}
    assert families["gpuwatch_pci_gpus"] == [({}, 8.0)]
    assert families["gpuwatch_kmsg_up"] == [({}, 1.0)]
    # The demo's XID 13 on GPU 5 counted once, by code, though NVML and the kernel log both
    # reported it.
    assert ({"kind": "xid"}, 1.0) in families[KMSG_LINES]
    assert ({"gpu": "5", "uuid": _uuid(families, "5"), "xid": "13"}, 1.0) in families[
        "gpuwatch_gpu_xid_errors_total"
    ]
    # Retired pages: H100s remap rows instead, so NVML says NotSupported: absent, never 0.
    assert "gpuwatch_gpu_retired_pages" not in families
    # Values in base units and plausible for a training H100.
    for _, value in families["gpuwatch_gpu_power_limit_watts"]:
        assert value == 700.0
    for _, value in families["gpuwatch_gpu_utilization_ratio"]:
        assert 0.0 <= value <= 1.0
    info = families["gpuwatch_gpu_info"][0][0]
    assert set(info) == {
        "gpu",
        "uuid",
        "model",
        "pci_bus_id",
        "serial",
        "driver_version",
        "vbios_version",
    }
    assert info["model"] == "NVIDIA H100 80GB HBM3"


def _uuid(families, gpu: str) -> str:  # type: ignore[no-untyped-def]
    return next(labels["uuid"] for labels, _ in families["gpuwatch_gpu_up"] if labels["gpu"] == gpu)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_check_metrics_prints_nothing(demo) -> None:  # type: ignore[no-untyped-def]
    text = demo.metrics()
    result = subprocess.run(
        ["promtool", "check", "metrics"],
        input=text.encode(),
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0
    assert result.stdout == b"" and result.stderr == b"", (result.stdout + result.stderr).decode()


def test_openmetrics_and_gzip_by_request_headers(demo) -> None:  # type: ignore[no-untyped-def]
    status, headers, body = demo.get(
        "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    text = body.decode()
    assert text.endswith("# EOF\n")
    assert "# TYPE gpuwatch_gpu_energy_joules counter" in text
    status, headers, body = demo.get("/metrics", {"Accept-Encoding": "gzip"})
    assert headers.get("Content-Encoding") == "gzip"
    assert b"gpuwatch_gpu_temperature_celsius" in gzip.decompress(body)


def test_json_api(demo) -> None:  # type: ignore[no-untyped-def]
    node = demo.json("/api/v1/node")["data"]
    assert node["backend"]["up"] is True
    assert node["backend"]["driver_version"] == PROFILES[DEFAULT_PROFILE].driver_version
    assert len(node["gpus"]) == 8
    gpu = node["gpus"][0]
    assert gpu["status"] == "ok"
    assert 0 < gpu["metrics"]["temperature_celsius"] < 100
    assert gpu["metrics"]["nvlink"] == {"links": 18, "up": 18}
    gpus = demo.json("/api/v1/gpus")["data"]
    assert [g["index"] for g in gpus] == list(range(8))

    history = demo.json("/api/v1/history?metric=temperature_celsius&gpu=2&range=5m")["data"]
    assert history["resultType"] == "matrix"
    assert len(history["result"]) == 1
    series = history["result"][0]
    assert series["metric"]["gpu"] == "2"
    times = [t for t, _ in series["values"]]
    assert times == sorted(times) and len(times) >= 1

    status, _, body = demo.get("/api/v1/history?range=5m")
    assert status == 400 and b"metric" in body
    status, _, body = demo.get("/api/v1/history?metric=temperature_celsius&range=soon")
    assert status == 400 and b"range" in body
    status, _, body = demo.get("/healthz")
    assert status == 200
    status, _, body = demo.get("/")
    assert status == 200 and b"/metrics" in body
    assert re.search(rb"<b>(HEALTHY|DEGRADED|UNHEALTHY)</b>", body), body
