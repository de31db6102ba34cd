"""The life record's storage: each physical GPU this node has held, by serial number, and what
happened to it, in `life.db` in the state directory.

Unlike the journal, nothing here expires with time: an RMA asks for a GPU's faults since it
was installed. What bounds it instead:

- A repeat of the same entry (the same XID code, the GPU lost again) within a window of the
  last one adds to that entry's count and moves its last time; it is not a new row. A job
  that makes its GPU raise an application XID every second adds one row a day.
- Each GPU keeps at most MAX_ENTRIES rows; past that the oldest go, those that are not faults
  first (the count of those gone is kept, and the GPU's lifetime fault counts are kept apart
  and never trimmed).

Written with synchronous=FULL like the journal, so what was recorded survives a power cut.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwatch.state.statedir import StateProblems, open_sqlite, reopen_if_unlinked
from gpuwatch.xid.known import APPLICATION_FAULTS

FILE_NAME = "life.db"
MAX_ENTRIES = 2000  # rows kept per GPU
# The kinds of entry that are the board's faults: what an RMA lists, and what a record past
# its cap keeps longest (the rest, installs, moves, upgrades, drains, acknowledgements, go
# first).
FAULT_KINDS = (
    "xid",
    "ecc",
    "row_remap",
    "retired_pages",
    "reset",
    "recovery_action",
    "gpu_lost",
    "gpu_unresponsive",
    "gpu_failing",
    "gpu_missing",
    "gpu_init_failed",
)


def jobs_own_xid(kind: str, key: str) -> bool:
    """Whether an entry is an XID a program's own fault raises: the job's, not the board's."""
    return kind == "xid" and key.isdigit() and int(key) in APPLICATION_FAULTS


SCHEMA = """
CREATE TABLE IF NOT EXISTS gpus (
    serial TEXT PRIMARY KEY,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    known TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY,
    serial TEXT NOT NULL,
    first REAL NOT NULL,
    last REAL NOT NULL,
    count INTEGER NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    message TEXT NOT NULL,
    data TEXT NOT NULL,
    boot_id TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_serial ON entries (serial, kind, key, last);
"""


@dataclass(frozen=True, slots=True)
class Entry:
    """One thing that happened to a GPU; `count` times between `first` and `last` when it
    repeated within its window."""

    first: float
    last: float
    count: int
    kind: str
    key: str
    message: str
    data: dict[str, Any]
    boot_id: str

    def as_json(self) -> dict[str, Any]:
        return {
            "first": self.first,
            "last": self.last,
            "count": self.count,
            "kind": self.kind,
            "key": self.key,
            "message": self.message,
            "data": self.data,
            "boot_id": self.boot_id,
        }


@dataclass(frozen=True, slots=True)
class NewEntry:
    """An entry to record; a repeat within `window` seconds of the last one with the same
    kind and key counts into it."""

    time: float
    kind: str
    key: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)
    window: float = 0.0
    # False for a second report of a fault already recorded (the kernel log's, after NVML's):
    # it only adds what it says to that entry, and is dropped when there is none.
    counts: bool = True


@dataclass(slots=True)
class GpuLife:
    """A GPU's row: when this node first and last saw it, and what it knows of it now (its
    identity, slot, driver, the counts last recorded, its lifetime fault counts)."""

    serial: str
    first_seen: float
    last_seen: float
    known: dict[str, Any]


