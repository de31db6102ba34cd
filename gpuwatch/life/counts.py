"""The counts a GPU's record follows: those the board keeps wherever it goes (aggregate ECC
errors, remapped rows and retired pages, which NVML reads from the board's InfoROM) and the
volatile ECC counts, whose going back to 0 within one boot shows a reset."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuwatch import metrics as m
from gpuwatch.life.book import NewEntry
from gpuwatch.model import Sample

Counts = dict[str, float]
COUNTED = frozenset(
    {
        m.ECC_ERRORS,
        m.REMAPPED_ROWS,
        m.ROW_REMAP_PENDING,
        m.ROW_REMAP_FAILED,
        m.RETIRED_PAGES,
        m.RETIRED_PAGES_PENDING,
    }
)
VOLATILE = ("ecc_corrected_volatile", "ecc_uncorrected_volatile")
CORRECTED_EVERY_S = 3600.0  # corrected errors climb steadily on some boards: an entry an hour
# What each count is, as its entry says it, the entry's kind, and the lifetime fault kind its
# rises count as ("" for none).
TOLD = {
    "ecc_uncorrected": ("uncorrected (double-bit) ECC errors, aggregate", "ecc", "ecc_uncorrected"),
    # Corrected errors, and the rows and pages they retire, are wear a healthy board shows: not
    # faults, kinds of their own (an RMA lists faults; a full record keeps faults longest).
    "ecc_corrected": ("corrected (single-bit) ECC errors, aggregate", "ecc_corrected", ""),
    "remapped_uncorrectable": (
        "rows remapped for uncorrectable errors",
        "row_remap",
        "row_remap_uncorrectable",
    ),
    "remapped_correctable": ("rows remapped for correctable errors", "wear", ""),
    "row_remap_pending": ("row remap pending (a reset applies it)", "row_remap", ""),
    "row_remap_failed": ("row remapping failed", "row_remap", "row_remap_failed"),
    "retired_dbe": ("pages retired for double-bit errors", "retired_pages", "retired_pages_dbe"),
    "retired_sbe": ("pages retired for single-bit errors", "wear", ""),
    "retired_pending": ("page retirement pending (a reset applies it)", "retired_pages", ""),
}


def _count_key(sample: Sample) -> str | None:
    labels = dict(sample.labels)
    name = sample.name
    if name == m.ECC_ERRORS:
        key = f"ecc_{labels.get('type')}"
        return key if labels.get("scope") == "aggregate" else f"{key}_volatile"
    if name == m.REMAPPED_ROWS:
        return f"remapped_{labels.get('type')}"
    if name == m.RETIRED_PAGES:
        return f"retired_{labels.get('cause')}"
    return {
        m.ROW_REMAP_PENDING: "row_remap_pending",
        m.ROW_REMAP_FAILED: "row_remap_failed",
        m.RETIRED_PAGES_PENDING: "retired_pending",
    }.get(name)


def counts_of(samples: Iterable[Sample]) -> dict[str, Counts]:
    """The counts in `samples`, by GPU UUID."""
    out: dict[str, Counts] = {}
    for sample in samples:
        key = _count_key(sample)
        uuid = dict(sample.labels).get("uuid")
        if key is not None and uuid:
            out.setdefault(uuid, {})[key] = sample.value
    return out


def count_changes(now: float, known: dict[str, Any], reading: Counts) -> list[NewEntry]:
    """The entries for the counts in `reading` that differ from those `known` last recorded;
    `known` takes the recorded values (and its lifetime faults the rises)."""
    counts: dict[str, float] = known.setdefault("counts", {})
    held: dict[str, float] = known.setdefault("counted_at", {})
    faults: dict[str, int] = known.setdefault("faults", {})
    found: list[NewEntry] = []
    if any(k in reading and k in counts and reading[k] < counts[k] for k in VOLATILE):
        message = "volatile ECC counts went back to 0: the GPU was reset (or its driver reloaded)"
        found.append(NewEntry(now, "reset", "", message))
    counts.update({k: reading[k] for k in VOLATILE if k in reading})
    for key, value in reading.items():
        if key in VOLATILE:
            continue
        old = counts.get(key)
        if old is None:  # a count read for the first time: where it starts, not news
            counts[key] = value
            continue
        if value == old:
            continue
        if key == "ecc_corrected" and value > old and now - held.get(key, 0.0) < CORRECTED_EVERY_S:
            continue  # told at the next hour with the count it has then
        what, kind, fault = TOLD[key]
        message = f"{what}: {old:g} -> {value:g}"
        if value < old and kind.startswith("ecc"):
            message += " (cleared by an operator: nvidia-smi --reset-ecc-errors)"
        found.append(NewEntry(now, kind, key, message, {"from": old, "to": value}))
        if fault and value > old:
            faults[fault] = int(faults.get(fault, 0) + value - old)
        counts[key] = value
        held[key] = now
    return found
