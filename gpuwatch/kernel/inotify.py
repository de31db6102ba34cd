"""Being told when a file changes (Linux inotify, through libc): a log file read as it grows
wakes its reader when it is written to, and costs nothing while nobody writes.

The file itself is watched for writes and for being moved or deleted; its directory for a file
of that name appearing (a rotated log's successor), and for a symlink, the directory of the
file it leads to as well. Python's standard library has no inotify, and the two calls needed
are plain C calls.
"""

from __future__ import annotations

import ctypes
import os
import struct
from typing import Any

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
FILE_MASK = IN_MODIFY | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF
DIRECTORY_MASK = IN_CREATE | IN_MOVED_TO
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name
READ_BYTES = 64 * 1024


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


class FileWatch:
    """A readable file descriptor (`fd`) while the file may have changed; `changed()` drains
    it. Raises OSError when inotify cannot be had (not Linux, the watch limit reached)."""

    def __init__(self, path: str) -> None:
        libc = _libc()
        try:
            init, add = libc.inotify_init1, libc.inotify_add_watch
        except AttributeError as exc:
            raise OSError(f"no inotify here: {exc}") from None
        fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1: " + os.strerror(ctypes.get_errno()))
        self.fd: int = fd
        self._names: dict[int, set[bytes]] = {}  # directory watch -> the names that matter
        try:
            self._add(add, path, FILE_MASK)  # follows a symlink to the file
            for where in {os.path.abspath(path), os.path.realpath(path)}:
                directory, name = os.path.split(where)
                wd = self._add(add, directory, DIRECTORY_MASK)
                self._names.setdefault(wd, set()).add(os.fsencode(name))
        except OSError:
            os.close(fd)
            raise

    def _add(self, add: Any, path: str, mask: int) -> int:
        wd = int(add(self.fd, os.fsencode(path), mask))
        if wd < 0:
            error = ctypes.get_errno()
            raise OSError(error, f"inotify_add_watch {path}: {os.strerror(error)}")
        return wd

    def changed(self) -> bool:
        """Whether an event since the last call concerns the file; takes them all."""
        hit = False
        while True:
            try:
                data = os.read(self.fd, READ_BYTES)
            except BlockingIOError:
                return hit
            if not data:
                return hit
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, _, _, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                # The file's own watch, the queue overflowing (wd -1), or its name created.
                names = self._names.get(wd)
                hit |= names is None or name in names

    def close(self) -> None:
        os.close(self.fd)
