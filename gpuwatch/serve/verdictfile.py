"""The node's verdict line in a file, `STATE_DIR/verdict`, as `gpuwatch health` prints it:
for what cannot ask the daemon (node-problem-detector's image has bash but no Python and no
TLS; a host's own scripts). Rewritten, atomically, when the line changes; its modification
time renewed every TOUCH_EVERY_S while the daemon samples, so a file older than that means
a daemon that stopped, never a verdict still true."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatch.health.line import health_line
from gpuwatch.health.view import NodeView
from gpuwatch.text.printable import one_line

log = logging.getLogger(__name__)

FILE_NAME = "verdict"
TOUCH_EVERY_S = 10.0
MAX_CHARS = 1024


class VerdictFile:
    def __init__(self, state_dir: Path, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path = state_dir / FILE_NAME
        # Renewals by the monotonic clock: the wall clock stepped back an hour would leave the
        # file unrenewed for that hour, and node-problem-detector reading it as a dead daemon.
        self._monotonic = monotonic
        self._key: object = None
        self._touched = float("-inf")
        self._failed = False

    def after_cycle(self, _now: float, view: NodeView) -> None:
        """A few comparisons unless the verdict changed or a touch is due."""
        now = self._monotonic()
        gpus = view.batch.gpus if view.batch is not None else ()
        key = (view.node_verdict, tuple((g.info.index, g.status) for g in gpus))
        try:
            if key != self._key:
                self._write(one_line(health_line(_inputs(view)), MAX_CHARS))
                self._key = key
            elif now - self._touched >= TOUCH_EVERY_S:
                os.utime(self.path)
            else:
                return
            self._touched = now
            self._failed = False
        except OSError as exc:
            self._key = None  # written again once the disk takes it
            if not self._failed:
                log.error("cannot write the verdict file %s: %s", self.path, exc.strerror)
            self._failed = True

    def _write(self, line: str) -> None:
        temporary = self.path.with_name(f".{FILE_NAME}.tmp")
        temporary.write_text(line + "\n", encoding="utf-8")
        os.replace(temporary, self.path)


def _inputs(view: NodeView) -> dict[str, Any]:
    """What health_line reads of the node's payload, without the cost of the rest."""
    verdict = view.node_verdict
    gpus = view.batch.gpus if view.batch is not None else ()
    if verdict is None:
        return {"reasons": ["no sample taken yet"]}
    return {
        "verdict": verdict.state.value,
        "reasons": verdict.reasons,
        "actions": verdict.actions,
        "acknowledged": [{"reason": c.reason} for c in verdict.acknowledged],
        "gpus": [{"index": g.info.index, "status": g.status.value} for g in gpus],
    }
