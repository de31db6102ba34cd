"""Without an NVIDIA driver nothing is faked; the backend is reported down."""

from __future__ import annotations

import pynvml
import pytest

from tests.conftest import parse_metrics


def _driver_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_driver_present(), reason="this machine has an NVIDIA driver")
def test_no_driver_reports_backend_down_and_keeps_serving(run_daemon) -> None:  # type: ignore[no-untyped-def]
    daemon = run_daemon()
    families = parse_metrics(daemon.metrics())
    assert families["gpuwatch_up"] == [({}, 0.0)]
    assert not [
        name for name, rows in families.items() if any("gpu" in labels for labels, _ in rows)
    ], "GPU series without a GPU"
    assert ({"state": "unhealthy"}, 1.0) in families["gpuwatch_node_health"]
    node = daemon.json("/api/v1/node")["data"]
    assert node["verdict"] == "unhealthy"
    assert node["reasons"] == ["NVML: driver library not found"]
    assert node["backend"] == {
        "name": "nvml",
        "up": False,
        "reason": "NVML: driver library not found",
        "driver_version": "",
        "library_version": "",
        "missing_gpus": [],
    }
    assert node["gpus"] == []
    status, _, _ = daemon.get("/healthz")
    assert status == 200  # the daemon itself is sampling fine; the node is what is unhealthy
