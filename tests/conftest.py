"""Shared fixtures: a real `gpuwatch run` process on a loopback port, and HTTP helpers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

import pynvml
import pytest
import uvloop
import yaml

from gpuwatch.clock import Clock, ManualClock
from gpuwatch.config import Config, load_config
from gpuwatch.push.jobs import JobInputs
from gpuwatch.serve.wiring import Wired, wire
from gpuwatch.sim.library import SimulatedNvml
from gpuwatch.sim.scenario import Scenario, load_scenario
from gpuwatch.store.tsdb import Store
from gpuwatch.text.units import parse_duration

SERVING = re.compile(r"gpuwatch serving on ([\d.]+):(\d+)")


@dataclass
class DaemonProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def get(
        self, path: str, headers: dict[str, str] | None = None, timeout: float = 5.0
    ) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def json(self, path: str) -> Any:
        status, _, body = self.get(path)
        assert status == 200, body
        return json.loads(body)

    def metrics(self) -> str:
        status, _, body = self.get("/metrics")
        assert status == 200
        return body.decode()

    def log(self) -> str:
        return self.log_path.read_text()


def gpuwatch(*args: str) -> tuple[int, str, str]:
    """Run the `gpuwatch` command line: (exit status, stdout, stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "gpuwatch", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


@contextlib.contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Python's own HTTP server on a loopback port, answering with `handler`: its base URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextlib.contextmanager
def silent_listener(path: str) -> Iterator[str]:
    """A loopback URL whose server takes connections and never says a byte."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}{path}"


def wait_for(check: Any, timeout: float = 30.0) -> Any:
    """Poll `check` every 0.1 s until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def delayed_scenario(tmp_path: Path, name: str, seconds: float = 10.0) -> str:
    """The built-in scenario `name` with its faults `seconds` later, as a file to run. At ten
    times real time a fault at 10 s comes 1 s of wall time after launch, and a busy machine
    can take longer than that to start the daemon; the simulated driver, as a real one, hands
    out no event for what happened before the daemon registered for events."""
    builtin = resources.files("gpuwatch.sim") / "scenarios" / f"{name}.yaml"
    doc = yaml.safe_load(builtin.read_text(encoding="utf-8"))
    for fault in doc["faults"]:
        at = parse_duration(str(fault["at"]))
        fault["at"] = f"{at + seconds if at > 0 else at:g}s"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return str(path)


def _own_group(wanted: bool) -> dict[str, Any]:
    """Popen's arguments for a process group of its own: process_group=0 from 3.11; on 3.10
    a session of its own, which is a group of its own too."""
    if not wanted:
        return {}
    return {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}


def start_daemon(
    tmp_path: Path,
    *args: str,
    timeout: float = 15.0,
    env: dict[str, str] | None = None,
    own_group: bool = False,
) -> DaemonProcess:
    """`gpuwatch run` on a free loopback port; with `own_group`, in a process group of its own
    (with its children), as a shell starts it in a terminal."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    log_path = tmp_path / "daemon.log"
    log_file = open(log_path, "wb")  # noqa: SIM115 (kept open for the process's lifetime)
    cmd = [
        sys.executable,
        "-m",
        "gpuwatch",
        "run",
        "--listen",
        "127.0.0.1:0",
        "--state-dir",
        str(tmp_path / "state"),
        *args,
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        **_own_group(own_group),
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = SERVING.search(log_path.read_text())
        if match:
            return DaemonProcess(proc, f"http://{match.group(1)}:{match.group(2)}", log_path)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"daemon did not start: {log_path.read_text()}")


def stop_daemon(daemon: DaemonProcess) -> int:
    daemon.proc.send_signal(signal.SIGTERM)
    try:
        return daemon.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        daemon.proc.kill()
        raise


Simulate = Callable[..., SimulatedNvml]


def pytest_report_header() -> str:
    import importlib.metadata

    import pynvml

    version = importlib.metadata.version("nvidia-ml-py")
    return f"nvidia-ml-py {version} ({pynvml.__file__})"


async def sampled(
    simulate: Simulate,
    scenario: str,
    config: Config,
    state: Path,
    cycles: int,
    *,
    start: float = 1_700_000_000.0,
    boot: str | None = None,
) -> Wired:
    """The node wired as `gpuwatch run` wires it (the machine's boot unless `boot` says), over
    a simulated scenario (a built-in's name or a file) on a manual clock from `start`, with
    `cycles` cycles sampled a second apart. Left running: the caller stops it."""
    clock = ManualClock(start)
    simulate(load_scenario(scenario), clock)
    wired = wire(config, pynvml, clock, state, 10040, boot_id=boot)
    await wired.daemon.source.start()
    for cycle in range(cycles):
        if cycle:
            clock.advance(1.0)
        await wired.daemon.sample_once()
    return wired


def node_config(directory: Path, more: str = "") -> tuple[Config, Path]:
    """The config of node n1 with a state directory of its own under `directory`, plus `more`
    (YAML lines), read from a file as `gpuwatch run -c` reads it; and the state directory."""
    state = directory / "state"
    state.mkdir()
    path = directory / "gpuwatch.yaml"
    path.write_text(f"node_name: n1\nstate_dir: {state}\n{more}")
    return load_config(path), state


@pytest.fixture
def simulate() -> Iterator[Simulate]:
    """Installs a simulated node's NVML library beneath the real pynvml (one at a time, as
    pynvml has one library); pynvml looks for the real one again after the test."""

    def install(
        scenario: Scenario, clock: Clock, kind: type[SimulatedNvml] = SimulatedNvml
    ) -> SimulatedNvml:
        library = kind(scenario, clock)
        library.install()
        return library

    yield install
    SimulatedNvml.uninstall()


@pytest.fixture
def run_daemon(tmp_path: Path) -> Iterator[Any]:
    started: list[DaemonProcess] = []

    def start(*args: str) -> DaemonProcess:
        daemon = start_daemon(tmp_path / f"d{len(started)}", *args)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        if daemon.proc.poll() is None:
            assert stop_daemon(daemon) == 0, daemon.log()


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Exposition text -> name -> [(labels, value)] (enough for our own well-formed output)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    line_re = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = line_re.match(line)
        assert match, f"unparseable line: {line}"
        labels = dict(label_re.findall(match.group(2) or ""))
        out.setdefault(match.group(1), []).append((labels, float(match.group(3))))
    return out


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The daemon's event loop (uvloop, as `gpuwatch run` and `gpuwatch demo` use) for every
    async test: its transports and timers differ from asyncio's own in what code may assume."""
    return {"uvloop": uvloop.new_event_loop}


def daemon_parts(config: Config) -> dict[str, Any]:
    """What a Daemon built alone, without wiring, is handed: its own store and job inputs."""
    return {
        "store": Store(config.store.retention),
        "jobs": JobInputs(config.push.limits, config.push.textfile_dir),
    }
