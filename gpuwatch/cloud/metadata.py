"""Asking the cloud's metadata service for notices every `interval` (AWS asks for every 5
seconds), in a task of its own: a slow or absent service never holds a sampling cycle, which
reads what the last answer said.

Each notice is a series, `gpuwatch_node_preemption_seconds_left{provider, event}`, the
seconds until the VM goes, for as long as the provider says so; the first answer with a new
notice is also an event (`preemption`), which the daemon evaluates its rules for at once.
`gpuwatch_cloud_metadata_up{provider}` says whether the last ask was answered as documented.
Answers are bounded (MAX_BODY_BYTES, REQUEST_TIMEOUT_S) and a bad one is logged once a run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpuwatch import metrics as m
from gpuwatch.clock import Clock
from gpuwatch.cloud.notices import (
    Notice,
    NoticeError,
    aws_instance_action,
    azure_notices,
    gcp_notices,
)
from gpuwatch.compat import TIMEOUT_ERRORS
from gpuwatch.model import Event, Sample
from gpuwatch.text.timefmt import rfc3339
from gpuwatch.web.fetch import fetch

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
REQUEST_TIMEOUT_S = 2.0
AWS_TOKEN_TTL_S = 21600  # IMDSv2's longest; asked again at half of it, or on a 401
AZURE_API = "2020-07-01"
LATEST = 253402300799.0  # 9999-12-31T23:59:59Z: a notice for later than that is no notice
TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=_-.")


class MetadataError(Exception):
    pass


# What an ask can fail with: the service's answer, the connection, the time.
FAILURES: tuple[type[Exception], ...] = (
    MetadataError,
    NoticeError,
    OSError,  # no connection, or none kept (TimeoutError is one)
    ValueError,  # an answer that is not HTTP
    *TIMEOUT_ERRORS,
)


class CloudNotices:
    """A Watcher: started with the daemon's watchers, read every cycle."""

    name = "cloud"

    def __init__(
        self,
        provider: str,
        address: str,
        interval: float,
        clock: Clock,
        publish: Callable[[Event], None],
    ) -> None:
        self.provider = provider
        self.address = address.rstrip("/")
        self.interval = interval
        self._clock = clock
        self._publish = publish
        self.notices: dict[tuple[str, str], Notice] = {}
        self.up = False
        self._failing = ""  # the error of a run of failed asks, logged at its start
        self._first_seen: dict[str, float] = {}  # GCP: when each notice was first read
        self._token: tuple[str, float] | None = None  # AWS: (token, when to renew it)
        self._vm_name: str | None = None  # Azure: the VM's own name, asked once
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.open()
        self._task = asyncio.create_task(self._loop(), name="cloud-notices")
        log.info("asking %s's metadata service at %s for notices", self.provider, self.address)

    async def open(self) -> None:
        """Ready for `poll` (start runs polls on its own; a test calls them). Each ask is a
        connection of its own: nothing to open."""

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])  # its end, whatever it ended with

    async def read(self) -> list[Sample]:
        now = self._clock.now()
        out = [Sample(m.CLOUD_METADATA_UP, (("provider", self.provider),), float(self.up))]
        for notice in self.notices.values():
            labels = (("provider", notice.provider), ("event", notice.event))
            out.append(Sample(m.PREEMPTION_SECONDS_LEFT, labels, max(0.0, notice.at - now)))
        return out

    async def _loop(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception:  # a bug, or an answer nobody foresaw: the next ask still goes
                log.exception("%s metadata service: ask failed", self.provider)
                self.up = False
            await self._clock.sleep(self.interval)

    async def poll(self) -> None:
        """One ask: the notices as the service now says them, or, when it does not answer as
        documented, the last ones kept (a notice does not end because an ask failed)."""
        try:
            found = [n for n in await self._ask() if n.at <= LATEST]
        except FAILURES as exc:
            why = str(exc) or type(exc).__name__
            if why != self._failing:
                log.warning("%s metadata service %s: %s", self.provider, self.address, why)
            self._failing, self.up = why, False
            return
        if self._failing:
            log.info("%s metadata service %s answers again", self.provider, self.address)
        self._failing, self.up = "", True
        now = self._clock.now()
        current = {n.key: n for n in found}
        for key, notice in current.items():
            if key not in self.notices:
                self._announce(notice, now)
        self.notices = current

    def _announce(self, notice: Notice, now: float) -> None:
        left = max(0.0, notice.at - now)
        message = (
            f"{notice.provider} notice: {notice.event}, the VM goes at {rfc3339(notice.at)} "
            f"(in {left:.0f} s)" + (f": {notice.detail}" if notice.detail else "")
        )
        log.warning("%s", message)
        data: dict[str, int | float | str] = {
            "provider": notice.provider,
            "event": notice.event,
            "at": rfc3339(notice.at) or "",
        }
        self._publish(Event(now, "preemption", None, None, message, data))

    async def _ask(self) -> list[Notice]:
        if self.provider == "aws":
            return await self._aws()
        if self.provider == "gcp":
            return await self._gcp()
        return await self._azure()

    async def _aws(self) -> list[Notice]:
        now = self._clock.now()
        if self._token is None or now >= self._token[1]:
            ttl = {"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)}
            status, body = await self._get("/latest/api/token", ttl, method="PUT")
            if status != 200:
                raise MetadataError(f"PUT /latest/api/token: HTTP {status}")
            token = body.decode("ascii", "replace").strip()
            if not token or len(token) > 512 or not TOKEN_CHARS.issuperset(token):
                raise MetadataError("PUT /latest/api/token: not a token")
            self._token = (token, now + AWS_TOKEN_TTL_S / 2)
        headers = {"X-aws-ec2-metadata-token": self._token[0]}
        status, body = await self._get("/latest/meta-data/spot/instance-action", headers)
        if status == 401:  # the token expired early (an instance restarted): ask again
            self._token = None
            raise MetadataError("spot/instance-action: HTTP 401, token refused")
        if status == 404:
            return []
        if status != 200:
            raise MetadataError(f"spot/instance-action: HTTP {status}")
        return [aws_instance_action(body)]

    async def _gcp(self) -> list[Notice]:
        flavor = {"Metadata-Flavor": "Google"}
        values = []
        for name in ("preempted", "maintenance-event"):
            status, body = await self._get(f"/computeMetadata/v1/instance/{name}", flavor)
            if status != 200:
                raise MetadataError(f"instance/{name}: HTTP {status}")
            values.append(body.decode("ascii", "replace"))
        now = self._clock.now()
        seen = self._first_seen
        # When each notice was first read: the provider gives no time, only its notice period.
        seen.setdefault("preempted", now)
        seen.setdefault("terminate_on_host_maintenance", now)
        found = gcp_notices(values[0], values[1], seen)
        kept = {n.event for n in found}
        for event in list(seen):
            if event not in kept:
                del seen[event]
        return found

    async def _azure(self) -> list[Notice]:
        headers = {"Metadata": "true"}
        if self._vm_name is None:
            path = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
            status, body = await self._get(path, headers)
            if status != 200:
                raise MetadataError(f"instance/compute/name: HTTP {status}")
            self._vm_name = body.decode("utf-8", "replace").strip()[:128]
        path = f"/metadata/scheduledevents?api-version={AZURE_API}"
        status, body = await self._get(path, headers)
        if status != 200:
            raise MetadataError(f"scheduledevents: HTTP {status}")
        return azure_notices(body, self._vm_name, self._clock.now())

    async def _get(
        self, path: str, headers: dict[str, str], method: str = "GET"
    ) -> tuple[int, bytes]:
        # No proxy, never a redirect followed: the service is the link-local address itself.
        try:
            answer = await fetch(
                method,
                self.address + path,
                headers=headers,
                timeout=REQUEST_TIMEOUT_S,
                lane="sources",
                max_body=MAX_BODY_BYTES,
                follow_redirects=False,
            )
        except ValueError as exc:  # not HTTP, or over the limit
            raise MetadataError(f"{path}: {exc}") from None
        # GCP's server says it is one; anything else at that address is not to be believed.
        if self.provider == "gcp" and answer.headers.get("metadata-flavor") != "Google":
            raise MetadataError(f"{path}: no Metadata-Flavor: Google in the answer")
        return answer.status, answer.body
