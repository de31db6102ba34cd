"""Small JSON state files in the state directory, replaced atomically (write, fsync, rename),
so a crash or a power cut leaves either the old file or the new one, never half of one."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


def write_json(path: Path, payload: Any) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path, what: str) -> Any:
    """The file's content, or None when it is missing or unreadable (logged: never fatal)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s %s unreadable, starting without it: %s", what, path, exc)
        return None


def read_json_records(path: Path, what: str, build: Callable[[Any], T]) -> list[T]:
    """The entries of a JSON list file, each built by `build`; an entry that does not build
    (a missing or mistyped field) is logged and skipped, the others kept."""
    data = read_json(path, what)
    out: list[T] = []
    for item in data if isinstance(data, list) else []:
        try:
            out.append(build(item))
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("%s %s: skipping an entry: %s", what, path, exc)
    return out
