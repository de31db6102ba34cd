"""Waiting for the kernel log: a file inotify watches wakes its reader when written to, not
when its neighbours are; a rotated file's successor wakes it too; stop() ends any wait. The
waits are on the kernel, in real time; each is bounded well above what it should take."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuwatch.kernel import kmsg
from gpuwatch.kernel.inotify import FileWatch
from gpuwatch.kernel.kmsg import KmsgReader

LONG_S = 30.0  # a wait that should end at once is given this long


@pytest.fixture
def wake() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


def opened(path: Path, text: bytes = b"") -> KmsgReader:
    """A reader of `path`, written with `text` first."""
    path.write_bytes(text)
    reader = KmsgReader(str(path))
    reader.open()
    return reader


def waited(reader: KmsgReader, wake_fd: int, act: Callable[[], None]) -> tuple[bool, float]:
    """What `reader.wait(LONG_S)` answered and the seconds it took, with `act` done from
    another thread once waiting."""
    doer = threading.Timer(0.05, act)
    doer.start()
    began = time.monotonic()
    readable = reader.wait(LONG_S, wake_fd)
    doer.join()
    return readable, time.monotonic() - began


def test_a_watched_file_that_is_written_to_ends_the_wait(
    tmp_path: Path, wake: tuple[int, int]
) -> None:
    path = tmp_path / "kmsg"
    reader = opened(path)
    assert reader.watch_problem == ""

    def append() -> None:
        with open(path, "ab") as f:
            f.write(b"4,1,10,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=0, fallen off the bus.\n")

    readable, took = waited(reader, wake[0], append)
    assert readable and took < LONG_S / 2
    assert [r.seq for r in reader.read()] == [1]
    # Nothing written to it: the wait lasts its whole timeout, a neighbour written meanwhile,
    # and says so (a look after it may find nothing: no reason to pause before the next wait).
    neighbour = threading.Timer(0.05, (tmp_path / "cpu").write_text, ("0.5 0.7\n",))
    neighbour.start()
    began = time.monotonic()
    assert not reader.wait(0.5, wake[0])
    assert time.monotonic() - began >= 0.45
    neighbour.join()
    reader.close()


def test_stop_ends_the_wait(tmp_path: Path, wake: tuple[int, int]) -> None:
    path = tmp_path / "kmsg"
    reader = opened(path)
    readable, took = waited(reader, wake[0], lambda: os.write(wake[1], b"\0"))
    assert not readable and took < LONG_S / 2
    assert reader.read() == []
    reader.close()


def test_the_watch_tells_the_file_from_its_neighbours_and_sees_its_successor(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes(b"")
    watch = FileWatch(str(path))
    try:
        assert not watch.changed()
        (tmp_path / "cpu").write_text("1.0 2.0\n")  # a neighbour created and written
        (tmp_path / "cpu").write_text("1.5 2.5\n")
        assert not watch.changed()
        with open(path, "ab") as f:
            f.write(b"4,1,10,-;x\n")
        assert watch.changed()
        assert not watch.changed()  # taken
        path.rename(tmp_path / "kmsg.1")  # rotated: moved away...
        assert watch.changed()
        path.write_bytes(b"4,1,10,-;fresh\n")  # ...and a new file of its name
        assert watch.changed()
    finally:
        watch.close()


def test_a_file_inotify_cannot_watch_is_looked_at_every_poll(
    tmp_path: Path, wake: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_watch(path: str) -> FileWatch:
        raise OSError(28, "inotify_add_watch: No space left on device")

    monkeypatch.setattr(kmsg, "FileWatch", no_watch)
    path = tmp_path / "kmsg"
    reader = opened(path)
    assert "No space left" in reader.watch_problem
    readable, took = waited(reader, wake[0], lambda: None)
    assert not readable and kmsg.POLL_S * 0.9 <= took < LONG_S / 2  # a look, every POLL_S
    reader.close()
    with pytest.raises(OSError, match="inotify_add_watch"):
        FileWatch(str(tmp_path / "missing-dir" / "kmsg"))


def test_a_symlinked_logs_target_rotated_is_seen(tmp_path: Path) -> None:
    target = tmp_path / "logs" / "real.log"
    target.parent.mkdir()
    target.write_bytes(b"")
    link = tmp_path / "kern.log"
    link.symlink_to(target)
    watch = FileWatch(str(link))
    try:
        target.rename(target.with_name("real.log.1"))
        assert watch.changed()
        target.write_bytes(b"4,1,10,-;fresh\n")  # the target's successor, in its directory
        assert watch.changed()
    finally:
        watch.close()


def test_a_record_written_while_a_rotated_file_is_reopened_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the look that finds the file replaced and the new watch, a write wakes nobody:
    the read after reopening must take it."""
    path = tmp_path / "kmsg"
    reader = opened(path, b"4,1,10,-;before\n")
    assert [r.seq for r in reader.read()] == [1]
    fresh = tmp_path / "kmsg.new"
    fresh.write_bytes(b"4,2,20,-;after rotation\n")
    fresh.rename(path)

    def watch_after_a_write(where: str) -> FileWatch:
        with open(where, "ab") as f:
            f.write(b"4,3,30,-;written meanwhile\n")
        return FileWatch(where)

    monkeypatch.setattr(kmsg, "FileWatch", watch_after_a_write)
    assert [r.message for r in reader.read()] == ["after rotation", "written meanwhile"]
    reader.close()


