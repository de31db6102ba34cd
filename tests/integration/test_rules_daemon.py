"""Rules in the running daemon: the packs fire on simulated faults at once, alerts are served
in Prometheus's shapes, and a bad rule file on reload leaves the old rules running."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.conftest import DaemonProcess, parse_metrics, wait_for

RULE = """\
groups:
  - name: mine
    rules:
      - alert: AllGpusUp
        expr: count(gpuwatch_gpu_up == 1) == 8
        labels:
          severity: info
"""


def firing(daemon: DaemonProcess, name: str) -> list[dict[str, Any]]:
    alerts = daemon.json("/api/v1/alerts")["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]


def unix_post(path: Path, target: str) -> tuple[int, dict[str, Any]]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        sock.sendall(
            f"POST {target} HTTP/1.1\r\nHost: gpuwatch\r\nContent-Length: 0\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_a_gpu_falling_off_the_bus_fires_at_once(run_daemon: Any, tmp_path: Path) -> None:
    config = tmp_path / "gpuwatch.yaml"
    config.write_text("sampling:\n  interval: 5s\n")  # slow ticks: only the event can be this fast
    daemon = run_daemon("--simulate", "fall_off_bus", "-c", str(config))
    [alert] = wait_for(lambda: firing(daemon, "GpuFellOffBus"), timeout=30)
    assert alert["labels"] == {
        "alertname": "GpuFellOffBus",
        "gpu": "1",
        "severity": "critical",
        "uuid": alert["labels"]["uuid"],
    }
    assert alert["annotations"]["summary"] == "GPU 1 fell off the bus"
    assert alert["annotations"]["action"].startswith("Drain the node and reboot it.")
    xid_logged = re.search(r"ts=(\S+) level=warning .*XID 79 on GPU 1", daemon.log())
    assert xid_logged, daemon.log()
    event_at = datetime.fromisoformat(xid_logged.group(1).replace("Z", "+00:00"))
    active_at = datetime.fromisoformat(alert["activeAt"].replace("Z", "+00:00"))
    assert 0 <= (active_at - event_at).total_seconds() < 1.0

    # The API shows the alert as soon as the rules thread has evaluated it; its series reach
    # the store (and /metrics) when that evaluation is committed, back on the event loop.
    exported = wait_for(lambda: parse_metrics(daemon.metrics()).get("gpuwatch_alerts"), 5)
    assert [labels for labels, _ in exported] == [{**alert["labels"], "alertstate": "firing"}]
    groups = daemon.json("/api/v1/rules")["data"]["groups"]
    assert {g["name"]: g["interval"] for g in groups} == {
        "gpuwatch-hardware": 5.0,
        "gpuwatch-hardware-trends": 15.0,
        "gpuwatch-stragglers": 15.0,
        "gpuwatch-thermal-power": 5.0,
        "gpuwatch-training": 5.0,
        "gpuwatch-training-trends": 15.0,
        "gpuwatch-training-hourly": 60.0,
        "gpuwatch-training-links": 60.0,
        "gpuwatch-self": 5.0,
        "gpuwatch-actions": 5.0,
        "gpuwatch-host": 5.0,
        "gpuwatch-host-trends": 15.0,
    }  # fmt: skip (the default interval is the sampling interval, 5 s in this test)
    rules = [r for g in groups for r in g["rules"]]
    assert all(r["health"] == "ok" for r in rules), [r for r in rules if r["health"] != "ok"]
    [fell] = [r for r in rules if r["name"] == "GpuFellOffBus"]
    assert fell["state"] == "firing" and fell["type"] == "alerting"


def test_an_xid_alert_keeps_firing_after_the_event(run_daemon: Any) -> None:
    daemon = run_daemon("--simulate", "xid")  # XID 48 on GPU 1 at 10 s, once
    [alert] = wait_for(lambda: firing(daemon, "GpuXidCritical"), timeout=30)
    assert alert["labels"]["xid"] == "48" and alert["labels"]["gpu"] == "1"
    time.sleep(3)  # later cycles see the counter flat; the alert stays for 10 minutes
    assert firing(daemon, "GpuXidCritical") == [alert]
    assert "GpuXidCritical firing -> inactive" not in daemon.log()


def test_a_bad_rule_file_on_reload_keeps_the_old_rules(run_daemon: Any, tmp_path: Path) -> None:
    rules = tmp_path / "mine.yaml"
    rules.write_text(RULE)
    config = tmp_path / "gpuwatch.yaml"
    config.write_text(f"rules:\n  files: [{rules}]\n")
    daemon = run_daemon("--simulate", "healthy", "-c", str(config))
    wait_for(lambda: firing(daemon, "AllGpusUp"), timeout=20)
    sock = tmp_path / "d0" / "state" / "gpuwatch.sock"

    rules.write_text(RULE.replace("== 8", "== "))
    status, body = unix_post(sock, "/-/reload")
    assert status == 400
    assert body["error"].startswith(f'{rules}:5:15: group "mine" alert "AllGpusUp": expr: 1:'), (
        body["error"]
    )

    def evaluated_after(moment: str) -> bool:
        [group] = daemon.json("/api/v1/rules")["data"]["groups"]
        return bool(group["lastEvaluation"] > moment)

    [group] = daemon.json("/api/v1/rules")["data"]["groups"]
    wait_for(
        lambda: evaluated_after(group["lastEvaluation"]), timeout=20
    )  # the old rule still evaluates
    assert firing(daemon, "AllGpusUp")
    assert "gpuwatch_rules_last_reload_successful 0.0" in daemon.metrics()

    # Fixed, and reloaded by SIGHUP as systemd's ExecReload does.
    rules.write_text(RULE.replace("AllGpusUp", "EightGpusUp"))
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: firing(daemon, "EightGpusUp"), timeout=20)
    assert not firing(daemon, "AllGpusUp")
    assert "gpuwatch_rules_last_reload_successful 1.0" in daemon.metrics()


def test_a_bad_rule_file_at_startup_is_refused_with_file_and_line(tmp_path: Path) -> None:
    rules = tmp_path / "mine.yaml"
    rules.write_text(
        RULE.replace("expr: count(gpuwatch_gpu_up == 1) == 8", "expr: histogram_count(up)")
    )
    config = tmp_path / "gpuwatch.yaml"
    config.write_text(f"rules:\n  files: [{rules}]\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwatch",
            "run",
            "--simulate",
            "healthy",
            "-c",
            str(config),
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert (
        f'{rules}:5:15: group "mine" alert "AllGpusUp": expr: '
        "unsupported in gpuwatch's PromQL subset: function histogram_count()"
    ) in done.stderr


def test_an_overheating_gpu_pages_at_its_own_slowdown_temperature_before_it_switches_off(
    run_daemon: Any,
) -> None:
    """GPU 1 of the built-in scenario loses its cooling at 10 s and climbs to its shutdown
    temperature (95 °C, an H100's) in a minute: the page and the unhealthy verdict come when
    it reaches its slowdown temperature, 89 °C as NVML reports it, not when it falls off."""
    daemon = run_daemon("--simulate", "thermal_shutdown", "--speed", "5")

    def limits() -> dict[str, float] | None:
        metrics = parse_metrics(daemon.metrics())
        found = {
            name: value
            for name in ("slowdown", "shutdown", "max_operating")
            for labels, value in metrics.get(f"gpuwatch_gpu_{name}_temperature_celsius", [])
            if labels["gpu"] == "1"
        }
        return found if len(found) == 3 else None

    assert wait_for(limits, timeout=20) == {"slowdown": 89, "shutdown": 95, "max_operating": 87}
    seen: list[tuple[str, str, float]] = []  # (alert, GPU, value) or ("verdict", reason, 0)

    def fell() -> bool:
        alerts = daemon.json("/api/v1/alerts")["data"]["alerts"]
        firing = {a["labels"]["alertname"]: a for a in alerts if a["state"] == "firing"}
        node = daemon.json("/api/v1/node")["data"]
        for name in ("GpuTemperatureAtSlowdown", "GpuFellOffBus"):
            if name in firing and name not in [s[0] for s in seen]:
                seen.append((name, firing[name]["labels"]["gpu"], float(firing[name]["value"])))
        slowdown = [c for c in node["causes"] if c["key"] == "thermal-slowdown"]
        if node["verdict"] == "unhealthy" and slowdown and "verdict" not in [s[0] for s in seen]:
            seen.append(("verdict", slowdown[0]["reason"], 0.0))
        return "GpuFellOffBus" in firing

    wait_for(fell, timeout=60)
    order = [s[0] for s in seen]
    assert order.index("GpuTemperatureAtSlowdown") < order.index("GpuFellOffBus"), seen
    assert order.index("verdict") < order.index("GpuFellOffBus"), seen
    page = seen[order.index("GpuTemperatureAtSlowdown")]
    assert page[1] == "1" and 89 <= page[2] < 95, seen  # paged below its shutdown temperature
    assert seen[order.index("verdict")][1].startswith("GPU 1 is at "), seen
