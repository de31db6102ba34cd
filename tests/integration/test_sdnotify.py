"""The notify protocol against a real datagram socket: the watchdog is fed only while samples
are current, and a systemd that is not listening never stops the daemon."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from gpuwatch.serve.sdnotify import SystemdNotifier


def received(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


async def test_the_watchdog_is_fed_only_while_sampling_is_current(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(str(tmp_path / "notify"))
        systemd.setblocking(False)
        notifier = SystemdNotifier(
            {"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "100000"}
        )
        problem = ""
        task = asyncio.create_task(notifier.keep_watchdog(lambda: problem))
        await asyncio.sleep(0.22)  # pings every 50 ms
        healthy = received(systemd)
        problem = "last sample is 12.0s old (more than 3 intervals)"
        await asyncio.sleep(0.22)
        stalled = received(systemd)
        problem = ""
        await asyncio.sleep(0.12)
        resumed = received(systemd)
        task.cancel()
    assert len(healthy) >= 3 and set(healthy) == {"WATCHDOG=1"}
    assert stalled[-1:] == ["STATUS=stalled: last sample is 12.0s old (more than 3 intervals)"]
    assert "WATCHDOG=1" not in stalled[1:]  # at most the ping already on its way
    assert resumed[:2] == ["WATCHDOG=1", "STATUS=sampling"]


def test_an_abstract_socket_address_and_a_watchdog_meant_for_another_process() -> None:
    notifier = SystemdNotifier(
        {"NOTIFY_SOCKET": "@/org/freedesktop/systemd1/notify", "WATCHDOG_USEC": "30000000",
         "WATCHDOG_PID": "1"}
    )  # fmt: skip
    assert notifier.address == "\0/org/freedesktop/systemd1/notify"
    assert notifier.watchdog_s is None  # WATCHDOG_PID names another process


def test_nobody_listening_is_logged_once_and_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(tmp_path / "nobody")})
    notifier.ready("sampling")
    notifier.stopping()
    assert notifier.enabled
    assert [r.getMessage() for r in caplog.records].count(
        f"cannot notify systemd on {tmp_path / 'nobody'}: [Errno 2] No such file or directory"
    ) == 1
    assert SystemdNotifier({}).enabled is False