class LifeBook:
    def __init__(self, path: Path, problems: StateProblems | None = None) -> None:
        self.path = path
        self.problems = problems if problems is not None else StateProblems(None)
        self._db = open_sqlite(path, SCHEMA)

    @staticmethod
    def reader(path: Path) -> sqlite3.Connection:
        """A read-only connection for the commands: they never write, nor create the file."""
        if not path.exists():
            raise FileNotFoundError(f"{path}: no life record here (is this the state directory?)")
        return sqlite3.connect(f"file:{path}?mode=ro", uri=True)

    def close(self) -> None:
        self._db.close()

    def gpus(self) -> dict[str, GpuLife]:
        return read_gpus(self._db)

    def write(self, lives: list[GpuLife], entries: list[tuple[str, NewEntry]], boot: str) -> bool:
        """Record the GPUs' rows and the new entries (serial, entry) in one transaction;
        False (and the state problem noted) when the disk refused."""
        try:
            self._db = reopen_if_unlinked(self._db, self.path, SCHEMA)
            with self._db:
                self._db.execute("BEGIN")
                for serial, entry in entries:
                    self._add(serial, entry, boot)
                for life in lives:
                    self._trim(life)
                    self._db.execute(
                        "INSERT INTO gpus (serial, first_seen, last_seen, known) VALUES (?,?,?,?)"
                        " ON CONFLICT (serial) DO UPDATE SET last_seen = excluded.last_seen,"
                        " known = excluded.known",
                        (life.serial, life.first_seen, life.last_seen, json.dumps(life.known)),
                    )
        except (sqlite3.Error, OSError) as exc:
            self.problems.write_failed(FILE_NAME, str(exc))
            return False
        self.problems.write_ok(FILE_NAME)
        return True

    def _add(self, serial: str, entry: NewEntry, boot: str) -> None:
        if entry.window > 0:
            row = self._db.execute(
                "SELECT id, data FROM entries WHERE serial = ? AND kind = ? AND key = ?"
                " AND last >= ? ORDER BY last DESC LIMIT 1",
                (serial, entry.kind, entry.key, entry.time - entry.window),
            ).fetchone()
            if row is not None:
                data = json.loads(row[1])
                # What a later report of the same fault adds (the driver's own text, which
                # the kernel log gives and NVML's event does not) is kept; the rest is the
                # first report's.
                merged = {**entry.data, **data}
                self._db.execute(
                    "UPDATE entries SET last = MAX(last, ?), count = count + ?, data = ?"
                    " WHERE id = ?",
                    (entry.time, int(entry.counts), json.dumps(merged), row[0]),
                )
                return
        if not entry.counts:
            return
        self._db.execute(
            "INSERT INTO entries (serial, first, last, count, kind, key, message, data, boot_id)"
            " VALUES (?,?,?,1,?,?,?,?,?)",
            (
                serial,
                entry.time,
                entry.time,
                entry.kind,
                entry.key,
                entry.message,
                json.dumps(entry.data),
                boot,
            ),
        )

    def _trim(self, life: GpuLife) -> None:
        (rows,) = self._db.execute(
            "SELECT COUNT(*) FROM entries WHERE serial = ?", (life.serial,)
        ).fetchone()
        over = rows - MAX_ENTRIES
        if over <= 0:
            return
        faults = ",".join("?" * len(FAULT_KINDS))
        self._db.execute(
            "DELETE FROM entries WHERE id IN (SELECT id FROM entries WHERE serial = ?"
            f" ORDER BY kind IN ({faults}), id LIMIT ?)",
            (life.serial, *FAULT_KINDS, over),
        )
        life.known["trimmed"] = int(life.known.get("trimmed", 0)) + over


def read_gpus(db: sqlite3.Connection) -> dict[str, GpuLife]:
    rows = db.execute(
        "SELECT serial, first_seen, last_seen, known FROM gpus ORDER BY first_seen, serial"
    )
    return {s: GpuLife(s, first, last, json.loads(known)) for s, first, last, known in rows}


def read_entries(db: sqlite3.Connection, serial: str) -> list[Entry]:
    """A GPU's entries, oldest first."""
    rows = db.execute(
        "SELECT first, last, count, kind, key, message, data, boot_id FROM entries"
        " WHERE serial = ? ORDER BY first, id",
        (serial,),
    )
    return [
        Entry(first, last, count, kind, key, message, json.loads(data), boot)
        for first, last, count, kind, key, message, data, boot in rows
    ]
