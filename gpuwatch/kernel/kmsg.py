"""Reading kernel log records from /dev/kmsg, or from a regular file that grows (a test's, the
simulator's, or a saved log replayed).

/dev/kmsg hands out one record a read, from the oldest the kernel still holds; a reader that
falls behind the ring buffer gets EPIPE once and goes on from the oldest left. A file is read
from its start, then as it grows; a file replaced or truncated (log rotation) is read again from
its start (a replaced one once the old file's last records are read). Reads are bounded: one
call returns at most MAX_RECORDS_A_READ records.

Waiting for a record: /dev/kmsg is polled; a file is watched with inotify, or looked at every
POLL_S where inotify cannot watch it. Another thread ends a wait at once through `wake_fd`.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import time
import zlib
from dataclasses import dataclass

from gpuwatch.kernel.inotify import FileWatch
from gpuwatch.kernel.records import MAX_RECORD_BYTES, Record, parse_record, split_records

MAX_RECORDS_A_READ = 10_000
KMSG_DEVICE = (1, 11)  # /dev/kmsg's major and minor, wherever a container mounts it
MAX_FILE_BYTES_A_READ = 4 * 1024 * 1024
POLL_S = 0.5  # how often a file inotify cannot watch is looked at
# A file truncated and written again past where it was read (copytruncate rotation) has the
# size it had: the first bytes already read, looked at again, tell it apart.
HEAD_BYTES = 64


@dataclass
class ReadCounts:
    records: int = 0
    overwritten: int = 0  # times the kernel overwrote records before they were read (EPIPE)


class KmsgReader:
    """Blocking reads of one path; used from one thread at a time."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.counts = ReadCounts()
        self._fd: int | None = None
        self._watch: FileWatch | None = None
        self.watch_problem = ""  # why a file is looked at every POLL_S, not watched
        self._device = False
        self._inode: tuple[int, int] | None = None
        self._offset = 0
        self._head = b""  # the file's first bytes read (up to HEAD_BYTES)
        self._line = 0  # lines read from a plain file: a record's number is its first line's
        self._first: int | None = None  # the CRC-32 of a plain file's first line, once read
        self.restarts = 0  # times a file was replaced or truncated and read from its start
        self._left_at: int | None = None  # a replaced file's size once its successor was seen
        self._rotating = False  # the file was replaced: read on, then its successor
        self._more = False  # the last read stopped short of what is there: read again at once

    def open(self) -> None:
        """Open the path; raises OSError (missing, not permitted) for the caller to report."""
        self.close()
        info = os.stat(self.path)
        self._device = stat.S_ISCHR(info.st_mode)
        if not self._device and not stat.S_ISREG(info.st_mode):
            # A FIFO's open would block until a writer came, and hold up the daemon's start.
            raise OSError(errno.EINVAL, "neither /dev/kmsg (a character device) nor a file")
        if self._device and (os.major(info.st_rdev), os.minor(info.st_rdev)) != KMSG_DEVICE:
            # /dev/zero or /dev/urandom would be read as fast as a core can, for nothing.
            raise OSError(errno.EINVAL, "a character device, but not /dev/kmsg (1:11)")
        # Non-blocking for a file too: a FIFO put in its place after the look above.
        self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self._inode = (info.st_dev, info.st_ino)
        self._offset = 0
        self._line = 0
        self._first = None
        self._head = b""
        self._left_at = None
        self._rotating = False
        if not self._device:
            # Else once its first line is whole, as it is read.
            self._first = _first_line_crc(os.pread(self._fd, MAX_RECORD_BYTES, 0))
            try:
                self._watch = FileWatch(self.path)
                self.watch_problem = ""
            except OSError as exc:
                self.watch_problem = str(exc)

    def skip_to_end(self) -> None:
        """Take a file as read up to its last whole line."""
        assert self._fd is not None and not self._device
        size = os.fstat(self._fd).st_size
        at = end = lines = 0
        while at < size and (data := os.pread(self._fd, min(1 << 20, size - at), at)):
            lines += data.count(b"\n")
            if (last := data.rfind(b"\n")) >= 0:
                end = at + last + 1
            at += len(data)
        self._offset, self._line = end, lines
        self._head = os.pread(self._fd, min(HEAD_BYTES, end), 0)

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    @property
    def is_device(self) -> bool:
        return self._device

    @property
    def identity(self) -> str:
        """Which log the records' numbers belong to: "" for /dev/kmsg (numbered for the whole
        boot); for a file (numbered by line), its device and inode, and once read a checksum
        of its first line: a file deleted and written again while gpuwatch was stopped may get
        the same inode, and is another log all the same."""
        if self._device or self._inode is None:
            return ""
        first = "" if self._first is None else f":{self._first:08x}"
        return f"{self._inode[0]}:{self._inode[1]}{first}"

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self) -> list[Record]:
        """The records available now, oldest first (at most MAX_RECORDS_A_READ)."""
        if self._fd is None:
            raise OSError(errno.EBADF, "not open")
        self._more = False
        records = self._read_device() if self._device else self._read_file()
        self.counts.records += len(records)
        return records

    def wait(self, timeout: float, wake_fd: int) -> bool:
        """Until a record may be there (True), `wake_fd` is readable or `timeout` seconds
        pass (False; real time: this waits on the kernel, not on the daemon's clock)."""
        if self._fd is None:
            return False
        if self._more:
            return True
        if self._rotating:  # what the successor is given tells no watch: looked at often
            timeout = min(timeout, POLL_S)
        watch = self._watch
        if not self._device and watch is None:  # a file is always "readable": poll its size
            select.select([wake_fd], [], [], min(timeout, POLL_S))
            return False
        poller = select.poll()
        poller.register(self._fd if watch is None else watch.fd, select.POLLIN)
        poller.register(wake_fd, select.POLLIN)
        end = time.monotonic() + timeout
        while True:
            ready = poller.poll(max(0.0, end - time.monotonic()) * 1000)
            if not ready or any(fd == wake_fd for fd, _ in ready):
                return False
            # Another file of the directory created is no reason to look at this one.
            if watch is None or watch.changed():
                return True

    def _read_device(self) -> list[Record]:
        assert self._fd is not None
        out: list[Record] = []
        while len(out) < MAX_RECORDS_A_READ:
            try:
                chunk = os.read(self._fd, MAX_RECORD_BYTES)
            except BlockingIOError:
                break
            except BrokenPipeError:  # records were overwritten before we read them
                self.counts.overwritten += 1
                continue
            if not chunk:
                break
            record = parse_record(chunk)
            if record is not None:
                out.append(record)
        return out

    def _read_file(self) -> list[Record]:
        assert self._fd is not None
        try:
            info: os.stat_result | None = os.stat(self.path)
        except FileNotFoundError:
            info = None  # being rotated: the new file is read once it is there
        if info is None or (info.st_dev, info.st_ino) != self._inode:
            return self._read_replaced(info)
        self._rotating, self._left_at = False, None  # this file again (a rotation undone)
        if info.st_size < self._offset or (
            bool(self._head) and self._head != os.pread(self._fd, len(self._head), 0)
        ):  # truncated (and maybe written again past where it was read)
            return self._from_start()
        if info.st_size == self._offset:
            return []  # nothing new: the common case
        return self._records_to(info.st_size)

    def _read_replaced(self, successor: os.stat_result | None) -> list[Record]:
        """The file was renamed away (rotated) or removed. Its writer goes on writing to it
        until told to open the new file, so it is read on. Once the new file has records, it
        is read to where it ended then (a writer never told would otherwise keep the new file
        unread), and the new file from its start."""
        assert self._fd is not None
        self._rotating = True
        end = os.fstat(self._fd).st_size
        # logrotate creates the new file empty before it tells the writer: not moved yet.
        moved = successor is not None and successor.st_size > 0
        if moved:
            self._left_at = end if self._left_at is None else self._left_at
            end = min(end, self._left_at)
        before = self._offset
        if end > before:
            records = self._records_to(end)
            if self._offset > before:
                self._more = self._more or moved  # the next read goes on, or moves over
                return records
        if not moved:
            return []
        return self._from_start()  # the new file (a line left half-written is dropped)

    def _from_start(self) -> list[Record]:
        """The path opened again and read from its start (a replaced or truncated file)."""
        self.open()
        self.restarts += 1
        assert self._fd is not None
        # Its size now: what was written between the look that found it replaced and the
        # new watch would wake nobody.
        return self._records_to(os.fstat(self._fd).st_size)

    def _records_to(self, end: int) -> list[Record]:
        """The whole records from where reading got to, up to `end` (a read's worth)."""
        assert self._fd is not None
        base = self._offset
        data = os.pread(self._fd, min(MAX_FILE_BYTES_A_READ, end - base), base)
        out: list[Record] = []
        if base == 0 and self._first is None:
            self._first = _first_line_crc(data)
        for chunk, past in split_records(data):
            # Numbered by its first line, not counted: a message whose continuation lines came
            # in later writes was read as several records, and is one when read again.
            number = self._line + 1
            self._line += chunk.count(b"\n") + 1
            self._offset = base + past
            record = parse_record(chunk, number)
            if record is not None:
                out.append(record)
            if len(out) >= MAX_RECORDS_A_READ:
                break
        if self._offset == base and len(data) == MAX_FILE_BYTES_A_READ:
            self._offset += len(data)  # a "line" longer than a read: skip it, not stall on it
        # Stopped at a limit with whole records left: no watch would say so.
        self._more = base < self._offset < end
        if len(self._head) < HEAD_BYTES:
            self._head = os.pread(self._fd, min(HEAD_BYTES, self._offset), 0)
        return out


def _first_line_crc(data: bytes) -> int | None:
    """The CRC-32 of the first line of `data`, a file's first bytes; None until it is whole."""
    line, newline, _ = data.partition(b"\n")
    return zlib.crc32(line) if newline else None


def open_problem(path: str, exc: OSError) -> str:
    """Why `path` could not be opened, as the log and the API say it."""
    if isinstance(exc, PermissionError) and path.startswith("/dev/"):
        return (
            f"{path}: permission denied: reading the kernel log needs CAP_SYSLOG "
            "(the shipped systemd unit grants it) or kernel.dmesg_restrict=0"
        )
    return f"{path}: {exc.strerror or exc}"
