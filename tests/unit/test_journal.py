"""The journal keeps events across restarts, answers by time, and forgets after retention."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from gpuwatch.model import Event
from gpuwatch.state.journal import FLUSH_AT, SCHEMA, Journal, event_json
from gpuwatch.text.timefmt import parse_since
from gpuwatch.xid.known import lookup

T0 = 1_700_000_000.0


def xid_event(t: float, code: int = 48) -> Event:
    xid = lookup(code)
    return Event(t, "xid", 1, "GPU-1", f"XID {code} on GPU 1: {xid.meaning}", xid.as_data())


def test_events_survive_a_reopen_and_come_back_oldest_first(tmp_path: Path) -> None:
    journal = Journal(tmp_path, retention=86400)
    for i in range(5):
        journal.record(xid_event(T0 + i, 48 + i))
    journal.close()  # what a restart sees

    again = Journal(tmp_path, retention=86400)
    assert [e.data["xid"] for e in again.events(T0 + 1, 100)] == [50, 51, 52]
    assert [e.data["xid"] for e in again.events(T0 - 1, 2)] == [51, 52]  # the newest 2
    assert again.events(T0 - 1, 100, kind="alert") == []


def test_events_at_the_same_instant_keep_the_order_they_happened_in(tmp_path: Path) -> None:
    # A GPU falling off the bus logs XID 79 and its loss in the same millisecond; the
    # dashboard and `gpuwatch events` must not show the loss before the XID.
    journal = Journal(tmp_path, retention=86400)
    for code in (79, 48, 13, 63):
        journal.record(xid_event(T0, code))
    assert [e.data["xid"] for e in journal.events(T0 - 1, 100)] == [79, 48, 13, 63]
    assert [e.data["xid"] for e in journal.events(T0 - 1, 2)] == [13, 63]


def test_an_event_as_json_carries_the_xid_meaning_and_action(tmp_path: Path) -> None:
    assert event_json(xid_event(T0 + 0.25, 79)) == {
        "time": "2023-11-14T22:13:20.250000Z",
        "kind": "xid",
        "gpu": 1,
        "uuid": "GPU-1",
        "message": "XID 79 on GPU 1: GPU has fallen off the bus",
        "xid": 79,
        "class": "critical",
        "meaning": "GPU has fallen off the bus",
        "action": "Drain the node and reboot it; reseat or RMA the GPU if it does not come back.",
    }


def test_old_entries_are_deleted_after_the_retention(tmp_path: Path) -> None:
    journal = Journal(tmp_path, retention=3600)
    journal.record(xid_event(T0))
    journal.record(xid_event(T0 + 7200))  # two hours later: the first is out of retention
    assert [e.time for e in journal.events(0, 100)] == [T0 + 7200]


def test_a_journal_that_cannot_be_written_is_logged_once_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = Journal(tmp_path, retention=3600)
    journal._db.execute("DROP TABLE events")  # the same failure path as a full or broken disk
    with caplog.at_level(logging.ERROR):
        journal.record(xid_event(T0))
        journal.record(xid_event(T0 + 1))
    assert len([r for r in caplog.records if "cannot write" in r.message]) == 1


def test_since_takes_durations_unix_times_and_rfc3339() -> None:
    assert parse_since("1h", T0) == T0 - 3600
    assert parse_since("1700000000.5", T0) == 1_700_000_000.5
    assert parse_since("2023-11-14T22:13:20Z", T0) == T0
    with pytest.raises(ValueError, match="expected a duration"):
        parse_since("yesterday", T0)


def test_the_catalog_has_every_xid_nvidia_documents_with_its_resolution() -> None:
    """NVIDIA's catalog for Ampere and newer lists XIDs 1-172; the class follows its immediate
    action: restart the application, ignore, reset the GPU or reboot, contact support."""
    assert all(lookup(code).xid_class != "unknown" for code in range(1, 173))
    classes = {
        "application": (8, 13, 31, 32, 68, 94),  # restart the application; the GPU is fine
        "info": (43, 45, 63, 121, 137),  # no action
        # 150: NVIDIA's 144-150 decode sheet lists only fatal, RESET_GPU sub-codes for it
        "critical": (46, 48, 64, 74, 79, 95, 119, 120, 140, 149, 150, 155, 156, 158),
        # unused on Ampere+; by sub-code; a single-bit ECC storm (watch the trend); 157 (no
        # repairs possible, contact support)
        "warning": (61, 92, 144, 145, 146, 147, 148, 157, 163),
    }
    for cls, codes in classes.items():
        assert {c: lookup(c).xid_class for c in codes} == dict.fromkeys(codes, cls)
    assert lookup(154).xid_class == "driver"
    assert lookup(173).xid_class == lookup(999).xid_class == "unknown"


def count_flushes(journal: Journal, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many events each write of the journal's found held, in order."""
    flushes: list[int] = []
    flush = journal.flush

    def counted() -> None:
        flushes.append(len(journal._held))
        flush()

    monkeypatch.setattr(journal, "flush", counted)
    return flushes


async def test_a_burst_in_one_turn_of_the_loop_is_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path, retention=86400)
    flushes = count_flushes(journal, monkeypatch)
    for i in range(2500):  # a kernel log read of XID 13s, published in one go
        journal.record(xid_event(T0 + i / 1000, 13))
    assert flushes == [FLUSH_AT, FLUSH_AT]  # held no more than FLUSH_AT at a time
    assert len(journal.events(T0 - 1, 10_000)) == 2500  # read before the turn ends: all
    await asyncio.sleep(0)  # the turn ends
    assert flushes == [FLUSH_AT, FLUSH_AT, 500]
    journal.record(xid_event(T0 + 3, 79))
    journal.close()  # whatever is held is written as it closes
    again = Journal(tmp_path, retention=86400)
    assert len(again.events(T0 - 1, 10_000)) == 2501


def test_a_storm_on_a_disk_that_refuses_tries_it_once_then_each_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path, retention=86400)
    journal._db.execute("DROP TABLE events")  # the same failure path as a full disk
    flushes = count_flushes(journal, monkeypatch)
    for i in range(5000):
        journal.record(xid_event(T0 + i / 1000, 13))
    assert flushes == [1]  # not one full write of everything held for each event
    journal._db.executescript(SCHEMA)  # the disk takes writes again
    journal.flush_if_needed()  # as after each cycle
    assert flushes == [1, 5000] and len(journal.events(T0 - 1, 10_000)) == 5000
    journal.record(xid_event(T0 + 10, 79))  # and back to writing as events come
    assert flushes == [1, 5000, 1]
