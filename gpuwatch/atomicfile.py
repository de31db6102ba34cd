"""Small JSON state files in the state directory, replaced atomically (write, fsync, rename),
so a crash or a power cut leaves either the old file or the new one, never half of one."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

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
