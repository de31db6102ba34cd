"""The state directory's files kept usable whatever happens to them.

- A damaged file (a SQLite database that does not open or check clean, JSON that does not
  parse or has the wrong shape) is renamed `NAME.damaged-<UTC time>` and a fresh one started: a
  restart loop under `Restart=on-failure` would cost the node its monitoring, and the damaged
  copy stays for whoever wants to look at it.
- A SQLite file deleted while open (the directory removed under the daemon) is reopened at its
  path with its contents copied over, so writes stop going to an unlinked file.
- What went wrong is a cause in the node's verdict (`StateProblems`): a damaged file set aside
  until someone deletes it, a state file that cannot be written until it can again.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections import Counter
from pathlib import Path

from gpuwatch import metrics as m
from gpuwatch.model import Sample

log = logging.getLogger(__name__)

DAMAGED = ".damaged-"
DIR_MODE = 0o700  # the outbox holds receivers' keys; the journal, what ran where


def set_aside(path: Path, why: str) -> Path:
    """Rename a damaged state file out of the way (with its -wal and -shm companions)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}{DAMAGED}{stamp}")
    os.replace(path, target)
    for suffix in ("-wal", "-shm"):
        companion = path.with_name(path.name + suffix)
        if companion.exists():
            os.replace(companion, target.with_name(target.name + suffix))
    log.error("%s is damaged (%s): set aside as %s, starting a fresh one", path, why, target)
    return target


def open_sqlite(path: Path, schema: str) -> sqlite3.Connection:
    """A WAL database with synchronous=FULL and `schema` applied; a damaged file at `path` is
    set aside and a fresh one created. Raises sqlite3.Error only when a fresh one fails too
    (a read-only or full disk)."""
    try:
        return _open(path, schema)
    except sqlite3.DatabaseError as exc:
        if not path.exists():
            raise
        set_aside(path, str(exc))
    return _open(path, schema)


def _open(path: Path, schema: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        (check,) = db.execute("PRAGMA quick_check(1)").fetchone()
        if check != "ok":
            raise sqlite3.DatabaseError(f"integrity check: {check}")
        db.executescript(schema)
    except BaseException:
        db.close()
        raise
    return db


def ensure_dir(state: Path) -> bool:
    """Recreate the state directory if it was removed; True when it had to be."""
    if state.is_dir():
        return False
    state.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    log.error("state directory %s was removed while running: recreated it", state)
    return True


def reopen_if_unlinked(db: sqlite3.Connection, path: Path, schema: str) -> sqlite3.Connection:
    """`db` itself while its file is still at `path`; otherwise a new database at `path` with
    every table's rows copied over from the unlinked one (`db` is closed)."""
    if path.exists():
        return db
    ensure_dir(path.parent)
    fresh = _open(path, schema)
    fresh.close()
    db.execute("ATTACH DATABASE ? AS fresh", (str(path),))
    tables = [r[0] for r in db.execute("SELECT name FROM main.sqlite_master WHERE type='table'")]
    with db:
        db.execute("BEGIN")
        for table in tables:
            db.execute(f'INSERT INTO fresh."{table}" SELECT * FROM main."{table}"')
    db.execute("DETACH DATABASE fresh")
    db.close()
    log.error("%s was deleted while open: recreated it with its contents", path)
    return _open(path, schema)


class StateProblems:
    """The daemon's own storage troubles: files that cannot be written, files set aside as
    damaged, and a counter of failed writes (health/own.py makes them causes)."""

    def __init__(self, state_dir: Path | None) -> None:
        self.state_dir = state_dir
        self._failing: dict[str, str] = {}  # file name -> the error, while writes fail
        self.write_failures: Counter[str] = Counter()

    def write_failed(self, name: str, error: str) -> None:
        if name not in self._failing:
            log.error("state file %s: cannot write: %s", name, error)
        self._failing[name] = error
        self.write_failures[name] += 1

    def write_ok(self, name: str) -> None:
        if self._failing.pop(name, None) is not None:
            log.info("state file %s: writing again", name)

    def damaged(self) -> list[Path]:
        """Damaged files set aside in the state directory, oldest first."""
        if self.state_dir is None:
            return []
        try:
            found = [p for p in self.state_dir.iterdir() if DAMAGED in p.name]
        except OSError:
            return []
        return sorted(
            (p for p in found if not p.name.endswith(("-wal", "-shm"))),
            key=lambda p: p.name.rpartition(DAMAGED)[2],
        )

    def failing(self) -> list[tuple[str, str]]:
        """Files whose writes fail now, with the error, by name."""
        return sorted(self._failing.items())

    def collect(self) -> list[Sample]:
        return [
            Sample(m.STATE_WRITE_FAILURES, (("file", name),), float(count))
            for name, count in sorted(self.write_failures.items())
        ]
