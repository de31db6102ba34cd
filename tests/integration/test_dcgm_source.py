"""The dcgm-exporter source against a real HTTP server on loopback: up and down, XID changes,
a GPU that drops out of the exporter's answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from gpuwatch.exporters.dcgm_source import DcgmSource

from gpuwatch import metrics as m
from gpuwatch.clock import SystemClock
from gpuwatch.model import Batch, Event, GpuStatus

H100 = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm" / "h100_8gpu_nvlink_dcgm46.prom"


class Exporter:
    """A stand-in dcgm-exporter: answers with whatever `text` (or `status`) is set to."""

    def __init__(self) -> None:
        self.text = H100.read_text()
        self.status = 200
        self.in_pieces = False  # send the body in three writes, a little apart

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        if not self.in_pieces:
            return web.Response(text=self.text, status=self.status)
        response = web.StreamResponse(status=self.status)
        await response.prepare(request)
        body = self.text.encode()
        third = len(body) // 3
        for piece in (body[:third], body[third : 2 * third], body[2 * third :]):
            await response.write(piece)
            await asyncio.sleep(0.02)
        await response.write_eof()
        return response


@pytest.fixture
async def exporter() -> AsyncIterator[tuple[Exporter, str]]:
    fake = Exporter()
    app = web.Application()
    app.router.add_get("/metrics", fake.metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield fake, f"http://127.0.0.1:{port}/metrics"
    await runner.cleanup()


def _xid_line(text: str, gpu: int, code: int) -> str:
    """The capture with GPU `gpu`'s XID gauge showing `code`."""
    out = []
    for line in text.splitlines():
        if line.startswith("DCGM_FI_DEV_XID_ERROR{") and f'gpu="{gpu}"' in line:
            head = line.rsplit(" ", 1)[0].split(",err_code=")[0]
            out.append(f'{head},err_code="{code}",err_msg="x"}} {code}')
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def _up(batch: Batch) -> float:
    return next(s.value for s in batch.samples if s.name == m.UP)


async def test_xid_changes_become_events_and_the_first_value_is_a_baseline(
    exporter: tuple[Exporter, str],
) -> None:
    fake, url = exporter
    events: list[Event] = []
    source = DcgmSource(url, SystemClock(), 2.0, events.append)
    await source.start()
    first = await source.collect()  # GPU 4 already shows XID 13: from before we started
    assert _up(first) == 1.0 and len(first.gpus) == 8
    fake.text = _xid_line(fake.text, 2, 79)
    await source.collect()
    await source.collect()  # the same value again is not a new XID
    fake.text = _xid_line(fake.text, 2, 48)
    await source.collect()
    await source.stop()
    assert [(e.kind, e.gpu, e.data["xid"]) for e in events] == [("xid", 2, 79), ("xid", 2, 48)]
    assert events[0].message.startswith("XID 79 on GPU 2: ")
    assert "Kubernetes pod llama-pretrain-worker-0 of ml-research" in events[0].message


async def test_a_failed_scrape_marks_the_backend_down_with_why_and_it_recovers(
    exporter: tuple[Exporter, str],
) -> None:
    fake, url = exporter
    source = DcgmSource(url, SystemClock(), 2.0, lambda _: None)
    await source.start()
    fake.status = 503
    down = await source.collect()
    assert _up(down) == 0.0 and down.gpus == []
    assert down.backend.reason == f"dcgm-exporter {url}: HTTP 503 Service Unavailable"
    fake.status, fake.text = 200, "this is { not the format\n"
    garbled = await source.collect()
    assert "not Prometheus text format" in garbled.backend.reason
    fake.text = H100.read_text()
    back = await source.collect()
    assert _up(back) == 1.0 and back.backend.up and back.backend.driver_version == "580.95.05"
    await source.stop()
    refused = DcgmSource("http://127.0.0.1:9/metrics", SystemClock(), 2.0, lambda _: None)
    await refused.start()
    batch = await refused.collect()
    await refused.stop()
    assert batch.backend.reason.endswith("cannot connect (Connection refused)")
    assert _up(batch) == 0.0


async def test_a_gpu_the_exporter_stops_reporting_is_lost_until_it_is_back(
    exporter: tuple[Exporter, str],
) -> None:
    fake, url = exporter
    events: list[Event] = []
    source = DcgmSource(url, SystemClock(), 2.0, events.append)
    await source.start()
    await source.collect()
    full = fake.text
    fake.text = "\n".join(line for line in full.splitlines() if 'gpu="3"' not in line) + "\n"
    lost = await source.collect()
    fake.text = full
    back = await source.collect()
    await source.stop()
    assert lost.gpus[3].status == GpuStatus.LOST and lost.gpus[3].info.index == 3
    gpu_up = {dict(s.labels)["gpu"]: s.value for s in lost.samples if s.name == m.GPU_UP}
    assert gpu_up["3"] == 0.0 and gpu_up["2"] == 1.0
    assert all(g.status == GpuStatus.OK for g in back.gpus)
    assert [(e.kind, e.gpu) for e in events] == [("gpu_lost", 3), ("gpu_recovered", 3)]


async def test_an_answer_that_arrives_in_pieces_is_read_whole(
    exporter: tuple[Exporter, str],
) -> None:
    """A first version read what had arrived, not the whole body: the exporter looked down
    every other scrape against a server that wrote in pieces."""
    fake, url = exporter
    fake.in_pieces = True
    source = DcgmSource(url, SystemClock(), 2.0, lambda _: None)
    await source.start()
    batch = await source.collect()
    await source.stop()
    assert batch.backend.up, batch.backend.reason
    assert len(batch.gpus) == 8
