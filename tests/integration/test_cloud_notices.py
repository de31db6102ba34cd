"""Cloud notices, asked of a metadata server on 127.0.0.1 that speaks each provider's protocol
as its documentation gives it, and refuses what the real one refuses: AWS's IMDSv2 (a token
from a PUT, then `spot/instance-action` with it; 401 without), GCP's (`Metadata-Flavor: Google`
both ways; 403 without), Azure's Scheduled Events (`Metadata: true`; 400 without)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.clock import ManualClock
from gpuwatch.cloud.metadata import CloudNotices
from gpuwatch.cloud.notices import Notice
from gpuwatch.model import Event
from tests.conftest import start_daemon, stop_daemon, wait_for

NOW = 1_800_000_000.0
AWS_ACTION = {"action": "terminate", "time": "2027-01-15T08:02:00Z"}  # NOW + 120 s
AZURE_EVENT = {
    "EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
    "EventType": "Preempt",
    "ResourceType": "VirtualMachine",
    "Resources": ["gpu-vm-7"],
    "EventStatus": "Scheduled",
    "NotBefore": "Fri, 15 Jan 2027 08:00:30 GMT",
    "Description": "",
    "EventSource": "Platform",
    "DurationInSeconds": -1,
}


class Metadata(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.notice = False  # whether the provider now gives notice
        self.hostile = ""  # an answer no real service gives: crlf-token, far-future, pieces
        self.asked: list[str] = []
        self.tokens = {"tok-2f9c"}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Metadata

    def log_message(self, *_: Any) -> None:
        pass

    def do_PUT(self) -> None:
        self.server.asked.append(f"PUT {self.path}")
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        if self.path != "/latest/api/token" or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
            return self.answer(400, b"")
        self.answer(
            200,
            b"tok-2f9c\r\nX-Injected: 1" if self.server.hostile == "crlf-token" else b"tok-2f9c",
        )

    def do_GET(self) -> None:
        self.server.asked.append(f"GET {self.path}")
        notice = self.server.notice
        if self.path.startswith("/latest/"):
            if self.headers.get("X-aws-ec2-metadata-token") not in self.server.tokens:
                return self.answer(401, b"")
            if self.path == "/latest/meta-data/spot/instance-action" and notice:
                action = dict(AWS_ACTION)
                if self.server.hostile == "far-future":
                    action["time"] = "9999-12-31T23:59:59-23:59"  # after year 9999 in UTC
                body = json.dumps(action).encode()
                if self.server.hostile == "pieces":  # two writes, apart
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[:10])
                    self.wfile.flush()
                    time.sleep(0.1)
                    self.wfile.write(body[10:])
                    return None
                return self.answer(200, body)
            return self.answer(404, b"Not Found")
        if self.path.startswith("/computeMetadata/v1/instance/"):
            if self.headers.get("Metadata-Flavor") != "Google":
                return self.answer(403, b"Missing Metadata-Flavor:Google header.")
            name = self.path.rsplit("/", 1)[1]
            values = {"preempted": "TRUE" if notice else "FALSE", "maintenance-event": "NONE"}
            return self.answer(200, values[name].encode(), {"Metadata-Flavor": "Google"})
        if self.path.startswith("/metadata/"):
            if self.headers.get("Metadata") != "true":
                body = b'{"error": "Bad request. Required metadata header not specified"}'
                return self.answer(400, body)
            if self.path.startswith("/metadata/instance/compute/name?"):
                return self.answer(200, b"gpu-vm-7")
            if self.path == "/metadata/scheduledevents?api-version=2020-07-01":
                events = [AZURE_EVENT] if notice else []
                doc = {"DocumentIncarnation": 1 + notice, "Events": events}
                return self.answer(200, json.dumps(doc).encode())
        self.answer(404, b"")

    def answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def metadata() -> Iterator[Metadata]:
    server = Metadata()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("provider", "event", "left"),
    [("aws", "terminate", 120.0), ("gcp", "preempted", 30.0), ("azure", "preempt", 30.0)],
)
async def test_each_providers_notice_is_a_series_and_one_event(
    metadata: Metadata, provider: str, event: str, left: float
) -> None:
    clock = ManualClock(NOW)
    published: list[Event] = []
    notices = CloudNotices(provider, metadata.url, 5.0, clock, published.append)
    await notices.open()
    try:
        await notices.poll()
        assert notices.up and notices.notices == {}
        metadata.notice = True
        await notices.poll()
        await notices.poll()  # still there: no second event
        [announced] = published
        assert announced.kind == "preemption" and announced.data["event"] == event
        samples = {(s.name, s.labels): s.value for s in await notices.read()}
        key = ("gpuwatch_node_preemption_seconds_left", (("provider", provider), ("event", event)))
        assert samples[key] == left
        assert samples["gpuwatch_cloud_metadata_up", (("provider", provider),)] == 1.0
        clock.advance(10)
        assert {s.name: s.value for s in await notices.read()}[key[0]] == left - 10
        metadata.notice = False
        await notices.poll()
        assert notices.notices == {}
    finally:
        await notices.stop()
    # Each asked as its provider requires (the server refuses anything else).
    if provider == "aws":
        assert metadata.asked[0] == "PUT /latest/api/token"
        assert metadata.asked.count("PUT /latest/api/token") == 1  # the token is kept


async def test_a_service_that_does_not_answer_as_documented_keeps_the_notice(
    metadata: Metadata,
) -> None:
    clock = ManualClock(NOW)
    published: list[Event] = []
    notices = CloudNotices("aws", metadata.url, 5.0, clock, published.append)
    await notices.open()
    try:
        metadata.notice = True
        await notices.poll()
        metadata.tokens = set()  # tokens refused from now on
        await notices.poll()
        assert not notices.up and list(notices.notices) == [("aws", "terminate")]
        samples = {s.name: s.value for s in await notices.read()}
        assert samples["gpuwatch_cloud_metadata_up"] == 0.0
        gone = CloudNotices("gcp", "http://127.0.0.1:9", 5.0, clock, published.append)
        await gone.open()
        await gone.poll()  # nothing listens there
        assert not gone.up and gone.notices == {}
        await gone.stop()
        # Not GCP's metadata server: an answer without Metadata-Flavor: Google is not believed.
        impostor = CloudNotices("gcp", metadata.url + "/latest", 5.0, clock, published.append)
        await impostor.open()
        await impostor.poll()
        assert not impostor.up
        await impostor.stop()
    finally:
        await notices.stop()
    assert len(published) == 1


@pytest.mark.parametrize(("hostile", "up", "noticed"), [
    ("crlf-token", False, False),  # a header injected through the token: refused
    ("far-future", True, False),  # a time after year 9999: no notice, and no crash
    ("pieces", True, True),  # a body in two writes is read whole
])  # fmt: skip
async def test_answers_no_real_service_gives_neither_crash_nor_fool_it(
    metadata: Metadata, hostile: str, up: bool, noticed: bool
) -> None:
    metadata.hostile, metadata.notice = hostile, True
    notices = CloudNotices("aws", metadata.url, 5.0, ManualClock(NOW), lambda _: None)
    await notices.open()
    try:
        await notices.poll()
        assert (notices.up, bool(notices.notices)) == (up, noticed)
    finally:
        await notices.stop()


async def test_the_polling_task_survives_what_it_did_not_foresee(metadata: Metadata) -> None:
    clock = ManualClock(NOW)
    notices = CloudNotices("aws", metadata.url, 5.0, clock, lambda _: None)

    async def broken() -> list[Notice]:
        raise RuntimeError("a bug")

    notices._ask = broken  # type: ignore[method-assign]
    await notices.start()
    for _ in range(20):  # the first ask, on the loop
        await asyncio.sleep(0)
    assert notices._task is not None and not notices._task.done()
    await notices.stop()  # and its end takes nothing down with it


def test_the_daemon_pages_and_judges_the_node_on_a_notice(
    metadata: Metadata, tmp_path: Path
) -> None:
    config = tmp_path / "gpuwatch.yaml"
    config.write_text(
        f"sources: {{cloud: {{provider: aws, address: '{metadata.url}', interval: 1s}}}}\n"
    )
    daemon = start_daemon(tmp_path, "--simulate", "healthy", "-c", str(config))
    try:
        node = daemon.json("/api/v1/node")["data"]
        assert node["verdict"] == "healthy"
        metadata.notice = True

        def preempted() -> dict[str, Any] | None:
            found = daemon.json("/api/v1/node")["data"]
            return found if any(c["key"] == "preemption" for c in found["causes"]) else None

        node = wait_for(preempted, timeout=20)
        assert node["verdict"] == "unhealthy"
        [cause] = [c for c in node["causes"] if c["key"] == "preemption"]
        assert cause["reason"].startswith("The cloud takes this node away in ")
        assert cause["reason"].endswith("(aws: terminate)")
        events = daemon.json("/api/v1/events?kind=preemption")["data"]["events"]
        assert [e["event"] for e in events] == ["terminate"]
        assert "gpuwatch_node_preemption_seconds_left{" in daemon.metrics()
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
