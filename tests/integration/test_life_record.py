"""A GPU's life record on a simulated node wired as `gpuwatch run` wires it: the XID a board
took stays in its record through a restart, a reboot, a driver upgrade and a move to another
slot, and its lifetime fault count follows the board, not the slot."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path

from gpuwatch import metrics as m
from gpuwatch.life.book import FILE_NAME, LifeBook, read_entries, read_gpus
from gpuwatch.serve.wiring import Wired
from tests.conftest import Simulate, node_config, sampled

START = 1_790_000_000.0
NODE = "node: {gpus: 8, model: H100, workload: training, seed: 1"


async def stop(wired: Wired) -> None:
    await wired.daemon.source.stop()
    await wired.close()


def scenario(tmp_path: Path, name: str, node: str = "", faults: str = "[]") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\n{NODE}{node}}}\nfaults: {faults}\n")
    return path


def faults_by_gpu(wired: Wired) -> dict[str, float]:
    """gpuwatch_gpu_life_faults_total{kind="xid"} as the daemon stored it, by GPU index."""
    found = wired.daemon.store.select(m.GPU_LIFE_FAULTS)
    return {s.label_dict["gpu"]: s.last_value for s in found if s.label_dict["kind"] == "xid"}


async def test_a_boards_record_survives_restart_reboot_upgrade_and_a_slot_move(
    tmp_path: Path, simulate: Simulate
) -> None:
    config, state = node_config(tmp_path)

    def node(playing: Path, since: float, boot: str, cycles: int = 2) -> Awaitable[Wired]:
        """The node on the same state directory, `since` seconds on, in boot `boot`."""
        return sampled(
            simulate, str(playing), config, state, cycles, start=START + since, boot=boot
        )

    xid = scenario(tmp_path, "xid", faults="[{kind: xid, gpu: 1, at: 2s, code: 79}]")
    wired = await node(xid, 0, "boot-1", cycles=4)
    for _ in range(200):  # the event thread hands the XID to the loop on its own time
        if read_gpus(wired.life.book._db).get(serial := _serial(wired, 1), None) and any(
            e.kind == "xid" for e in read_entries(wired.life.book._db, serial)
        ):
            break
        await asyncio.sleep(0.01)
        await wired.daemon.sample_once()
    board = _serial(wired, 1)
    await stop(wired)

    healthy = scenario(tmp_path, "healthy")
    wired = await node(healthy, 100, "boot-1")  # a restart
    assert faults_by_gpu(wired) == {"1": 1.0}
    await stop(wired)
    wired = await node(healthy, 200, "boot-2")
    await stop(wired)
    upgraded = scenario(tmp_path, "upgraded", node=", driver: R615")
    wired = await node(upgraded, 300, "boot-3")
    await stop(wired)
    swapped = scenario(tmp_path, "swapped", node=", driver: R615, boards: [1, 0, 2, 3, 4, 5, 6, 7]")
    wired = await node(swapped, 400, "boot-3")
    assert _serial(wired, 0) == board  # the board keeps its serial in its new slot
    assert faults_by_gpu(wired) == {"0": 1.0}  # the count follows the board
    await stop(wired)

    book = LifeBook(state / FILE_NAME)
    try:
        entries = read_entries(book._db, board)
        assert [e.kind for e in entries] == ["installed", "xid", "boot", "driver", "boot", "slot"]
        assert entries[1].key == "79"
        assert entries[3].message.startswith("driver 580.")
        assert entries[3].message.split(" -> ")[1].startswith("615.")
        assert entries[5].message == (
            "moved from slot 00000000:2A:00.0 (GPU 1) to slot 00000000:18:00.0 (GPU 0)"
        )
        assert len(read_gpus(book._db)) == 8  # the two boards swapped places: no new GPU
    finally:
        book.close()


def _serial(wired: Wired, index: int) -> str:
    batch = wired.daemon.view.batch
    assert batch is not None
    return next(g.info.serial for g in batch.gpus if g.info.index == index)
