"""A GPU's life record as people and programs read it: `gpuwatch gpu history` and the RMA
bundle. Everything in it that a process or the kernel log wrote (a process's name, the
driver's text) is printed with its control characters escaped."""

from __future__ import annotations

import sqlite3
from typing import Any

from gpuwatch.life.book import Entry, GpuLife, read_gpus
from gpuwatch.life.counts import TOLD
from gpuwatch.text.printable import one_line, printable
from gpuwatch.text.timefmt import rfc3339
from gpuwatch.text.timefmt import utc_second as when


def find(db: sqlite3.Connection, wanted: str) -> list[GpuLife]:
    """The GPUs whose serial, or UUID, is `wanted`: more than one for the serial of a board
    that holds several GPUs."""
    lives = read_gpus(db)
    by_uuid = [life for life in lives.values() if life.known.get("uuid") == wanted]
    # A board's serial: its record, and those of each of its GPUs kept by serial and UUID.
    return by_uuid or [life for key, life in lives.items() if key.partition(":")[0] == wanted]


def gpu_table(lives: dict[str, GpuLife]) -> list[str]:
    """One line a GPU: the GPUs this node has held, the most recently seen first."""
    lines = [f"{'SERIAL':<16} {'MODEL':<26} {'SLOT (GPU)':<22} {'LAST SEEN (UTC)':<20} FAULTS"]
    # The GPUs seen lately first, by index; those gone after them.
    for life in sorted(lives.values(), key=lambda g: (-(g.last_seen // 3600), _index(g))):
        known = life.known
        faults = ", ".join(f"{k} {n}" for k, n in sorted(known.get("faults", {}).items()))
        slot = printable(f"{known.get('pci_bus_id', '?')} ({known.get('index', '?')})")
        model = printable(str(known.get("model", "?")))
        lines.append(
            f"{printable(life.serial):<16} {model:<26} {slot:<22} {when(life.last_seen):<20} "
            f"{faults or '-'}"
        )
    return lines


def _index(life: GpuLife) -> int:
    index = life.known.get("index")
    return index if isinstance(index, int) else -1


def describe(life: GpuLife) -> list[str]:
    """Who the GPU is, where it was last seen, and its counts."""
    k = life.known
    lines = [
        f"GPU serial {printable(life.serial)}: {printable(str(k.get('model', '?')))}, "
        f"UUID {printable(str(k.get('uuid', '?')))}",
        printable(
            f"  last in node {k.get('node', '?')}, slot {k.get('pci_bus_id', '?')} "
            f"(GPU {k.get('index', '?')}), driver {k.get('driver') or '?'}, "
            f"VBIOS {k.get('vbios') or '?'}"
        ),
        f"  first seen {when(life.first_seen)} UTC, last seen {when(life.last_seen)} UTC",
    ]
    counts = k.get("counts", {})
    told = [f"    {TOLD[c][0]}: {counts[c]:g}" for c in TOLD if c in counts]
    lines += ["  counts the board keeps:", *told] if told else ["  counts: none read"]
    faults = k.get("faults", {})
    lifetime = ", ".join(f"{kind} {n}" for kind, n in sorted(faults.items()))
    lines.append(f"  faults on this node: {lifetime or 'none'}")
    if k.get("trimmed"):
        lines.append(f"  ({k['trimmed']} oldest entries trimmed; the counts above keep them)")
    return lines


def entry_lines(entries: list[Entry]) -> list[str]:
    lines = [f"{'TIME (UTC)':<19}  {'WHAT':<22}  DETAIL"]
    for e in entries:
        what = e.key if e.key.startswith(e.kind) else f"{e.kind} {e.key}".strip()
        line = f"{when(e.first):<19}  {printable(what):<22}  {one_line(e.message, 300)}"
        if e.count > 1:
            line += f" (x{e.count}, the last at {when(e.last)})"
        lines.append(line)
        said = e.data.get("driver_text")
        if said:
            lines.append(f"{'':<19}  {'':<22}  driver: {one_line(str(said), 300)}")
    return lines


def history_json(life: GpuLife, entries: list[Entry]) -> dict[str, Any]:
    return {
        "serial": life.serial,
        "first_seen": rfc3339(life.first_seen),
        "last_seen": rfc3339(life.last_seen),
        "known": life.known,
        "entries": [
            {**e.as_json(), "first": rfc3339(e.first), "last": rfc3339(e.last)} for e in entries
        ],
    }


def history_text(life: GpuLife, entries: list[Entry]) -> str:
    return "\n".join([*describe(life), "", *entry_lines(entries)]) + "\n"
