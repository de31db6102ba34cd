"""Running under systemd: the unit file as systemd-analyze judges it, and the daemon speaking
the notify protocol to a real datagram socket standing in for systemd's ($NOTIFY_SOCKET)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import start_daemon, stop_daemon, wait_for

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "gpuwatch.service"

needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None and not os.environ.get("GPUWATCH_REQUIRE_TOOLS"),
    reason="systemd-analyze not installed (Debian package 'systemd')",
)


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def systemd_analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", *args], capture_output=True, text=True, timeout=60, check=False
    )


@needs_systemd_analyze
def test_the_unit_scores_at_most_2_in_systemd_analyze_security() -> None:
    result = systemd_analyze("security", "--offline=yes", str(UNIT))
    match = re.search(r"Overall exposure level for gpuwatch.service: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= 2.0, result.stdout
    settings = unit_settings()
    assert settings["Type"] == ["notify"] and settings["WatchdogSec"]
    assert settings["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert "char-nvidia-frontend rw" in settings["DeviceAllow"]
    # The kernel log, read-only, with the one capability a dmesg_restrict=1 kernel asks for.
    assert "/dev/kmsg r" in settings["DeviceAllow"]
    assert settings["AmbientCapabilities"] == ["CAP_SYSLOG"]
    assert settings["CapabilityBoundingSet"] == ["CAP_SYSLOG"]


@needs_systemd_analyze
def test_the_unit_as_installed_runs_gpuwatch_from_the_prefix_and_verifies_clean(
    tmp_path: Path,
) -> None:
    """`make install` writes the unit with its PREFIX and CONFDIR; here PREFIX is this
    checkout's virtualenv, so the gpuwatch that ExecStart names exists for systemd to check."""
    prefix = Path(sys.executable).parent.parent
    made = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-s",
            "systemd-unit",
            f"PREFIX={prefix}",
            f"CONFDIR={tmp_path / 'etc'}",
            f"UNITDIR={tmp_path / 'units'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    unit = tmp_path / "units" / "gpuwatch.service"
    [exec_start] = [line for line in unit.read_text().splitlines() if line.startswith("ExecStart=")]
    assert exec_start.startswith(f"ExecStart={prefix}/bin/gpuwatch run ")
    assert f"--config {tmp_path / 'etc'}/gpuwatch.yaml " in exec_start
    # The docs `make install` puts under PREFIX, not a web page that may not be reachable.
    documentation = f"Documentation=file://{prefix}/share/doc/gpuwatch/install.md"
    assert documentation in unit.read_text().splitlines()
    # Everything else is the unit as shipped.
    moved = ("ExecStart=", "Documentation=")
    shipped = [line for line in UNIT.read_text().splitlines() if not line.startswith(moved)]
    written = unit.read_text().splitlines()
    assert [line for line in written if line not in (exec_start, documentation)] == shipped
    result = systemd_analyze("verify", "--man=no", str(unit))
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


class FakeSystemd:
    """The receiving end of $NOTIFY_SOCKET."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.heard: list[dict[str, str]] = []

    def listen(self, seconds: float) -> list[dict[str, str]]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(4096).decode()
            except TimeoutError:
                continue
            self.heard.append(dict(line.split("=", 1) for line in data.splitlines()))
        return self.heard

    def until(self, key: str, value: str, seconds: float = 15.0) -> dict[str, str]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for message in self.heard:
                if message.get(key) == value:
                    self.heard.remove(message)
                    return message
            self.listen(0.2)
        raise AssertionError(f"systemd never heard {key}={value}: {self.heard}")

    def close(self) -> None:
        self.sock.close()


def test_ready_watchdog_reload_and_stopping_reach_systemd(tmp_path: Path) -> None:
    systemd = FakeSystemd(tmp_path / "notify.sock")
    env = {"NOTIFY_SOCKET": str(systemd.path), "WATCHDOG_USEC": "1000000"}
    daemon = start_daemon(tmp_path / "d", "--simulate", "healthy", env=env)
    try:
        ready = systemd.until("READY", "1")
        assert re.match(r"sampling 8 GPUs every 1s; serving on port \d+", ready["STATUS"])
        assert daemon.get("/healthz")[0] == 200  # ready meant sampling and serving
        systemd.heard.clear()
        pings = [m for m in systemd.listen(2.2) if m.get("WATCHDOG") == "1"]
        assert 3 <= len(pings) <= 6  # every half watchdog interval
        daemon.proc.send_signal(signal.SIGHUP)
        reloading = systemd.until("RELOADING", "1")
        assert int(reloading["MONOTONIC_USEC"]) > 0
        systemd.until("READY", "1")
        assert "reloaded" in daemon.log()
    finally:
        assert stop_daemon(daemon) == 0
    systemd.until("STOPPING", "1", seconds=2)
    systemd.close()


def test_sigterm_stops_within_10_s_with_nvml_hung_and_a_stream_open(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--simulate", "nvml_hang", "--speed", "10")
    stream = urllib.request.urlopen(daemon.url + "/api/v1/stream", timeout=30)
    try:
        wait_for(lambda: "unresponsive" in json.dumps(daemon.json("/api/v1/gpus")), timeout=20)
        started = time.monotonic()
        assert stop_daemon(daemon) == 0
        took = time.monotonic() - started
    finally:
        stream.close()
    assert took < 10
    log = daemon.log()
    assert "gpuwatch stopped" in log and "not stopped cleanly" not in log
