"""A dcgm-exporter or a receiver that takes its connection and never answers: the scrape is a
backend down with its reason, the delivery a retry with its reason, on every Python gpuwatch
runs on (on 3.10 asyncio's TimeoutError is not the builtin one)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gpuwatch.exporters.dcgm_source import DcgmSource

from gpuwatch.clock import SystemClock
from gpuwatch.notify import sender
from gpuwatch.web.fetch import fetch
from tests.conftest import silent_listener


@pytest.fixture
def silent_server() -> Iterator[str]:
    with silent_listener("/metrics") as url:
        yield url


async def test_a_silent_exporter_is_a_backend_down_with_its_reason(silent_server: str) -> None:
    source = DcgmSource(silent_server, SystemClock(), 0.3, lambda _: None)
    await source.start()
    try:
        batch = await source.collect()
    finally:
        await source.stop()
    assert not batch.backend.up
    assert batch.backend.reason == f"dcgm-exporter {silent_server}: no answer in time"


async def test_a_silent_receiver_is_said_to_give_no_answer(silent_server: str) -> None:
    with pytest.raises(Exception) as caught:  # what _deliver catches, whatever its class
        await fetch("POST", silent_server, body=b"{}", timeout=0.3, lane="notify")
    assert sender._why(caught.value, 0.3) == "no answer within 0.3s"
