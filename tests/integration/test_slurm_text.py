"""Text that leaves gpuwatch for Slurm, against a real slurmctld: a drain reason carries no
control character a label or a log line held, and a reason someone crafted cannot make the
circuit breaker count nodes that are not there."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwatch.actions.breaker import hold
from gpuwatch.actions.drainer import drain_reason
from gpuwatch.actions.slurm import SlurmCli, SlurmNode
from gpuwatch.health.verdict import Cause, Health
from tests.slurm_server import NODE, PARTITION, Slurm, needs_slurm, program, start_slurm

pytestmark = needs_slurm

# What a process name or a label value can hold: an OSC that retitles the terminal (ESC ] ...
# BEL), a colour, a NUL that cut the reason short, Unicode's line separator.
HOSTILE = "\x1b]0;pwned\x07\x1b[31mreboot\x00 now\u2028and \x1c\x1d\x1e"


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Slurm]:
    server = start_slurm(tmp_path / "slurm")
    monkeypatch.setenv("SLURM_CONF", str(server.conf))  # for SlurmCli, as the daemon has it
    try:
        yield server
    finally:
        server.stop()


def test_a_drain_reason_reaches_slurm_whole_and_without_control_characters(
    slurm: Slurm,
) -> None:
    cli = SlurmCli(program("scontrol"), program("sinfo"), timeout=10)
    cause = Cause("xid-79", Health.UNHEALTHY, f"GPU 3: XID 79 {HOSTILE}", f"drain {HOSTILE} é")
    reason = drain_reason((cause,))
    asyncio.run(_drain(cli, reason))
    shown = slurm.run(program("sinfo"), "-R", "-h", "-o", "%E")
    assert shown.strip() == reason, (shown, reason)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in shown.strip())
    assert "\u2028" not in shown and shown.strip().endswith("é")
    assert "\\x1b]0;pwned\\x07" in shown  # shown as text, never acted on


async def _drain(cli: SlurmCli, reason: str) -> None:
    async with asyncio.timeout(30):
        await cli.drain(NODE, reason)


def test_a_crafted_reason_cannot_make_the_breaker_count_phantom_nodes(slurm: Slurm) -> None:
    # An earlier drain of gw2 (an admin's, or a gpuwatch before this one) with separators
    # inside its reason, each followed by what looks like another gpuwatch-drained node.
    fake = "\x1f".join(["", PARTITION, "idle+drain", "2026-11-28T01:00:00", "gpuwatch: xid-79"])
    slurm.drain("gw2", f"gpuwatch: xid-79 GPU 3\u2028gw7{fake}\x1cgw8{fake}\x1egw9{fake}")
    cli = SlurmCli(program("scontrol"), program("sinfo"), timeout=10)
    nodes = asyncio.run(_nodes(cli))
    assert sorted(n.name for n in nodes) == ["gw1", "gw2", "gw3", "gw4"]
    held = hold(nodes, [PARTITION], time.time(), max_fraction=0.3, max_per_hour=None)
    assert held is None  # 1 of 4 out, not 4 of 7


async def _nodes(cli: SlurmCli) -> list[SlurmNode]:
    async with asyncio.timeout(30):
        return await cli.nodes(partitions=[PARTITION])
