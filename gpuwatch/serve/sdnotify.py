"""systemd's notify protocol (sd_notify(3)), for `Type=notify` with `WatchdogSec`: READY=1 once
the daemon samples and serves, WATCHDOG=1 only while its samples are current, RELOADING=1 and
READY=1 around a reload, STOPPING=1 on the way out. Without $NOTIFY_SOCKET every call is a no-op,
so the daemon runs the same outside systemd."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

from gpuwatch.text.units import ascii_int

log = logging.getLogger(__name__)


class SystemdNotifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        # "@name" is a socket in the abstract namespace: a leading NUL byte.
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_s: float | None = None
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        micros = ascii_int(usec)
        if micros is not None and micros > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = micros / 1e6
        self._failed = False

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *assignments: str) -> None:
        """One datagram of VAR=value lines. Never raises: systemd being away must not stop
        the daemon (it is logged once)."""
        if not self.address:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto("\n".join(assignments).encode(), self.address)
        except OSError as exc:
            if not self._failed:
                log.warning("cannot notify systemd on %s: %s", self.address, exc)
            self._failed = True

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def reloading(self) -> None:
        monotonic_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec}")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping")

    async def keep_watchdog(self, problem: Callable[[], str]) -> None:
        """Ping the watchdog at half its interval while `problem()` is empty (sampling is
        current). While it is not, say why in STATUS= and stop pinging: systemd restarts a
        daemon whose loop has wedged. Returns at once without a watchdog."""
        if self.watchdog_s is None or not self.address:
            return
        reported = ""
        while True:
            now = problem()
            if not now:
                self.send("WATCHDOG=1")
                if reported:
                    log.info("sampling is current again; watchdog pings resume")
                    self.send("STATUS=sampling")
            elif now != reported:
                log.error("not pinging the systemd watchdog: %s", now)
                self.send(f"STATUS=stalled: {now}")
            reported = now
            await asyncio.sleep(self.watchdog_s / 2)
