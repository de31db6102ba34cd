"""Each simulated hardware fault, run as its built-in scenario, shows up as the
events, the metric, the alert and the verdict an operator expects, and a healthy node shows none.

Scenarios run 10 times faster than real time, their faults 10 s later than built in (the
fault at 10 s comes after 2 s of wall time, once the daemon listens for NVML events however
busy the machine), so alerts with `for:` and the 15 s trend groups resolve within seconds.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.conftest import (
    DaemonProcess,
    delayed_scenario,
    parse_metrics,
    start_daemon,
    stop_daemon,
    wait_for,
)


class Expect(NamedTuple):
    xid: int | None  # the XID event the fault logs, if any
    event: tuple[str, str] | None  # the other NVML event it raises: (kind, what it says)
    metric: str
    labels: dict[str, str]  # beyond gpu="1"
    holds: str  # "nonzero" or "== value"
    alert: str
    verdict: str
    cause: str  # the key of the verdict's first cause


EXPECTED = {
    # Corrected errors, but a storm of them (XID 92) is wear to watch: a warning, degraded.
    "ecc_sbe": Expect(92, ("ecc", "sbe_storm"), "gpuwatch_gpu_ecc_errors_total",
                      {"type": "corrected", "scope": "volatile"}, "nonzero", "GpuXidWarning",
                      "degraded", "xid-92"),
    "ecc_dbe": Expect(48, ("ecc", "dbe"), "gpuwatch_gpu_ecc_errors_total",
                      {"type": "uncorrected", "scope": "volatile"}, "== 1", "GpuEccUncorrectable",
                      "unhealthy", "ecc-dbe"),
    "row_remap_pending": Expect(63, ("memory_retirement", "recorded"),
                                "gpuwatch_gpu_row_remap_pending", {}, "== 1",
                                "GpuRowRemapPending", "degraded", "remap-pending"),
    "row_remap_failure": Expect(64, ("memory_retirement", "failed"),
                                "gpuwatch_gpu_row_remap_failed", {}, "== 1",
                                "GpuRowRemapFailed", "unhealthy", "remap-failed"),
    "nvlink_down": Expect(74, None, "gpuwatch_gpu_nvlink_link_up", {"link": "0"}, "== 0",
                          "GpuNvlinkDown", "unhealthy", "nvlink-down"),
    "nvlink_crc_storm": Expect(None, None, "gpuwatch_gpu_nvlink_errors_total",
                               {"link": "0", "type": "crc_flit"}, "nonzero", "GpuNvlinkErrors",
                               "unhealthy", "nvlink-crc"),
    "pcie_replay_storm": Expect(None, None, "gpuwatch_gpu_pcie_replays_total", {}, "nonzero",
                                "GpuPcieReplayRate", "degraded", "pcie-replays"),
    "retired_pages": Expect(63, ("memory_retirement", "recorded"), "gpuwatch_gpu_retired_pages",
                            {"cause": "dbe"}, "== 3", "GpuRetiredPagesHigh", "unhealthy",
                            "retired-pages"),
    "recovery_action": Expect(154, ("recovery_action", "gpu_reset"),
                              "gpuwatch_gpu_recovery_action", {"action": "gpu_reset"}, "== 1",
                              "GpuRecoveryActionRequired", "unhealthy", "recovery-action"),
    # Counted at the switch port above GPU 1 (its own counters stay 0), on GPU 1's account.
    "pcie_aer": Expect(None, ("pcie_aer", "Uncorrectable (Fatal)"),
                       "gpuwatch_pcie_aer_errors_total",
                       {"severity": "fatal", "pci_bus_id": "0000:29:00.0",
                        "serves": "0000:2a:00.0"},
                       "== 1", "PcieAerFatal", "unhealthy", "pcie-aer-fatal:0000:29:00.0"),
    # The slow GPU among the training job's eight: named, with what slows it, as a warning.
    "hw_slowdown": Expect(None, None, "gpuwatch_gpu_clock_event_active",
                          {"reason": "hw_slowdown"}, "== 1", "GpuStraggler", "degraded",
                          "clocks-hw_slowdown"),
    "pcie_downtrain": Expect(None, None, "gpuwatch_gpu_pcie_link_width", {}, "== 8",
                             "GpuPcieLinkDowntrained", "degraded", "pcie-downtrained"),
    "nvlink_replay": Expect(None, None, "gpuwatch_gpu_nvlink_errors_total",
                            {"link": "0", "type": "replay"}, "nonzero", "GpuNvlinkErrors",
                            "unhealthy", "nvlink-replay"),
    "nvml_error": Expect(None, ("gpu_failing", "NVML_ERROR_RESET_REQUIRED"), "gpuwatch_gpu_up",
                         {}, "== 0",
                         "GpuUnresponsive", "unhealthy", "gpu-nvml-error"),
}  # fmt: skip


def metric_value(daemon: DaemonProcess, name: str, labels: dict[str, str]) -> float | None:
    for found, value in parse_metrics(daemon.metrics()).get(name, []):
        if found.get("gpu") == "1" and labels.items() <= found.items():
            return value
    return None


def firing(daemon: DaemonProcess) -> set[tuple[str, str]]:
    alerts = daemon.json("/api/v1/alerts")["data"]["alerts"]
    return {
        (a["labels"]["alertname"], a["labels"].get("gpu", ""))
        for a in alerts
        if a["state"] == "firing"
    }


MACHINE_CAUSED = {"GpuUnresponsive", "GpuwatchNvmlTimeouts"}


def stalled(daemon: DaemonProcess) -> set[str]:
    """GPUs the test machine made late: at ten times real time a GPU's 1 s NVML deadline is
    0.1 s of wall time, which a busy machine can stall past. The daemon then counts the
    timeout and rightly calls the GPU unresponsive; the tests set those GPUs aside, and only
    them."""
    return {
        labels.get("gpu", "")
        for labels, value in parse_metrics(daemon.metrics()).get("gpuwatch_nvml_timeouts_total", [])
        if value > 0
    }


def spilled(daemon: DaemonProcess) -> set[tuple[str, str]]:
    """Alerts on GPUs other than GPU 1, less a stalled GPU's timeouts and unresponsiveness."""
    late = stalled(daemon)
    return {
        (name, gpu)
        for name, gpu in firing(daemon)
        if gpu not in {"1", ""} and not (name in MACHINE_CAUSED and gpu in late)
    }


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_a_fault_becomes_event_metric_and_alert(scenario: str, tmp_path: Path) -> None:
    expect = EXPECTED[scenario]
    daemon = start_daemon(
        tmp_path, "--simulate", delayed_scenario(tmp_path, scenario), "--speed", "10"
    )
    try:
        if expect.xid is not None:
            events = wait_for(
                lambda: [
                    e
                    for e in daemon.json("/api/v1/events?kind=xid")["data"]["events"]
                    if e["xid"] == expect.xid and e["gpu"] == 1
                ]
            )
            assert events[0]["action"]

        def metric_holds() -> bool:
            value = metric_value(daemon, expect.metric, expect.labels)
            if value is None:
                return False
            return value > 0 if expect.holds == "nonzero" else value == float(expect.holds[3:])

        wait_for(metric_holds)
        if expect.event is not None:
            kind, what = expect.event
            events = wait_for(
                lambda: [
                    e
                    for e in daemon.json(f"/api/v1/events?kind={kind}")["data"]["events"]
                    if e["gpu"] == 1
                ]
            )
            assert any(what in str(v) for v in events[0].values()), events[0]
        if not expect.alert:  # a fault that needs nothing done: the GPU stays healthy, unalerted
            node, late = daemon.json("/api/v1/node")["data"], stalled(daemon)
            assert all(
                g["health"] == "healthy" for g in node["gpus"] if str(g["index"]) not in late
            ), node
            assert {a for a in firing(daemon) if a[1] in {"1", ""}} == set()
            assert spilled(daemon) == set()
            return
        wait_for(lambda: (expect.alert, "1") in firing(daemon))

        def verdict() -> dict[str, Any] | None:
            node: dict[str, Any] = daemon.json("/api/v1/node")["data"]
            [gpu1] = [g for g in node["gpus"] if g["index"] == 1]
            return node if gpu1["health"] == expect.verdict else None

        node, late = wait_for(verdict), stalled(daemon)
        [gpu1] = [g for g in node["gpus"] if g["index"] == 1]
        assert gpu1["health_causes"][0]["key"] == expect.cause
        assert gpu1["health_actions"]
        others = [g for g in node["gpus"] if g["index"] != 1]
        assert all(g["health"] == "healthy" for g in others if str(g["index"]) not in late)
        if not late:
            assert node["verdict"] == expect.verdict
            assert node["actions"] == gpu1["health_actions"]
        else:  # the node's actions: GPU 1's and those of the GPUs the machine stalled
            assert set(node["actions"]) == set(gpu1["health_actions"]).union(
                *(g["health_actions"] for g in others if str(g["index"]) in late)
            )
        # Only GPU 1 is faulty: no alert names any other GPU.
        assert spilled(daemon) == set()
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def test_a_healthy_node_raises_nothing(tmp_path: Path) -> None:
    # Played at twice real time, not ten: an NVML deadline is in simulated time, and at ten
    # times a busy test machine that stalls the daemon for 0.2 s makes a GPU "unresponsive".
    daemon = start_daemon(tmp_path, "--simulate", "healthy", "--speed", "2")
    try:
        time.sleep(6)  # 12 s of simulated time: past every scenario's fault time (10 s)
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
