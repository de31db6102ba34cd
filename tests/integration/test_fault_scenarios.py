"""Acceptance 3 (so far): each simulated hardware fault, run as its built-in scenario, shows up
as the event, the metric and the alert an operator expects, and a healthy node shows none.

Scenarios run 10 times faster than real time (the fault at 10 s comes after 1 s), so alerts
with `for:` and the 15 s trend groups resolve within seconds of wall time.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import DaemonProcess, parse_metrics, start_daemon, stop_daemon, wait_for


class Expect(NamedTuple):
    xid: int | None  # the XID event the fault logs, if any
    metric: str
    labels: dict[str, str]  # beyond gpu="1"
    holds: str  # "nonzero" or "== value"
    alert: str | None
    verdict: str | None = None  # None: the verdict does not judge this fault yet


EXPECTED = {
    "ecc_sbe": Expect(92, "gpuwatch_gpu_ecc_errors_total",
                      {"type": "corrected", "scope": "volatile"}, "nonzero", None),
    "ecc_dbe": Expect(48, "gpuwatch_gpu_ecc_errors_total",
                      {"type": "uncorrected", "scope": "volatile"}, "== 1", "GpuEccUncorrectable",
                      "unhealthy"),
    "row_remap_pending": Expect(63, "gpuwatch_gpu_row_remap_pending", {}, "== 1",
                                "GpuRowRemapPending", "degraded"),
    "row_remap_failure": Expect(64, "gpuwatch_gpu_row_remap_failed", {}, "== 1",
                                "GpuRowRemapFailed", "unhealthy"),
    "nvlink_down": Expect(74, "gpuwatch_gpu_nvlink_link_up", {"link": "0"}, "== 0",
                          "GpuNvlinkDown", "unhealthy"),
    "nvlink_crc_storm": Expect(None, "gpuwatch_gpu_nvlink_errors_total",
                               {"link": "0", "type": "crc_flit"}, "nonzero", "GpuNvlinkErrors"),
    "pcie_replay_storm": Expect(None, "gpuwatch_gpu_pcie_replays_total", {}, "nonzero",
                                "GpuPcieReplayRate"),
    "retired_pages": Expect(63, "gpuwatch_gpu_retired_pages", {"cause": "dbe"}, "== 3",
                            "GpuRetiredPagesHigh", "unhealthy"),
    "recovery_action": Expect(154, "gpuwatch_gpu_recovery_action", {"action": "gpu_reset"},
                              "== 1", "GpuRecoveryActionRequired", "unhealthy"),
}  # fmt: skip


def metric_value(daemon: DaemonProcess, name: str, labels: dict[str, str]) -> float | None:
    for found, value in parse_metrics(daemon.metrics()).get(name, []):
        if found.get("gpu") == "1" and labels.items() <= found.items():
            return value
    return None


def firing(daemon: DaemonProcess) -> set[tuple[str, str]]:
    alerts = daemon.json("/api/v1/alerts")["data"]["alerts"]
    return {(a["labels"]["alertname"], a["labels"].get("gpu", "")) for a in alerts
            if a["state"] == "firing"}  # fmt: skip


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_a_fault_becomes_event_metric_and_alert(scenario: str, tmp_path: Path) -> None:
    expect = EXPECTED[scenario]
    daemon = start_daemon(tmp_path, "--simulate", scenario, "--speed", "10")
    try:
        if expect.xid is not None:
            events = wait_for(
                lambda: [
                    e for e in daemon.json("/api/v1/events?kind=xid")["data"]["events"]
                    if e["xid"] == expect.xid and e["gpu"] == 1
                ]
            )  # fmt: skip
            assert events[0]["action"]

        def metric_holds() -> bool:
            value = metric_value(daemon, expect.metric, expect.labels)
            if value is None:
                return False
            return value > 0 if expect.holds == "nonzero" else value == float(expect.holds[3:])

        wait_for(metric_holds)
        if expect.alert is not None:
            wait_for(lambda: (expect.alert, "1") in firing(daemon))
        if expect.verdict is not None:
            node = daemon.json("/api/v1/node")["data"]
            assert node["verdict"] == expect.verdict
            [gpu1] = [g for g in node["gpus"] if g["index"] == 1]
            assert gpu1["health"] == expect.verdict
            assert gpu1["health_actions"] and node["actions"] == gpu1["health_actions"]
            assert all(g["health"] == "healthy" for g in node["gpus"] if g["index"] != 1)
        # Only GPU 1 is faulty: no alert names any other GPU.
        assert {gpu for _, gpu in firing(daemon)} <= {"1", ""}
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def test_a_healthy_node_raises_nothing(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--simulate", "healthy", "--speed", "10")
    try:
        time.sleep(4)  # 40 s of simulated time: past every scenario's fault time
        assert firing(daemon) == set()
        assert daemon.json("/api/v1/events?since=1h")["data"]["events"] == []
        metrics = parse_metrics(daemon.metrics())
        assert all(v == 0 for _, v in metrics["gpuwatch_gpu_ecc_errors_total"])
        assert all(v == 1 for _, v in metrics["gpuwatch_gpu_nvlink_link_up"])
        assert "gpuwatch_gpu_xid_errors_total" not in metrics
        node = daemon.json("/api/v1/node")["data"]
        assert (node["verdict"], node["reasons"], node["actions"]) == ("healthy", [], [])
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
