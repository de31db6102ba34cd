"""gpuwatch_gpu_xid_errors_total: one increment per XID event, counted over the machine's boot.

Counted from the events themselves, whatever source reported them, and restored from the journal
at start, so a daemon restart neither drops the count nor resolves an XID alert.
"""

from __future__ import annotations

from gpuwatch import metrics as m
from gpuwatch.model import GpuState, Sample


class XidCounter:
    def __init__(self) -> None:
        self._counts: dict[str, dict[int, int]] = {}

    def record(self, uuid: str, code: int) -> None:
        counts = self._counts.setdefault(uuid, {})
        counts[code] = counts.get(code, 0) + 1

    def samples(self, gpus: list[GpuState]) -> list[Sample]:
        out: list[Sample] = []
        for gpu in gpus:
            for code, count in sorted(self._counts.get(gpu.info.uuid, {}).items()):
                out.append(Sample(m.XID_ERRORS, (*gpu.info.labels, ("xid", str(code))), count))
        return out
