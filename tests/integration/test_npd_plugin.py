"""The node-problem-detector plugin in deploy/kubernetes, run as NPD runs a custom plugin
(pkg/custompluginmonitor/plugin/plugin.go): the rule's path and args, killed past the rule's
timeout, stdout trimmed and cut to max_output_length, exit 0 OK, 1 NonOK, anything else
Unknown; in an environment like NPD's image (bash, coreutils, nothing of gpuwatch's), against
a daemon whose GPU falls off the bus, and after the daemon stops."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import start_daemon, stop_daemon, wait_for

NPD = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "npd-gpuwatch.yaml"
SCENARIO = """\
name: fall-off
node: {gpus: 2, model: H100, workload: training, seed: 1}
faults:
  - {kind: fall_off_bus, gpu: 1, at: 12s}
"""
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")


def _seconds(text: str) -> float:
    assert text.endswith("s")
    return float(text[:-1])


class Npd:
    """The plugin as NPD calls it, from the shipped ConfigMap."""

    def __init__(self, directory: Path) -> None:
        data = yaml.safe_load(NPD.read_text())["data"]
        self.config: dict[str, Any] = json.loads(data["gpuwatch.json"])
        [self.rule] = self.config["rules"]
        self.script = directory / "gpuwatch-verdict.sh"  # the ConfigMap, mounted 0755
        self.script.write_text(data["gpuwatch-verdict.sh"])
        self.script.chmod(0o755)

    def run(self, verdict_file: Path) -> tuple[str, str]:
        """(status, message) as NPD records them; the rule's first arg, the hostPath
        file, is this test's daemon's."""
        plugin = self.config["pluginConfig"]
        timeout = min(_seconds(self.rule["timeout"]), _seconds(plugin["timeout"]))
        args = [str(verdict_file), *self.rule["args"][1:]]
        try:
            done = subprocess.run(
                [str(self.script), *args],
                capture_output=True,
                timeout=timeout,
                check=False,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},  # NPD's image's, and no more
            )
        except subprocess.TimeoutExpired:
            return "Unknown", "timeout"
        output = done.stdout.decode().strip()[: plugin["max_output_length"]]
        status = {0: "OK", 1: "NonOK"}.get(done.returncode, "Unknown")
        return status, output


def test_the_condition_follows_the_verdict_and_goes_unknown_without_gpuwatch(
    tmp_path: Path,
) -> None:
    npd = Npd(tmp_path)
    verdict = tmp_path / "d" / "state" / "verdict"
    assert npd.run(verdict) == (
        "Unknown",
        f"gpuwatch: no verdict at {verdict} (is gpuwatch running on this node?)",
    )
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO)
    daemon = start_daemon(tmp_path / "d", "--simulate", str(scenario))
    try:
        assert wait_for(lambda: npd.run(verdict)) == ("OK", "healthy: 2 GPUs, nothing wrong")
        status, message = wait_for(lambda: (r := npd.run(verdict))[0] == "NonOK" and r)
        assert message.startswith("unhealthy: GPU 1 is lost"), message
        assert len(message) <= npd.config["pluginConfig"]["max_output_length"]
        # The daemon renews the file while it samples, though the verdict stays the same.
        before = verdict.stat().st_mtime
        wait_for(lambda: verdict.stat().st_mtime > before, timeout=20)
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
    # Stopped: the last verdict stays on disk, and NPD reads it as unknown once it is older
    # than the rule's limit (set back here rather than waited for).
    assert npd.run(verdict)[0] == "NonOK"
    old = time.time() - int(npd.rule["args"][1]) - 5
    os.utime(verdict, (old, old))
    status, message = npd.run(verdict)
    assert status == "Unknown" and message.startswith("gpuwatch: its verdict was last renewed")
