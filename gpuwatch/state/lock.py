"""The state directory made ready for one daemon: created private, checked writable, and
locked so that a second daemon on it is refused before it opens anything there."""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from gpuwatch.state.statedir import DIR_MODE

log = logging.getLogger(__name__)


class StateDirError(Exception):
    """The state directory cannot be used; the message says why and what to do."""


LOCK_NAME = ".lock"


class StateDirLock:
    """The state directory held by one daemon alone: an flock on its lock file, which the
    kernel releases when the process ends, however it ends. Taken before anything in the
    directory is opened, so a second daemon is refused before it touches the first's state."""

    def __init__(self, state: Path) -> None:
        self.path = state / LOCK_NAME
        self._fd = self._take(state)

    def _take(self, state: Path) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StateDirError(
                f"state directory {state} is in use by another gpuwatch (pid {holder});"
                " stop it, or give this one its own --state-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return fd

    def renew(self) -> None:
        """Take the lock again on a new file if the old one was deleted (the directory removed
        under the daemon): a lock on an unlinked file keeps no second daemon out."""
        if self._fd >= 0 and not self.path.exists():
            os.close(self._fd)
            self._fd = -1
            self._fd = self._take(self.path.parent)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def prepare_state_dir(path: str) -> tuple[Path, StateDirLock]:
    state = Path(path)
    hint = "pass --state-dir DIR or set state_dir in the config"
    try:
        state.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        probe = state / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise StateDirError(f"state directory {path}: {exc.strerror}; {hint}") from exc
    try:
        state.chmod(DIR_MODE)
    except OSError as exc:  # writable but not ours: say so, and go on
        log.warning("state directory %s: cannot make it private (%s)", path, exc.strerror)
    try:
        return state, StateDirLock(state)
    except OSError as exc:
        raise StateDirError(f"state directory {path}: {exc.strerror}; {hint}") from exc
