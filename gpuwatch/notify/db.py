"""The notifier's durable state in `notify.db` in the state directory (SQLite, WAL,
synchronous=FULL): the outbox, the notification log and the silences.

The outbox holds every notification from before it is sent until a receiver answered 2xx. The
notification log records, per group and receiver, which alerts were last notified firing and
resolved, so a restart neither repeats a notification nor forgets to send a resolve. A
notification and its log entry are written in one transaction.

Each receiver's outbox has two lanes: a notification that carries a hardware alert (lane 0)
leaves before any that carries only jobs' alerts (lane 1), so a job's flood of pages never
holds up a GPU that fell off the bus. Within a lane they leave in order.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.state.statedir import open_sqlite, reopen_if_unlinked

FILE_NAME = "notify.db"
HARDWARE_LANE, JOB_LANE = 0, 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY,
    receiver TEXT NOT NULL,
    key TEXT NOT NULL,
    body BLOB NOT NULL,
    headers TEXT NOT NULL,
    created REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt REAL NOT NULL,
    coalesce_key TEXT,
    lane INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS outbox_receiver ON outbox (receiver, id);
CREATE TABLE IF NOT EXISTS nflog (
    group_key TEXT NOT NULL,
    receiver TEXT NOT NULL,
    firing TEXT NOT NULL,
    resolved TEXT NOT NULL,
    time REAL NOT NULL,
    PRIMARY KEY (group_key, receiver)
);
CREATE TABLE IF NOT EXISTS silences (
    id TEXT PRIMARY KEY,
    matchers TEXT NOT NULL,
    starts_at REAL NOT NULL,
    ends_at REAL NOT NULL,
    created_by TEXT NOT NULL,
    comment TEXT NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Pending:
    """One notification waiting in the outbox."""

    id: int
    receiver: str
    key: str  # stable idempotency key, sent as the Idempotency-Key header
    body: bytes
    headers: dict[str, str]
    created: float
    attempts: int
    next_attempt: float


@dataclass(frozen=True, slots=True)
class LogEntry:
    firing: frozenset[str]
    resolved: frozenset[str]
    time: float


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A notification to put in the outbox."""

    receiver: str
    key: str
    body: bytes
    headers: dict[str, str]
    coalesce_key: str | None = None  # a newer one with the same key replaces one not yet sent
    lane: int = HARDWARE_LANE


class NotifyDb:
    def __init__(self, state_dir: Path | None) -> None:
        self.file = state_dir / FILE_NAME if state_dir is not None else None
        self.path = str(self.file) if self.file is not None else ":memory:"
        if self.file is not None:  # a damaged file is set aside, a fresh one started
            self.db = open_sqlite(self.file, SCHEMA)
        else:
            self.db = sqlite3.connect(self.path, isolation_level=None)
            self.db.executescript(SCHEMA)
        _with_lanes(self.db)

    def reopen_if_unlinked(self) -> None:
        """Recreate the file, with everything it held, if it was deleted while open."""
        if self.file is not None:
            self.db = reopen_if_unlinked(self.db, self.file, SCHEMA)
            _with_lanes(self.db)

    def close(self) -> None:
        self.db.close()

    # -- outbox ------------------------------------------------------------------------
    def enqueue(
        self,
        now: float,
        items: list[Outgoing],
        log: Sequence[tuple[str, str, LogEntry | None]] = (),
    ) -> None:
        """Add notifications and their log entries (None deletes one) in one transaction."""
        with self.db:
            self.db.execute("BEGIN")
            for item in items:
                if item.coalesce_key is not None:
                    self.db.execute(
                        "DELETE FROM outbox WHERE coalesce_key = ? AND attempts = 0",
                        (item.coalesce_key,),
                    )
                self.db.execute(
                    "INSERT INTO outbox (receiver, key, body, headers, created, next_attempt,"
                    " coalesce_key, lane) VALUES (?,?,?,?,?,?,?,?)",
                    (
                        item.receiver,
                        item.key,
                        item.body,
                        json.dumps(item.headers),
                        now,
                        now,
                        item.coalesce_key,
                        item.lane,
                    ),
                )
            for group_key, receiver, entry in log:
                if entry is None:
                    self.db.execute(
                        "DELETE FROM nflog WHERE group_key = ? AND receiver = ?",
                        (group_key, receiver),
                    )
                else:
                    self.db.execute(
                        "INSERT OR REPLACE INTO nflog VALUES (?,?,?,?,?)",
                        (
                            group_key,
                            receiver,
                            json.dumps(sorted(entry.firing)),
                            json.dumps(sorted(entry.resolved)),
                            entry.time,
                        ),
                    )

    def head(self, receiver: str) -> Pending | None:
        """The next notification for a receiver: the hardware's lane first, each in order."""
        row = self.db.execute(
            "SELECT id, receiver, key, body, headers, created, attempts, next_attempt"
            " FROM outbox WHERE receiver = ? ORDER BY lane, id LIMIT 1",
            (receiver,),
        ).fetchone()
        if row is None:
            return None
        id_, rec, key, body, headers, created, attempts, next_attempt = row
        return Pending(
            id_, rec, key, bytes(body), json.loads(headers), created, attempts, next_attempt
        )

    def delivered(self, id_: int) -> None:
        self.db.execute("DELETE FROM outbox WHERE id = ?", (id_,))

    def retry_at(self, id_: int, when: float) -> None:
        self.db.execute(
            "UPDATE outbox SET attempts = attempts + 1, next_attempt = ? WHERE id = ?",
            (when, id_),
        )

    def pending(self) -> dict[str, int]:
        return dict(
            self.db.execute("SELECT receiver, COUNT(*) FROM outbox GROUP BY receiver").fetchall()
        )

    # -- notification log ----------------------------------------------------------------
    def log_entries(self) -> dict[tuple[str, str], LogEntry]:
        rows = self.db.execute("SELECT group_key, receiver, firing, resolved, time FROM nflog")
        return {
            (g, r): LogEntry(frozenset(json.loads(f)), frozenset(json.loads(res)), t)
            for g, r, f, res, t in rows
        }


def _with_lanes(db: sqlite3.Connection) -> None:
    """An outbox from before lanes gains its column (its rows the hardware's lane: before, they
    all left in order) and the index the next notification is found by."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(outbox)")}
    if "lane" not in columns:
        db.execute("ALTER TABLE outbox ADD COLUMN lane INTEGER NOT NULL DEFAULT 0")
    db.execute("CREATE INDEX IF NOT EXISTS outbox_lane ON outbox (receiver, lane, id)")
