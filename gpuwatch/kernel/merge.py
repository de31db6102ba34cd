"""One fault, one event: an XID (or a lost GPU) that NVML and the kernel log both report.

The driver prints every XID to the kernel log and hands it to NVML's event waiters; gpuwatch
reads both, because either can be missing (NVML hangs; a container has no kernel log). Both
reports of one XID arrive within moments of each other, in either order. The first is
published at once, as it arrives; a report from the other source of the same fault on the same
GPU within WINDOW_S is its twin, paired one to one, so a GPU that logs the same XID ten times
counts ten, not twenty. A twin from the kernel log still has the driver's own text: it is
journaled as a `kernel_log` event, which counts nothing.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from gpuwatch.clock import Clock
from gpuwatch.model import Event
from gpuwatch.xid.counter import OWN_SERIES_BELOW as NUMBERED_BELOW

log = logging.getLogger(__name__)

WINDOW_S = 300.0  # a hung GPU's NVML events come when the hang ends
MERGED_KINDS = frozenset({"xid", "gpu_lost"})
KERNEL_LOG = "kernel_log"
MAX_UNPAIRED = 256  # reports awaiting their twin, per fault and GPU
# Faults and GPUs with reports awaiting a twin: 8 GPUs with a few XIDs each need dozens, and
# with every code NVIDIA numbers (below 256) 2,056. A log of thousands of made-up codes makes
# room by forgetting the oldest that no twin can come for any more or that NVIDIA has not
# numbered, else the fault first reported.
MAX_KEYS = 4096


def source_of(event: Event) -> str:
    return str(event.data.get("source", "nvml"))


class EventMerger:
    """Sits between the sources and the event log: `publish` is what sources are handed."""

    def __init__(self, clock: Clock, publish: Callable[[Event], None]) -> None:
        self._clock = clock
        self._publish = publish
        # (kind, uuid, xid) -> reports not yet paired: (arrival, source)
        self._unpaired: dict[tuple[str, str, str], deque[tuple[float, str]]] = {}
        self.merged = 0

    def publish(self, event: Event) -> None:
        if event.kind not in MERGED_KINDS or not event.uuid:
            self._publish(event)
            return
        now = self._clock.now()
        key = (event.kind, event.uuid, str(event.data.get("xid", "")))
        source = source_of(event)
        waiting = self._unpaired.get(key)
        if waiting is None:
            if len(self._unpaired) >= MAX_KEYS:
                del self._unpaired[self._least_needed(now)]
            waiting = self._unpaired[key] = deque(maxlen=MAX_UNPAIRED)
        while waiting and waiting[0][0] < now - WINDOW_S:
            waiting.popleft()
        twin = next((i for i, (_, s) in enumerate(waiting) if s != source), None)
        if twin is None:
            waiting.append((now, source))
            self._publish(event)
            return
        del waiting[twin]
        if not waiting:
            del self._unpaired[key]
        self.merged += 1
        log.debug("%s reported by %s too: counted once", event.message, source)
        if source == KERNEL_LOG:  # keep the driver's words, as an event that counts nothing
            text = event.data.get("driver_text", "")
            self._publish(replace(event, kind=KERNEL_LOG, message=f"kernel log: {text}"))

    def _least_needed(self, now: float) -> tuple[str, str, str]:
        for key, waiting in self._unpaired.items():  # oldest first
            expired = not waiting or waiting[-1][0] < now - WINDOW_S
            if expired or (key[2].isdigit() and int(key[2]) >= NUMBERED_BELOW):
                return key
        return next(iter(self._unpaired))
