"""Training jobs: the simulated job reports through the real push path; each job fault raises
its alert in time, a healthy job raises none for 30 simulated minutes, and the GPUs show whose
job runs on them."""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.conftest import DaemonProcess, start_daemon, stop_daemon, wait_for

SPEED = 60  # a simulated minute a second
TRAINING_ALERTS = {
    "TrainingLossNaN",
    "TrainingStalled",
    "CollectiveHang",
    "GpuIdleWithMemory",
    "TrainingOutOfMemory",
    "GpuMemoryNearFull",
    "GpuStarved",
    "GpuNvlinkSaturated",
    "GpuPcieSaturated",
    "GpuPeerTrafficOverPcie",
}
FAULT_AT = 60.0  # every job scenario's fault, on GPU (rank) 1


def epoch(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def run(tmp_path: Path, scenario: str, speed: int = SPEED) -> DaemonProcess:
    config = tmp_path / "gpuwatch.yaml"
    # 12 cycles a second at 60 times real time; as many at a faster speed.
    config.write_text(f"sampling: {{interval: {5 * speed // SPEED}s}}\n")
    return start_daemon(tmp_path, "--simulate", scenario, "--speed", str(speed), "-c", str(config))


def firing(daemon: DaemonProcess) -> dict[str, dict[str, Any]]:
    alerts = daemon.json("/api/v1/alerts")["data"]["alerts"]
    return {a["labels"]["alertname"]: a for a in alerts if a["state"] == "firing"}


class Expect(NamedTuple):
    alert: str
    needs: float  # simulated seconds the rule's window needs to see the fault, plus its `for`
    labels: dict[str, str]
    speed: int = SPEED  # an hour's window is played faster


# Slack on top of `needs`: a report every 15 simulated seconds, trend groups every 15 s, and
# a loaded CI machine skipping cycles at 60x.
SLACK = 90.0
EXPECTED = {
    "nan_loss": Expect("TrainingLossNaN", 0.0, {"job": "llama", "rank": "1"}),
    "step_stall": Expect("TrainingStalled", 600.0, {"job": "llama", "rank": "1"}),  # changes[10m]
    "nccl_hang": Expect("CollectiveHang", 120.0 + 300.0, {"gpu": "1"}),  # rate[2m], for 5m
    "idle_with_memory": Expect("GpuIdleWithMemory", 900.0 + 300.0, {"gpu": "1"}),  # [15m], 5m
    "memory_pressure": Expect("GpuMemoryNearFull", 600.0, {"gpu": "1"}),  # for 10m
    "cuda_oom": Expect("TrainingOutOfMemory", 0.0, {"job": "llama", "rank": "1"}),
    # A job on the GPU an hour before, and an hour's average under half.
    "input_bound": Expect("GpuStarved", 3600.0, {"gpu": "1"}, speed=4 * SPEED),
    # A 5-minute rate (full after 4.5 minutes of the fault), then `for: 10m`, once a minute.
    "nvlink_saturated": Expect("GpuNvlinkSaturated", 960.0, {"gpu": "1"}, 2 * SPEED),
    # PCIe throughput read every 5 s in 20 ms windows: the same 5-minute mean, `for: 10m`.
    "p2p_disabled": Expect("GpuPeerTrafficOverPcie", 960.0, {"gpu": "1"}, 2 * SPEED),
}


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_each_job_fault_raises_its_alert_in_time(scenario: str, tmp_path: Path) -> None:
    expect = EXPECTED[scenario]
    launched = time.monotonic()
    daemon = run(tmp_path, scenario, expect.speed)
    starting = time.monotonic() - launched  # wall seconds until it served
    try:
        started = epoch(daemon.json("/api/v1/node")["data"]["started_at"])
        slack = SLACK * expect.speed / SPEED  # the same wall time of slack
        wall_budget = (FAULT_AT + expect.needs + slack) / expect.speed + 15
        alert = wait_for(lambda: firing(daemon).get(expect.alert), timeout=wall_budget)
        assert expect.labels.items() <= alert["labels"].items()
        events = daemon.json("/api/v1/events?kind=alert")["data"]["events"]
        [fired] = [e for e in events if e["alertname"] == expect.alert and e["state"] == "firing"]
        after_fault = epoch(fired["time"]) - (started + FAULT_AT)
        # The simulated node's time 0 comes before the daemon's started_at, by no more than the
        # daemon took to start: on a loaded machine, several simulated seconds at this speed.
        assert -starting * expect.speed <= after_fault <= expect.needs + slack, (
            after_fault,
            starting,
        )
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def test_nan_loss_fires_within_two_minutes_and_the_gpus_show_the_job(tmp_path: Path) -> None:
    daemon = run(tmp_path, "nan_loss")
    try:
        started = epoch(daemon.json("/api/v1/node")["data"]["started_at"])
        alert = wait_for(lambda: firing(daemon).get("TrainingLossNaN"), timeout=30)
        assert epoch(alert["activeAt"]) - started < 120
        assert alert["value"] == "NaN"
        gpus = daemon.json("/api/v1/gpus")["data"]
        assert len(gpus) == 8
        for gpu in gpus:
            [process] = gpu["processes"]
            assert (process["job_kind"], process["job_id"]) == ("slurm", "81234")
            assert process["name"].startswith("python") and process["gpu_memory_bytes"] > 1e9
            assert gpu["jobs"].startswith("Slurm job 81234 of ")
        metrics = daemon.metrics()
        # Rank 1 says it runs on GPU 1, which the job's process holds: the series names it.
        uuid = next(g["uuid"] for g in gpus if g["index"] == 1)
        series = f'train_loss{{exported_gpu="1",gpu="1",job="llama",rank="1",uuid="{uuid}"}} NaN'
        assert series in metrics
        assert 'gpuwatch_gpu_processes{gpu="1",' in metrics
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def test_a_healthy_job_raises_no_training_alert_in_30_simulated_minutes(tmp_path: Path) -> None:
    daemon = run(tmp_path, "healthy")
    try:
        seen: set[str] = set()
        deadline = time.monotonic() + 30 * 60 / SPEED + 2
        while time.monotonic() < deadline:
            alerts = daemon.json("/api/v1/alerts")["data"]["alerts"]
            seen |= {a["labels"]["alertname"] for a in alerts}  # pending counts too
            time.sleep(0.5)
        assert not seen & TRAINING_ALERTS, seen
        steps = [
            v
            for line in daemon.metrics().splitlines()
            if line.startswith("train_step{")
            for v in [float(line.rsplit(" ", 1)[1])]
        ]
        assert len(steps) == 8 and min(steps) > 2 * 60 * 25  # all ranks stepped all along
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def test_ctrl_c_stops_the_daemon_and_its_simulated_job_quietly(tmp_path: Path) -> None:
    """Ctrl-C in a terminal signals the whole process group, the simulated job too: the daemon
    stops it, and neither prints a traceback or calls the stop a failure."""
    daemon = start_daemon(tmp_path, "--simulate", "healthy", own_group=True)
    started = wait_for(lambda: re.search(r"simulated training job .* pid (\d+)", daemon.log()))
    job = int(started.group(1))
    wait_for(lambda: "train_step{" in daemon.metrics())  # the job is reporting
    os.killpg(daemon.proc.pid, signal.SIGINT)
    assert daemon.proc.wait(timeout=15) == 0
    log = daemon.log()
    assert "gpuwatch stopped" in log
    assert "Traceback" not in log and "exited with" not in log, log
    try:
        os.kill(job, 0)
    except ProcessLookupError:
        pass  # gone, and reaped
    else:
        raise AssertionError(f"the simulated job (pid {job}) outlived the daemon")
