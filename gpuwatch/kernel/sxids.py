"""gpuwatch_nvswitch_sxid_*: the SXids the kernel log showed, by NVSwitch, code and severity,
and when each was last printed; counted again from the journal at start, so a restart is
neither a new SXid for the rules nor forgets one."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from gpuwatch import metrics as m
from gpuwatch.model import Event, Sample

MAX_SXID_SERIES = 1000

_Key = tuple[str, str, str]  # the switch's PCI address, the code, the severity


class SxidCounts:
    def __init__(self, restored: Sequence[Event] = ()) -> None:
        self._counts: Counter[_Key] = Counter()
        self._last: dict[_Key, float] = {}
        for event in restored:
            if event.kind == "sxid":
                self.count(
                    str(event.data.get("pci_bus_id", "")),
                    str(event.data.get("sxid", "")),
                    str(event.data.get("severity", "")),
                    event.time,
                )

    def count(self, address: str, code: str, severity: str, when: float) -> None:
        key = (address, code, severity)
        if key in self._counts or len(self._counts) < MAX_SXID_SERIES:
            self._counts[key] += 1
            self._last[key] = max(when, self._last.get(key, when))

    def samples(self) -> Iterable[Sample]:
        for key, count in sorted(self._counts.items()):
            labels = (("pci_bus_id", key[0]), ("sxid", key[1]), ("severity", key[2]))
            yield Sample(m.NVSWITCH_SXID_ERRORS, labels, float(count))
            yield Sample(m.NVSWITCH_SXID_LAST, labels, self._last[key])
