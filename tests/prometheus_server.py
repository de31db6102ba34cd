"""A real Prometheus server for integration tests: scraping the jobs given, on a free port."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None and not os.environ.get("GPUWATCH_REQUIRE_TOOLS"),
    reason="prometheus not installed (Debian package 'prometheus')",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrometheusServer:
    proc: subprocess.Popen[bytes]
    port: int
    directory: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=5) as response:
            payload = json.load(response)
        assert payload["status"] == "success"
        return payload["data"]["result"]  # type: ignore[no-any-return]

    def rules(self) -> list[dict[str, Any]]:
        """Every rule loaded, with its health and last error (/api/v1/rules)."""
        with urllib.request.urlopen(f"{self.url}/api/v1/rules", timeout=5) as response:
            payload = json.load(response)
        return [rule for group in payload["data"]["groups"] for rule in group["rules"]]

    def log(self) -> str:
        return (self.directory / "prometheus.log").read_text()[-2000:]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


def start_prometheus(
    directory: Path, targets: list[str], job: str = "", rule_files: tuple[Path, ...] = ()
) -> PrometheusServer:
    """Prometheus scraping `targets` (host:port) every second, as job "gpuwatch"; `job` adds
    lines to that job's scrape config (indented by 4), e.g. TLS and basic auth."""
    config = directory / "prometheus.yml"
    listed = ", ".join(f"'{t}'" for t in targets)
    rules = ", ".join(f"'{r}'" for r in rule_files)
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{rules}]\n"
        "scrape_configs:\n  - job_name: gpuwatch\n"
        f"    static_configs: [{{targets: [{listed}]}}]\n{job}"
    )
    return launch_prometheus(directory, config)


def launch_prometheus(directory: Path, config: Path) -> PrometheusServer:
    """Prometheus with a config file of the caller's, its data and log in `directory`."""
    port = free_port()
    log = open(directory / "prometheus.log", "wb")  # noqa: SIM115 (kept open for the process)
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={directory / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return PrometheusServer(proc, port, directory)
