"""Clients that open connections and send nothing, streams that never read: the listener keeps
answering /metrics and /healthz, within the descriptors systemd gives it."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import SERVING, DaemonProcess, stop_daemon, wait_for

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "gpuwatch.service"
FD_LIMIT = 1024  # systemd's default soft limit, as the daemon had it before the unit set one


def start_with_fd_limit(tmp_path: Path, limit: int, *args: str) -> DaemonProcess:
    log_path = tmp_path / "daemon.log"
    with open(log_path, "wb") as log_file:
        # The limit is set in the process that then becomes the daemon (exec keeps it).
        trampoline = (
            "import os, resource, sys; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit})); "
            "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
        )
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                trampoline,
                "-m",
                "gpuwatch",
                "run",
                "--listen",
                "127.0.0.1:0",
                "--state-dir",
                str(tmp_path / "state"),
                "--simulate",
                "healthy",
                *args,
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    match = wait_for(lambda: SERVING.search(log_path.read_text()), timeout=30)
    scheme = "https" if "--web-config" in args else "http"
    return DaemonProcess(proc, f"{scheme}://{match.group(1)}:{match.group(2)}", log_path)


def open_idle(url: str, count: int) -> list[socket.socket]:
    host, port = url.split("://")[1].split(":")
    out = []
    for _ in range(count):
        s = socket.create_connection((host, int(port)), timeout=5)
        out.append(s)
    return out


def probe(url: str, context: ssl.SSLContext | None = None) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as r:
            return int(r.status)
    except OSError:
        return 0


@contextlib.contextmanager
def room_for_floods() -> Iterator[None]:
    """This process may hold the flood's connections (the daemon keeps its own limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@room_for_floods()
def test_1100_idle_connections_do_not_keep_probes_out(tmp_path: Path) -> None:
    daemon = start_with_fd_limit(tmp_path, FD_LIMIT)
    idle: list[socket.socket] = []
    try:
        limits = Path(f"/proc/{daemon.proc.pid}/limits").read_text()
        assert re.search(rf"Max open files\s+{FD_LIMIT}\s+{FD_LIMIT}", limits), limits
        idle = open_idle(daemon.url, 1100)
        answers = [probe(daemon.url + path) for path in ("/metrics", "/healthz") * 6]
        assert answers == [200] * 12, answers
        assert "connections open: closed the oldest" in daemon.log()
    finally:
        for s in idle:
            s.close()
        assert stop_daemon(daemon) == 0, daemon.log()


def test_a_connection_that_never_finishes_its_request_is_closed(tmp_path: Path) -> None:
    daemon = start_with_fd_limit(tmp_path, FD_LIMIT)
    try:
        (silent,) = open_idle(daemon.url, 1)
        (slow,) = open_idle(daemon.url, 1)
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        # The silent one is closed without a word; the slow one is told why (408), then closed.
        for s, said in ((silent, b""), (slow, b"HTTP/1.1 408 Request Timeout\r\n")):
            s.settimeout(30)
            started = time.monotonic()
            answer = b""
            while chunk := s.recv(1024):
                answer += chunk
            assert answer.startswith(said) and (said or answer == b""), answer
            assert time.monotonic() - started < 30
            s.close()
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def test_event_streams_are_capped_and_a_reader_that_left_frees_its_place(tmp_path: Path) -> None:
    daemon = start_with_fd_limit(tmp_path, FD_LIMIT)
    streams: list[socket.socket] = []
    try:
        host, port = daemon.url.removeprefix("http://").split(":")
        statuses = []
        for _ in range(200):
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(b"GET /api/v1/stream HTTP/1.1\r\nHost: x\r\n\r\n")
            head = s.recv(200)
            statuses.append(int(head.split()[1]))
            streams.append(s)
        assert statuses.count(200) == 64 and statuses.count(503) == 136, statuses
        assert probe(daemon.url + "/healthz") == 200
        for s in streams:
            s.close()
        streams = []

        # Once they have gone, a new reader gets a stream.
        def one_stream() -> bool:
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(b"GET /api/v1/stream HTTP/1.1\r\nHost: x\r\n\r\n")
                return b" 200 " in s.recv(200)

        wait_for(one_stream)

        # A HEAD says what a GET would begin with, and streams nothing.
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"HEAD /api/v1/stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\n"), answer
        assert b"text/event-stream" in answer and b"event:" not in answer
    finally:
        for s in streams:
            s.close()
        assert stop_daemon(daemon) == 0, daemon.log()


def test_the_unit_bounds_descriptors_memory_and_tasks() -> None:
    unit = UNIT.read_text()
    settings = dict(re.findall(r"^(LimitNOFILE|MemoryMax|MemoryHigh|TasksMax)=(\S+)$", unit, re.M))
    assert int(settings["LimitNOFILE"]) >= 4096  # 512 connections and the rest, with room
    assert settings["MemoryMax"] == "1G" and settings["MemoryHigh"] == "768M"
    assert int(settings["TasksMax"]) <= 512
