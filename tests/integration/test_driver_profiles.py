"""Driver generations, MIG and driver defects through a real `gpuwatch run --simulate`: the
real pynvml over the simulated NVML library, the rule packs, /metrics and the CLI.

Scenarios run 10 times faster than real time."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from tests.conftest import (
    DaemonProcess,
    gpuwatch,
    parse_metrics,
    start_daemon,
    stop_daemon,
    wait_for,
)


def firing(daemon: DaemonProcess) -> dict[tuple[str, str], dict[str, str]]:
    alerts = daemon.json("/api/v1/alerts")["data"]["alerts"]
    return {
        (a["labels"]["alertname"], a["labels"].get("gpu", "")): a["labels"]
        for a in alerts
        if a["state"] == "firing"
    }


def _run(tmp_path: Path, scenario: str) -> DaemonProcess:
    path = tmp_path / "scenario.yaml"
    path.write_text(scenario)
    return start_daemon(tmp_path / "d", "--simulate", str(path), "--speed", "10")


def test_a_blackwell_crc_storm_alerts_through_nvlink5_counters(tmp_path: Path) -> None:
    daemon = _run(
        tmp_path,
        "node: {gpus: 4, model: B200, driver: R580, workload: training}\n"
        "faults: [{kind: nvlink_crc_storm, gpu: 1, at: 10s}]\n",
    )
    try:
        labels = wait_for(lambda: firing(daemon).get(("GpuNvlinkErrors", "1")), timeout=40)
        assert labels["link"] == "0"
        metrics = parse_metrics(daemon.metrics())["gpuwatch_gpu_nvlink_errors_total"]
        types = {found["type"] for found, _ in metrics}
        assert types == {"effective", "symbol", "link_recovery", "link_recovery_failed"}
        node = wait_for(
            lambda: (n := daemon.json("/api/v1/node")["data"])["verdict"] == "unhealthy" and n
        )
        [gpu1] = [g for g in node["gpus"] if g["index"] == 1]
        assert gpu1["health_causes"][0]["key"] == "nvlink-crc"
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def test_the_driver_asking_for_a_bus_reset_is_an_alert_and_a_verdict(tmp_path: Path) -> None:
    # At 20 s, 2 s of wall time: the daemon listens for the driver's event by then, however busy
    # the machine (an event from before it registered is not handed out, as on a real driver).
    daemon = _run(
        tmp_path,
        "node: {gpus: 2, model: H100, driver: R615}\n"
        "faults: [{kind: recovery_action, gpu: 1, at: 20s, action: 6}]\n",
    )
    try:
        labels = wait_for(lambda: firing(daemon).get(("GpuRecoveryActionRequired", "1")))
        assert (labels["action"], labels["severity"]) == ("bus_reset", "critical")
        events = daemon.json("/api/v1/events?kind=recovery_action")["data"]["events"]
        assert events[0]["message"].startswith("GPU 1: the driver asks for bus_reset")
        # The verdict is judged once the cycle's evaluation is done; the API shows an alert as
        # soon as the rules have evaluated it, a moment before.
        node = wait_for(
            lambda: (n := daemon.json("/api/v1/node")["data"])["verdict"] == "unhealthy" and n,
            timeout=5,
        )
        assert "reset its PCIe bus" in node["actions"][0]
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def test_an_event_wait_failing_for_one_gpu_still_delivers_the_others_xids(
    tmp_path: Path,
) -> None:
    daemon = start_daemon(tmp_path, "--simulate", "event_wait_error", "--speed", "10")
    try:
        events = wait_for(
            lambda: [
                e for e in daemon.json("/api/v1/events?kind=xid")["data"]["events"] if e["gpu"] == 2
            ]
        )
        assert events[0]["xid"] == 48
        assert ("GpuXidCritical", "2") in wait_for(lambda: firing(daemon))
        assert "fault events cannot be watched" in daemon.log()
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def test_an_r470_node_is_read_through_its_older_calls_and_is_healthy(tmp_path: Path) -> None:
    daemon = _run(tmp_path, "node: {gpus: 2, model: A100, driver: R470, workload: training}\n")
    try:
        time.sleep(3)  # 30 s of simulated time
        metrics = parse_metrics(daemon.metrics())
        names = ("clock_event_active", "energy_joules_total", "temperature_celsius",
                 "nvlink_link_up")  # fmt: skip
        for name in (f"gpuwatch_gpu_{n}" for n in names):
            assert {labels["gpu"] for labels, _ in metrics[name]} == {"0", "1"}, name
        assert "gpuwatch_gpu_recovery_action" not in metrics  # no such field before R570
        # The simulated training job's process, listed through the _v2 call R470 has.
        wait_for(
            lambda: (
                [v for _, v in parse_metrics(daemon.metrics())["gpuwatch_gpu_processes"]]
                == [1.0, 1.0]
            )
        )
        assert firing(daemon) == {}
        node = daemon.json("/api/v1/node")["data"]
        assert (node["verdict"], node["backend"]["driver_version"]) == ("healthy", "470.256.02")
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def test_mig_instances_on_metrics_api_and_status(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--simulate", "mig", "--speed", "10")
    try:

        def instances() -> list[Any]:
            found: list[Any] = parse_metrics(daemon.metrics()).get(
                "gpuwatch_gpu_instance_memory_total_bytes", []
            )
            return found

        found = wait_for(lambda: len(instances()) == 10 and instances())
        gpu0 = sorted(
            (labels["gpu_i_id"], labels["gpu_i_profile"])
            for labels, _ in found
            if labels["gpu"] == "0"
        )
        assert gpu0 == [("1", "3g.40gb"), ("3", "2g.20gb"), ("7", "1g.10gb")]
        text = daemon.metrics()
        checked = subprocess.run(
            ["promtool", "check", "metrics"],
            input=text,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        gpus = daemon.json("/api/v1/node")["data"]["gpus"]
        assert [i["gpu_i_profile"] for i in gpus[1]["mig_instances"]] == ["1g.10gb"] * 7
        assert "utilization_ratio" not in gpus[0]["metrics"]  # none in MIG mode, not 0
        code, out, err = gpuwatch("status", daemon.url)
        assert code == 0, err
        assert out.count("1g.10gb") == 8 and "3g.40gb" in out and "└ 7" in out
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
