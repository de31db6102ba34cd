"""Draining and resuming a node in a real Slurm (slurmctld, slurmd and munge on loopback) as
the daemon's verdict changes, with the circuit breaker and an admin's drain left alone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, gpuwatch, start_daemon, stop_daemon, wait_for
from tests.slurm_server import NODE, Slurm, needs_slurm, start_slurm

pytestmark = needs_slurm


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[Slurm]:
    server = start_slurm(tmp_path / "slurm")
    try:
        yield server
    finally:
        server.stop()


# GPU 1 falls off the bus 2 s in; in the second, it is back 5 s later (a reset).
STAYS_LOST = """\
name: fall-off
node: {gpus: 2, model: H100, workload: training, seed: 1}
faults:
  - {kind: fall_off_bus, gpu: 1, at: 2s}
"""
COMES_BACK = STAYS_LOST.replace("at: 2s}", "at: 2s, duration: 5s}")


def run_daemon(
    tmp_path: Path,
    slurm: Slurm,
    scenario: str = STAYS_LOST,
    speed: float = 1.0,
    **slurm_actions: Any,
) -> DaemonProcess:
    settings = {"enabled": True, "node": NODE, "drain_on": ["gpu-lost", "xid-*"],
                "resume_after": "2s", **slurm_actions}  # fmt: skip
    lines = "".join(f"    {k}: {v!r}\n".replace("'", '"') for k, v in settings.items())
    config = tmp_path / "gpuwatch.yaml"
    config.write_text("actions:\n  slurm:\n" + lines.replace("True", "true"))
    scenario_file = tmp_path / "scenario.yaml"
    scenario_file.write_text(scenario)
    return start_daemon(
        tmp_path,
        "--config",
        str(config),
        "--simulate",
        str(scenario_file),
        "--speed",
        str(speed),
        env=slurm.env,
    )


def actions(daemon: DaemonProcess) -> list[str]:
    events = daemon.json("/api/v1/events?kind=action&since=1h")["data"]["events"]
    return [e["action"] for e in sorted(events, key=lambda e: e["time"])]


def lost_at(daemon: DaemonProcess) -> float:
    found = wait_for(lambda: daemon.json("/api/v1/events?kind=gpu_lost")["data"]["events"])
    return datetime.fromisoformat(found[0]["time"]).timestamp()


def firing(daemon: DaemonProcess, name: str) -> list[dict[str, Any]]:
    alerts = daemon.json("/api/v1/alerts")["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]


def ack(tmp_path: Path, *causes: str) -> None:
    for cause in causes:
        code, _, err = gpuwatch("ack", "1", cause, "--state-dir", str(tmp_path / "state"))
        assert code == 0, err


def test_a_lost_gpu_drains_the_node_and_no_acknowledgement_resumes_it_while_lost(
    tmp_path: Path, slurm: Slurm
) -> None:
    daemon = run_daemon(tmp_path, slurm)
    try:
        drained = wait_for(lambda: "DRAIN" in slurm.node()["State"] and time.time(), timeout=30)
        took = drained - lost_at(daemon)
        reason = slurm.node()["Reason"]
        assert reason.startswith("gpuwatch: gpu-lost"), reason
        assert "GPU 1" in reason
        assert took < 5.0, f"drained {took:.1f}s after the GPU was lost"
        wait_for(lambda: firing(daemon, "GpuwatchNodeDrained"))
        # The operator takes note of the XID; the GPU being lost is no note to take: it ends
        # when the GPU answers again, and the node stays out until then.
        state = str(tmp_path / "state")
        code, _, err = gpuwatch("ack", "1", "gpu-lost", "--state-dir", state)
        assert code != 0 and "cannot be acknowledged" in err, err
        ack(tmp_path, "xid-79")
        time.sleep(3)  # past resume_after
        assert "DRAIN" in slurm.node()["State"] and actions(daemon) == ["drain"]
        code, out, _ = gpuwatch("health", "--local", "--state-dir", state)
        assert code == 2 and out.startswith("unhealthy: GPU 1 is lost"), out
        assert daemon.json("/api/v1/gpus")["data"][1]["status"] == "lost"
    finally:
        assert stop_daemon(daemon) == 0, daemon.log() + slurm.log()


def test_a_node_an_admin_drained_stays_drained_when_the_gpu_comes_back(
    tmp_path: Path, slurm: Slurm
) -> None:
    slurm.drain(NODE, "admin: replacing a fan, OPS-12")
    daemon = run_daemon(tmp_path, slurm, COMES_BACK, speed=4)
    try:
        lost_at(daemon)
        wait_for(lambda: daemon.json("/api/v1/events?kind=gpu_recovered")["data"]["events"])
        wait_for(lambda: daemon.json("/api/v1/node")["data"]["verdict"] == "healthy")
        time.sleep(2)  # 8 s played: four times resume_after
        node = slurm.node()
        assert "DRAIN" in node["State"] and node["Reason"] == "admin: replacing a fan, OPS-12"
        assert actions(daemon) == []
        assert "not draining it" in daemon.log()
    finally:
        assert stop_daemon(daemon) == 0, daemon.log() + slurm.log()


def test_a_gpu_back_on_the_bus_resumes_the_node_it_drained(tmp_path: Path, slurm: Slurm) -> None:
    daemon = run_daemon(tmp_path, slurm, COMES_BACK, speed=4)
    try:
        wait_for(lambda: "DRAIN" in slurm.node()["State"], timeout=30)
        wait_for(lambda: "DRAIN" not in slurm.node()["State"], timeout=30)
        assert actions(daemon) == ["drain", "resume"]
    finally:
        assert stop_daemon(daemon) == 0, daemon.log() + slurm.log()


def test_the_breaker_holds_the_drain_once_the_partition_is_out(
    tmp_path: Path, slurm: Slurm
) -> None:
    # Another node's gpuwatch has drained one of the partition's four: a quarter is out.
    slurm.drain("gw2", "gpuwatch: xid-79 GPU 3: drain the node and reboot it")
    daemon = run_daemon(tmp_path, slurm, max_drained_fraction=0.25)
    try:
        lost_at(daemon)
        [held] = wait_for(lambda: firing(daemon, "GpuwatchActionsHeld"))
        assert (held["labels"]["why"], held["labels"]["partition"]) == ("fraction", "gpu")
        assert "DRAIN" not in slurm.node()["State"]
        assert actions(daemon) == ["held"]
    finally:
        assert stop_daemon(daemon) == 0, daemon.log() + slurm.log()


def test_a_dry_run_journals_what_it_would_do_and_changes_nothing(
    tmp_path: Path, slurm: Slurm
) -> None:
    daemon = run_daemon(tmp_path, slurm, dry_run=True)
    try:
        lost_at(daemon)
        wait_for(lambda: actions(daemon) == ["would_drain"])
        [alert] = wait_for(lambda: firing(daemon, "GpuwatchNodeDrained"))
        assert alert["labels"]["dry_run"] == "true"
        assert "DRAIN" not in slurm.node()["State"]
    finally:
        assert stop_daemon(daemon) == 0, daemon.log() + slurm.log()
