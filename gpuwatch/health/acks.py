"""Causes an operator has acknowledged, kept in `acks.json` in the state directory.

An acknowledgement names a GPU (by UUID, or "" for the node), a cause key, and the cause's
fingerprint and state when it was given. It holds while the fingerprint is unchanged and the
state no worse (a degraded NVLink acknowledged does not hide the storm that follows), and is
dropped once the cause clears, so the next occurrence is reported again.

A GPU that does not answer (lost, unresponsive, failing every call) is not a fact to take note
of but a state that ends by itself when the GPU answers again: those causes cannot be
acknowledged, and an acknowledgement of one kept from an older gpuwatch covers nothing. A node
with such a GPU is not a node to put back into service.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuwatch.health.verdict import SEVERITY, Cause, Health
from gpuwatch.state.atomicfile import read_json_records, write_json

log = logging.getLogger(__name__)

FILE_NAME = "acks.json"
# The causes of a GPU that does not answer: they clear when it answers (after a reset, or a
# reboot) and only then.
WHILE_DOWN = frozenset({"gpu-lost", "gpu-unresponsive", "gpu-nvml-error"})


def acknowledgeable(key: str) -> bool:
    return key not in WHILE_DOWN


@dataclass(frozen=True, slots=True)
class Ack:
    uuid: str
    key: str
    fingerprint: str
    time: float
    note: str = ""
    state: str = Health.UNHEALTHY.value  # files written before states were kept: any state


def _ack_from_json(item: Any) -> Ack:
    return Ack(
        str(item["uuid"]),
        str(item["key"]),
        str(item["fingerprint"]),
        float(item["time"]),
        str(item.get("note", "")),
        Health(item.get("state", Health.UNHEALTHY.value)).value,
    )


class AckStore:
    def __init__(self, state_dir: Path | None) -> None:
        self.path = state_dir / FILE_NAME if state_dir is not None else None
        self._acks: dict[tuple[str, str], Ack] = {}
        if self.path is not None:
            self._load(self.path)

    def _load(self, path: Path) -> None:
        for ack in read_json_records(path, "acknowledgements", _ack_from_json):
            self._acks[(ack.uuid, ack.key)] = ack

    def _save(self) -> None:
        if self.path is None:
            return
        try:
            write_json(self.path, [asdict(a) for a in self._acks.values()])
        except OSError as exc:
            log.error("acknowledgements %s: cannot write: %s", self.path, exc)

    def __iter__(self) -> Iterator[Ack]:
        return iter(list(self._acks.values()))

    def add(self, uuid: str, cause: Cause, time: float, note: str) -> Ack:
        ack = Ack(uuid, cause.key, cause.fingerprint, time, note, cause.state.value)
        self._acks[(uuid, cause.key)] = ack
        self._save()
        return ack

    def covers(self, uuid: str, cause: Cause) -> bool:
        ack = self._acks.get((uuid, cause.key))
        return (
            ack is not None
            and acknowledgeable(cause.key)
            and ack.fingerprint == cause.fingerprint
            and SEVERITY[cause.state] <= SEVERITY[Health(ack.state)]
        )

    def keep_only(self, uuid: str, present: set[str]) -> None:
        """Forget this GPU's acknowledgements whose cause has cleared."""
        gone = [k for k in self._acks if k[0] == uuid and k[1] not in present]
        for k in gone:
            del self._acks[k]
        if gone:
            self._save()
