"""The journal: every event and alert transition, in SQLite in the state directory.

WAL mode with synchronous=FULL: the entries recorded in one turn of the event loop go to disk
in one transaction as that turn ends, before anything they woke runs (a burst of XIDs the
kernel log read at once costs one fsync, not one each), so they survive a crash or a power cut
that comes later. Old entries are deleted after the retention window (30 days by default). A
journal that cannot be written is logged and shown as a cause in the node's verdict, never
fatal; its events are kept in memory (a bounded number) and written when the disk takes them
again. A damaged journal is set aside at start; one deleted while open is
recreated at its path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections import deque
from pathlib import Path
from typing import Any

from gpuwatch.model import Event
from gpuwatch.state.statedir import StateProblems, open_sqlite, reopen_if_unlinked
from gpuwatch.text.timefmt import rfc3339

log = logging.getLogger(__name__)

FILE_NAME = "journal.db"
TRIM_EVERY_S = 3600.0
HELD_LIMIT = 10_000  # events kept in memory while the journal cannot be written
FLUSH_AT = 1_000  # events held in one turn of the loop written at once, far below HELD_LIMIT
SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    gpu INTEGER,
    uuid TEXT,
    message TEXT NOT NULL,
    data TEXT NOT NULL,
    boot_id TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS events_time ON events (time);
"""


def event_json(event: Event) -> dict[str, Any]:
    """An event as the API and `gpuwatch events` show it; its data fields sit at the top level."""
    return {
        **event.data,
        "time": rfc3339(event.time),
        "kind": event.kind,
        "gpu": event.gpu,
        "uuid": event.uuid,
        "message": event.message,
    }


class Journal:
    def __init__(
        self,
        state_dir: Path,
        retention: float,
        boot_id: str = "",
        problems: StateProblems | None = None,
    ) -> None:
        self.path = state_dir / FILE_NAME
        self.retention = retention
        self.boot_id = boot_id  # every entry is stamped with the boot it happened in
        self.problems = problems if problems is not None else StateProblems(None)
        self._db = open_sqlite(self.path, SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(events)")}
        if "boot_id" not in columns:  # a journal written before entries carried their boot
            self._db.execute("ALTER TABLE events ADD COLUMN boot_id TEXT NOT NULL DEFAULT ''")
        self._next_trim = 0.0
        self._held: deque[Event] = deque(maxlen=HELD_LIMIT)  # not yet on disk
        self._flush_due = False  # a flush is scheduled for the end of the loop's turn
        self._failing = False  # the last write failed: tried again by flush_if_needed only

    def close(self) -> None:
        if self._held:
            self.flush()
        self._db.close()

    def record(self, event: Event) -> None:
        self._held.append(event)
        if self._failing:  # a storm must not try a full disk again for each event
            return
        if len(self._held) >= FLUSH_AT:
            self.flush()
            return
        if self._flush_due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a command reading the journal, a test): at once
            self.flush()
            return
        self._flush_due = True
        loop.call_soon(self._flush_due_now)

    def _flush_due_now(self) -> None:
        self._flush_due = False
        if self._held:
            self.flush()

    def flush_if_needed(self) -> None:
        """Write held events, and recreate the file if it was deleted while open."""
        if self._held or not self.path.exists():
            self.flush()

    def flush(self) -> None:
        """Write the events held in memory, oldest first; on failure they stay held."""
        try:
            self._db = reopen_if_unlinked(self._db, self.path, SCHEMA)
            with self._db:
                self._db.execute("BEGIN")
                for event in self._held:
                    self._db.execute(
                        "INSERT INTO events (time, kind, gpu, uuid, message, data, boot_id)"
                        " VALUES (?,?,?,?,?,?,?)",
                        (
                            event.time,
                            event.kind,
                            event.gpu,
                            event.uuid,
                            event.message,
                            json.dumps(event.data),
                            self.boot_id,
                        ),
                    )
            newest = self._held[-1].time if self._held else 0.0
            self._held.clear()
            if newest >= self._next_trim:
                self._next_trim = newest + TRIM_EVERY_S
                self._db.execute("DELETE FROM events WHERE time < ?", (newest - self.retention,))
        except (sqlite3.Error, OSError) as exc:
            self._failing = True
            self.problems.write_failed(FILE_NAME, str(exc))
        else:
            self._failing = False
            self.problems.write_ok(FILE_NAME)

    def events_carrying(self, key: str, limit: int) -> list[Event]:
        """This boot's events whose data has `key` (the kernel log's carry its records'
        sequence numbers), oldest first, at most the newest `limit`."""
        rows = self._db.execute(
            "SELECT time, kind, gpu, uuid, message, data FROM events WHERE boot_id = ?"
            " AND json_extract(data, ?) IS NOT NULL ORDER BY time DESC, id DESC LIMIT ?",
            (self.boot_id, f"$.{key}", limit),
        ).fetchall()
        stored = [
            Event(time, kind, gpu, uuid, message, json.loads(data))
            for time, kind, gpu, uuid, message, data in reversed(rows)
        ]
        return stored + [e for e in self._held if key in e.data]

    def events(
        self, since: float, limit: int, kind: str = "", this_boot: bool = False
    ) -> list[Event]:
        """Events after `since`, oldest first, at most the newest `limit` of them; with
        `this_boot`, only those of the machine's current boot."""
        query = "SELECT time, kind, gpu, uuid, message, data FROM events WHERE time > ?"
        args: list[Any] = [since]
        if kind:
            query += " AND kind = ?"
            args.append(kind)
        if this_boot:
            query += " AND boot_id = ?"
            args.append(self.boot_id)
        query += " ORDER BY time DESC, id DESC LIMIT ?"
        args.append(limit)
        rows = self._db.execute(query, args).fetchall()
        stored = [
            Event(time, kind_, gpu, uuid, message, json.loads(data))
            for time, kind_, gpu, uuid, message, data in reversed(rows)
        ]
        held = [e for e in self._held if e.time > since and (not kind or e.kind == kind)]
        return (stored + held)[-limit:] if limit > 0 else []
