"""The journal: every event and alert transition, in SQLite in the state directory.

WAL mode with synchronous=FULL: an entry is on disk before record() returns, so what the API
has shown survives a crash or a power cut. Old entries are deleted after the retention window
(30 days by default). A journal that cannot be written is logged, never fatal.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from typing import Any

from gpuwatch.model import Event
from gpuwatch.timefmt import rfc3339

log = logging.getLogger(__name__)

FILE_NAME = "journal.db"
TRIM_EVERY_S = 3600.0
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
    def __init__(self, state_dir: Path, retention: float, boot_id: str = "") -> None:
        self.path = state_dir / FILE_NAME
        self.retention = retention
        self.boot_id = boot_id  # every entry is stamped with the boot it happened in
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(events)")}
        if "boot_id" not in columns:  # a journal written before entries carried their boot
            self._db.execute("ALTER TABLE events ADD COLUMN boot_id TEXT NOT NULL DEFAULT ''")
        self._next_trim = 0.0
        self._failing = False

    def close(self) -> None:
        self._db.close()

    def record(self, event: Event) -> None:
        try:
            self._db.execute(
                "INSERT INTO events (time, kind, gpu, uuid, message, data, boot_id)"
                " VALUES (?,?,?,?,?,?,?)",
                (event.time, event.kind, event.gpu, event.uuid, event.message,
                 json.dumps(event.data), self.boot_id),
            )  # fmt: skip
            if event.time >= self._next_trim:
                self._next_trim = event.time + TRIM_EVERY_S
                self._db.execute(
                    "DELETE FROM events WHERE time < ?", (event.time - self.retention,)
                )
        except sqlite3.Error as exc:
            if not self._failing:  # once per outage, not once per event
                log.error("journal %s: cannot write: %s", self.path, exc)
            self._failing = True
        else:
            if self._failing:
                log.info("journal %s: writing again", self.path)
            self._failing = False

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
        return [
            Event(time, kind_, gpu, uuid, message, json.loads(data))
            for time, kind_, gpu, uuid, message, data in reversed(rows)
        ]
