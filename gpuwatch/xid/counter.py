"""gpuwatch_gpu_xid_errors_total: one increment per XID event, counted over the machine's boot.

Counted from the events themselves, whatever source reported them, and restored from the journal
at start, so a daemon restart neither drops the count nor resolves an XID alert.
"""

from __future__ import annotations

from collections.abc import Collection

from gpuwatch import metrics as m
from gpuwatch.model import Event, GpuState, Labels, Sample

# NVIDIA numbers XIDs one after another (the newest are near 170): every code below this has
# a series of its own. Above it, a GPU's first UNLISTED_PER_GPU codes have one too and the rest
# count together as xid="other": a log of made-up codes cannot make thousands of series.
OWN_SERIES_BELOW = 256
UNLISTED_PER_GPU = 16
OTHER = -1  # the code the rest count as


def fold(codes: Collection[int], code: int) -> int:
    """`code`, or OTHER, on a GPU that has counted `codes` so far."""
    if code < OWN_SERIES_BELOW or code in codes:
        return code
    above = sum(1 for c in codes if c >= OWN_SERIES_BELOW)
    return code if above < UNLISTED_PER_GPU else OTHER


def xid_label(code: int) -> str:
    return "other" if code == OTHER else str(code)


class XidCounter:
    def __init__(self) -> None:
        self._counts: dict[str, dict[int, int]] = {}

    def record(self, uuid: str, code: int) -> int:
        """Count one XID; returns the code it counts as (`code` or OTHER)."""
        counts = self._counts.setdefault(uuid, {})
        code = fold(counts, code)
        counts[code] = counts.get(code, 0) + 1
        return code

    def samples(self, gpus: list[GpuState]) -> list[Sample]:
        out: list[Sample] = []
        for gpu in gpus:
            for code, count in sorted(self._counts.get(gpu.info.uuid, {}).items()):
                labels = (*gpu.info.labels, ("xid", xid_label(code)))
                out.append(Sample(m.XID_ERRORS, labels, count))
        return out


HISTORY_STEP_S = 60.0  # one point a minute keeps a replayed series present (lookback is 5 m)


def xid_history(events: list[Event], now: float, since: float) -> list[tuple[float, list[Sample]]]:
    """The counters' past, replayed from this boot's XID events into batches for the store,
    so after a restart the rules see the same history as before it: an XID from hours ago
    does not look new, and one from two minutes ago still does. Times run from `since` (the
    store's retention) to just before `now`."""
    if not events:
        return []
    steps = int((now - since) // HISTORY_STEP_S)
    times = {since + i * HISTORY_STEP_S for i in range(steps)}
    times |= {e.time for e in events if since < e.time < now}
    times = {t for t in times if t < now}
    ordered = sorted(events, key=lambda e: e.time)
    out: list[tuple[float, list[Sample]]] = []
    counts: dict[Labels, int] = {}
    codes: dict[str, set[int]] = {}  # by GPU, as XidCounter folds them
    i = 0
    for t in sorted(times):
        while i < len(ordered) and ordered[i].time <= t:
            event = ordered[i]
            code = event.data.get("xid")
            # An XID of a GPU no index was known for (the kernel log's, for a GPU the driver
            # did not list) is journaled but counted on no series, as when it happened.
            if event.uuid and event.gpu is not None and isinstance(code, int):
                seen = codes.setdefault(event.uuid, set())
                code = fold(seen, code)
                seen.add(code)
                labels = (("gpu", str(event.gpu)), ("uuid", event.uuid), ("xid", xid_label(code)))
                counts[labels] = counts.get(labels, 0) + 1
            i += 1
        if counts:
            out.append((t, [Sample(m.XID_ERRORS, labels, n) for labels, n in counts.items()]))
    return out
