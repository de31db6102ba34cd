"""XID events end to end: the simulator's XID 48 becomes a journal entry with its meaning and
action, a counter, an alert; the journal keeps it through a SIGKILL; `gpuwatch events` shows it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuwatch.sim.kernel_log import XID_TEXT
from tests.conftest import gpuwatch, parse_metrics, start_daemon, stop_daemon, wait_for


def test_an_xid_is_journaled_counted_and_kept_through_a_kill(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--simulate", "xid")  # XID 48 on GPU 1 at 10 s
    try:

        def xids() -> list[dict[str, Any]]:
            events = daemon.json("/api/v1/events?since=1h")["data"]["events"]
            return [e for e in events if e["kind"] == "xid"]

        [event] = wait_for(xids)
        assert event["gpu"] == 1 and event["xid"] == 48
        assert event["class"] == "critical"
        assert event["meaning"] == "Double-bit ECC error"
        assert event["action"].startswith("Reset the GPU")
        # The driver hands the XID to NVML and prints it to the kernel log at once: the
        # first to arrive is journaled, the kernel log's with the driver's text.
        detail = f" ({XID_TEXT[48]})" if event.get("source", "nvml") == "kernel_log" else ""
        assert event["message"] == (
            f"XID 48 on GPU 1: Double-bit ECC error{detail}, running {event['job']}"
        )  # the simulated training job runs on every GPU
        assert event["job"].startswith("Slurm job 81234 of ")
        assert event["time"].endswith("Z") and "." in event["time"]
        # The counter is sampled with the cycle the XID triggers, a moment after the event.
        counted = wait_for(
            lambda: parse_metrics(daemon.metrics()).get("gpuwatch_gpu_xid_errors_total")
        )
        assert [(labels["gpu"], labels["xid"], value) for labels, value in counted] == [
            ("1", "48", 1.0)
        ]

        def alert_events() -> list[dict[str, Any]]:
            events = daemon.json("/api/v1/events?kind=alert")["data"]["events"]
            return [e for e in events if e["alertname"] == "GpuXidCritical"]

        [alerted] = wait_for(alert_events)
        assert alerted["state"] == "firing" and alerted["gpu"] == 1
        shown = daemon.json("/api/v1/events")["data"]["events"]
    finally:
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait(timeout=10)

    # Restarted on the same state directory: everything the API had shown is still there, and
    # so is this boot's XID: its count, its alert and the verdict carry over the restart.
    again = start_daemon(tmp_path, "--simulate", "healthy")
    try:
        kept = again.json("/api/v1/events?since=1h")["data"]["events"]
        assert kept[: len(shown)] == shown
        metrics = parse_metrics(again.metrics())
        assert [
            (labels["gpu"], labels["xid"], value)
            for labels, value in metrics["gpuwatch_gpu_xid_errors_total"]
        ] == [("1", "48", 1.0)]
        alerts = again.json("/api/v1/alerts")["data"]["alerts"]
        assert [(a["labels"]["alertname"], a["state"]) for a in alerts] == [
            ("GpuXidCritical", "firing")
        ]
        node = again.json("/api/v1/node")["data"]
        assert node["verdict"] == "unhealthy"
        assert [c["key"] for c in node["causes"]] == ["xid-48"]

        # The operator reset the GPU by hand and says so: the verdict counts it no longer.
        state_dir = str(tmp_path / "state")
        code, out, err = gpuwatch("ack", "1", "xid-49", "--state-dir", state_dir)
        assert code == 1 and "GPU 1 has no current cause 'xid-49'; its causes: xid-48" in err
        code, out, err = gpuwatch(
            "ack", "1", "xid-48", "--state-dir", state_dir, "--note", "reset by hand, OPS-12"
        )
        assert code == 0, err
        assert out.startswith("acknowledged: GPU 1: XID 48 (Double-bit ECC error) at ")
        node = wait_for(
            lambda: (n := again.json("/api/v1/node")["data"])["verdict"] == "healthy" and n
        )
        assert [c["key"] for c in node["acknowledged"]] == ["xid-48"]
        acked = again.json("/api/v1/events?kind=acknowledged")["data"]["events"]
        assert acked[0]["cause"] == "xid-48" and acked[0]["note"] == "reset by hand, OPS-12"
        done = subprocess.run(
            [sys.executable, "-m", "gpuwatch", "events", again.url, "--since", "1h"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "XID 48 on GPU 1: Double-bit ECC error" in done.stdout
        assert "GpuXidCritical firing" in done.stdout
        status, _, body = again.get("/api/v1/events?since=yesterday")
        assert status == 400 and b"expected a duration" in body
    finally:
        assert stop_daemon(again) == 0, again.log()


def test_gpuwatch_xid_explains_a_code() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "xid", "79"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout.splitlines() == [
        "XID 79: GPU has fallen off the bus",
        "class:  critical",
        "action: Drain the node and reboot it; reseat or RMA the GPU if it does not come back.",
    ]
    unknown = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "xid", "999"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert unknown.returncode == 1
    assert "XID 999: Unknown to gpuwatch's XID catalog" in unknown.stdout


def health(url: str, *flags: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "health", *flags, url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.returncode, done.stdout.strip()


def test_gpuwatch_health_exit_status_follows_the_verdict(tmp_path: Path) -> None:
    healthy = start_daemon(tmp_path / "healthy", "--simulate", "healthy")
    lost = start_daemon(
        tmp_path / "lost", "--simulate", "fall_off_bus", "--speed", "5"
    )  # GPU 1 at 2 s
    try:
        assert health(healthy.url) == (0, "healthy: 8 GPUs, nothing wrong")
        # As operators type it: host:port, no scheme.
        bare = healthy.url.removeprefix("http://")
        assert health(bare) == (0, "healthy: 8 GPUs, nothing wrong")
        _, line = wait_for(lambda: (r := health(lost.url))[0] == 2 and r)
        assert line.startswith("unhealthy: GPU 1 is lost: NVML: GPU is lost")
        # node-problem-detector's terms: 0 OK, 1 NonOK, 2 Unknown; the same line.
        assert health(healthy.url, "--npd") == (0, "healthy: 8 GPUs, nothing wrong")
        assert health(lost.url, "--npd") == (1, line)
        # Whether the daemon itself works, on its control socket: a sick GPU does not count.
        assert health("", "--alive", "--state-dir", str(tmp_path / "lost" / "state")) == (
            0,
            "alive: sampling is current",
        )
    finally:
        assert stop_daemon(healthy) == 0
        assert stop_daemon(lost) == 0
    code, line = health(healthy.url)  # stopped: nobody answers
    assert code == 3 and line.startswith(f"unreachable: {healthy.url}")
    # An address that is none is the caller's mistake, not a daemon down: 64, not 3.
    done = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "health", "node 7:x"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 64
    assert "'node 7:x' is not a daemon's address: expected HOST, HOST:PORT" in done.stderr
    assert health(healthy.url, "--npd")[0] == 2
    code, line = health("", "--alive", "--state-dir", str(tmp_path / "lost" / "state"))
    assert code == 3 and line.startswith("unreachable: cannot reach the daemon on")
