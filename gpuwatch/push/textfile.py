"""node_exporter's textfile convention: `*.prom` files in a directory, written to a temporary
name and renamed into place, so a reader never sees half a file. Each file is one job, named
after the file (`llama.prom` is job "llama"); a file is parsed again only when it changes."""

from __future__ import annotations

import logging
from pathlib import Path

from gpuwatch.model import Sample
from gpuwatch.push.parse import PushError, check_job, parse_text

log = logging.getLogger(__name__)


class TextfileDir:
    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._files: dict[Path, tuple[float, str, list[Sample]]] = {}  # mtime, job, samples
        self._complained: set[tuple[Path, float]] = set()

    def read(self) -> dict[str, list[Sample]]:
        """job -> its samples, for every readable, valid file present now."""
        try:
            paths = sorted(self.path.glob("*.prom"))
        except OSError as exc:
            self._complain(self.path, 0.0, f"cannot list: {exc.strerror}")
            return {}
        for gone in self._files.keys() - set(paths):
            del self._files[gone]
        out: dict[str, list[Sample]] = {}
        for path in paths:
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue  # renamed away between listing and reading
            cached = self._files.get(path)
            if cached is None or cached[0] != mtime:
                cached = self._parse(path, mtime)
                if cached is None:
                    continue
                self._files[path] = cached
            out.setdefault(cached[1], []).extend(cached[2])
        return out

    def _parse(self, path: Path, mtime: float) -> tuple[float, str, list[Sample]] | None:
        try:
            job = check_job(path.stem)
            if path.stat().st_size > self.max_bytes:
                raise PushError(413, f"larger than {self.max_bytes} bytes")
            return mtime, job, parse_text(path.read_bytes(), job)
        except PushError as exc:
            self._complain(path, mtime, str(exc))
        except OSError as exc:
            self._complain(path, mtime, f"cannot read: {exc.strerror}")
        return None

    def _complain(self, path: Path, mtime: float, why: str) -> None:
        if (path, mtime) not in self._complained:  # once per version of the file
            self._complained.add((path, mtime))
            log.warning("textfile %s left out: %s", path, why)
