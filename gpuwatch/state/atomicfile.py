"""Small JSON state files in the state directory, replaced atomically (write, fsync, rename),
so a crash or a power cut leaves either the old file or the new one, never half of one."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gpuwatch.state.statedir import set_aside

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
    """The file's content, or None when it is missing or unreadable (logged: never fatal). A
    file that is not JSON is set aside, so the next write does not destroy it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as exc:  # not JSON, or not UTF-8
        set_aside_quietly(path, f"{what}: {exc}")
        return None
    except OSError as exc:
        log.warning("%s %s unreadable, starting without it: %s", what, path, exc)
        return None


def set_aside_quietly(path: Path, why: str) -> None:
    try:
        set_aside(path, why)
    except OSError as exc:
        log.warning("%s: damaged (%s) and cannot be set aside: %s", path, why, exc)


def read_json_records(path: Path, what: str, build: Callable[[Any], T]) -> list[T]:
    """The entries of a JSON list file, each built by `build`; an entry that does not build
    (a missing or mistyped field) is logged and skipped, the others kept."""
    data = read_json(path, what)
    if data is not None and not isinstance(data, list):
        set_aside_quietly(path, f"{what}: a list was expected, not {type(data).__name__}")
    out: list[T] = []
    for item in data if isinstance(data, list) else []:
        try:
            out.append(build(item))
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("%s %s: skipping an entry: %s", what, path, exc)
    return out
