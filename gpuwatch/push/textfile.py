"""node_exporter's textfile convention: `*.prom` files in a directory, written to a temporary
name and renamed into place, so a reader never sees half a file. Each file is one job, named
after the file (`llama.prom` is job "llama"); a file is parsed again only when it changes.

Whoever can write into the directory must not be able to stop or read through the daemon:
only regular files are read (a FIFO would block the read, `/dev/zero` would never end), a
symlink is followed only to a file in the same directory (one to a secret elsewhere would put
its lines in /metrics), at most `max_bytes` are read of a file and `MAX_FILES` files of the
directory, and a file's content never reaches the log. `read` does blocking I/O: the daemon
calls it off the event loop.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from gpuwatch.model import Sample
from gpuwatch.push.parse import PushError, check_job, parse_text

log = logging.getLogger(__name__)

MAX_FILES = 1000


class TextfileDir:
    def __init__(self, path: Path, max_bytes: int, max_files: int = MAX_FILES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.max_files = max_files
        self._files: dict[Path, tuple[float, str, list[Sample]]] = {}  # mtime, job, samples
        self._complained: set[tuple[Path, float]] = set()

    def read(self) -> dict[str, list[Sample]]:
        """job -> its samples, for every readable, valid file present now."""
        try:
            paths = sorted(self.path.glob("*.prom"))
        except OSError as exc:
            self._complain(self.path, 0.0, f"cannot list: {exc.strerror}")
            return {}
        if len(paths) > self.max_files:
            self._complain(
                self.path,
                float(len(paths)),
                f"{len(paths)} files; only the first {self.max_files} by name are read",
            )
            paths = paths[: self.max_files]
        present = set(paths)
        for gone in self._files.keys() - present:
            del self._files[gone]
        self._complained = {c for c in self._complained if c[0] in present or c[0] == self.path}
        out: dict[str, list[Sample]] = {}
        for path in paths:
            try:
                mtime = path.stat().st_mtime  # through a link: the target's
            except OSError:
                continue  # renamed away between listing and reading, or a dangling link
            cached = self._files.get(path)
            if cached is None or cached[0] != mtime:
                cached = self._parse(path, mtime)
                if cached is None:
                    self._files.pop(path, None)
                    continue
                self._files[path] = cached
            out.setdefault(cached[1], []).extend(cached[2])
        return out

    def _parse(self, path: Path, mtime: float) -> tuple[float, str, list[Sample]] | None:
        try:
            job = check_job(path.stem)
            body = self._read(path)
            return mtime, job, parse_text(body, job)
        except PushError as exc:
            # The parser's message quotes the offending line: a file's content stays out of the
            # log, whatever the file is.
            why = str(exc) if exc.status != 400 or "job:" in str(exc) else "not valid text format"
            self._complain(path, mtime, why)
        except OSError as exc:
            self._complain(path, mtime, f"cannot read: {exc.strerror}")
        return None

    def _read(self, path: Path) -> bytes:
        target = path
        if path.is_symlink():
            target = path.resolve()
            if target.parent != self.path.resolve():
                raise PushError(403, "a symlink out of the textfile directory is not followed")
        # O_NONBLOCK: opening a FIFO does not wait for a writer; O_NOFOLLOW: the file checked
        # is the file read.
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise PushError(403, "not a regular file")
            with os.fdopen(fd, "rb", closefd=False) as f:
                body = f.read(self.max_bytes + 1)
        finally:
            os.close(fd)
        if len(body) > self.max_bytes:
            raise PushError(413, f"larger than {self.max_bytes} bytes (push.max_body_bytes)")
        return body

    def _complain(self, path: Path, mtime: float, why: str) -> None:
        if (path, mtime) not in self._complained:  # once per version of the file
            self._complained.add((path, mtime))
            log.warning("textfile %s left out: %s", path, why)
