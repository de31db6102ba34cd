"""A state disk that fills up, then is freed: nothing is remembered as done before it is on
disk, what waits is kept and written later, and the node's verdict says so meanwhile.

SQLite's own "database or disk is full" is provoked with PRAGMA max_page_count, the same error
(SQLITE_FULL) a full file system gives, without needing one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gpuwatch.clock import ManualClock
from gpuwatch.health.own import state_causes
from gpuwatch.model import Event, NotifyAlert, fingerprint
from gpuwatch.notify.config import NotifyConfig, ReceiverConfig, Route
from gpuwatch.notify.notifier import Notifier
from gpuwatch.state.journal import Journal
from gpuwatch.state.statedir import StateProblems
from gpuwatch.text.secrets import Secret

T0 = 1_800_000_000.0


def fill(db: sqlite3.Connection) -> None:
    """No page more: the next write that needs one fails as on a full disk."""
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    db.execute(f"PRAGMA max_page_count = {pages}")


def free(db: sqlite3.Connection) -> None:
    db.execute("PRAGMA max_page_count = 1073741823")


def big_alert(gpu: str) -> NotifyAlert:
    labels = (("alertname", "GpuFellOffBus"), ("gpu", gpu), ("severity", "critical"))
    notes = (("description", "x" * 20_000),)  # more than the pages left
    return NotifyAlert(labels, notes, T0, None, 1.0, fingerprint(labels))


def outbox(n: Notifier) -> int:
    return int(n.db.db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])


def test_a_notification_refused_by_a_full_disk_is_sent_once_it_has_room(tmp_path: Path) -> None:
    receiver = ReceiverConfig("ops", "webhook", Secret("http://127.0.0.1:9/", "inline"), True)
    config = NotifyConfig((receiver,), Route(receivers=("ops",), group_wait=0.0))
    problems = StateProblems(tmp_path)
    clock = ManualClock(T0)
    n = Notifier(
        config, tmp_path, clock, node="n1", external_url="", interval=1.0, problems=problems
    )
    fill(n.db.db)
    n.dispatcher.update(T0, [big_alert("0")], {})
    n._flush(T0)  # the commit fails: nothing is told, nothing lost
    assert outbox(n) == 0
    assert [c.key for c in state_causes(problems)] == ["state-write-notify.db"]
    assert problems.write_failures["notify.db"] == 1
    free(n.db.db)
    n._flush(T0 + 1)  # within the retry pause: not yet
    assert outbox(n) == 0
    n.dispatcher.update(T0 + 6, [big_alert("0")], {})
    n._flush(T0 + 6)
    assert outbox(n) == 1
    assert state_causes(problems) == []
    n.db.close()


def test_journal_events_wait_in_memory_and_are_shown_while_the_disk_is_full(
    tmp_path: Path,
) -> None:
    problems = StateProblems(tmp_path)
    journal = Journal(tmp_path, 86400.0, "boot", problems)
    journal.record(Event(T0, "xid", 0, "GPU-1", "XID 79 on GPU 0", {"xid": 79}))
    fill(journal._db)
    for i in range(3):
        journal.record(Event(T0 + 1 + i, "xid", 0, "GPU-1", "x" * 20_000, {"xid": 79}))
    assert [c.key for c in state_causes(problems)] == ["state-write-journal.db"]
    assert len(journal.events(0.0, 100)) == 4  # the API still shows them
    free(journal._db)
    journal.flush_if_needed()
    assert state_causes(problems) == []
    journal.close()
    reopened = Journal(tmp_path, 86400.0, "boot")
    assert [e.time for e in reopened.events(0.0, 100)] == [T0, T0 + 1, T0 + 2, T0 + 3]
    reopened.close()