def test_a_file_truncated_and_refilled_past_where_it_was_read_is_read_again(
    tmp_path: Path,
) -> None:
    """copytruncate: the file cut to nothing, then written again to a greater size before
    the reader looked; the size alone would not tell."""
    path = tmp_path / "kmsg"
    reader = opened(path, b"4,1,10,-;one\n4,2,20,-;two\n")
    assert [r.message for r in reader.read()] == ["one", "two"]
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(b"4,7,70,-;new one\n4,8,80,-;new two\n")
    assert [r.message for r in reader.read()] == ["new one", "new two"]
    assert reader.restarts == 1
    with open(path, "ab") as f:  # then it grows as any log does
        f.write(b"4,9,90,-;three\n")
    assert [r.message for r in reader.read()] == ["three"]
    assert reader.restarts == 1


def test_a_fifo_or_another_device_is_refused_not_read(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    os.mkfifo(path)
    reader = KmsgReader(str(path))
    with pytest.raises(OSError, match="neither /dev/kmsg"):
        reader.open()  # at once: no writer is waited for
    # Another character device would be read as fast as a core can, for nothing.
    with pytest.raises(OSError, match="not /dev/kmsg"):
        KmsgReader("/dev/zero").open()


def test_records_left_or_a_rotation_under_way_do_not_wait_on_the_watch(
    tmp_path: Path, wake: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No watch tells of records a read left for the next (at its limit), nor of the first
    write to a rotated file's successor, which is not watched yet."""
    monkeypatch.setattr(kmsg, "MAX_RECORDS_A_READ", 1)
    path = tmp_path / "kmsg"
    reader = opened(path, b"4,1,10,-;one\n4,2,20,-;two\n")
    assert [r.seq for r in reader.read()] == [1]
    readable, took = waited(reader, wake[0], lambda: None)
    assert readable and took < LONG_S / 2  # at once
    assert [r.seq for r in reader.read()] == [2]
    path.rename(tmp_path / "kmsg.1")
    path.write_bytes(b"")  # logrotate's new file, before the writer is told
    assert reader.read() == []

    def writer_moves() -> None:
        with open(path, "ab") as f:
            f.write(b"4,3,30,-;in the new file\n")

    readable, took = waited(reader, wake[0], writer_moves)
    assert took < LONG_S / 2  # looked at every POLL_S
    assert [r.message for r in reader.read()] == ["in the new file"]
    reader.close()
