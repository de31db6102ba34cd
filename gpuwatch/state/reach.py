"""Whether other local users can reach a path: every directory above it must let them search
it (the x bit). A push socket or a textfile directory inside the daemon's private state
directory (mode 0700, or systemd's /var/lib/private) is there, working, and of no use to the
jobs it is for."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def blocked_at(path: Path, gid: int | None = None) -> tuple[Path, int] | None:
    """The first directory above `path` (links resolved) that users other than its owner
    cannot search, with its mode; with `gid`, members of that group may search through its
    group bits instead. None when the way is open, or cannot be told."""
    for directory in reversed(Path(os.path.realpath(path)).parents):
        try:
            st = directory.stat()
        except OSError:
            return None  # not there yet, or not ours to look at: nothing can be told
        mode = stat.S_IMODE(st.st_mode)
        if mode & stat.S_IXOTH:
            continue
        if gid is not None and st.st_gid == gid and mode & stat.S_IXGRP:
            continue
        return directory, mode
    return None
