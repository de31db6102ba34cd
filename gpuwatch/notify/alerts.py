"""The alerts the notifier works on, as the rules hand them over: firing or resolved, each
with the node's name, Alertmanager's fingerprint and its status."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatch.model import Labels

_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_SEPARATOR = 0xFF


def fingerprint(labels: Labels) -> str:
    """Prometheus's label-set fingerprint (FNV-1a 64 over sorted names and values), as the
    16 hex digits Alertmanager shows, so the same alert has the same id everywhere."""
    h = _FNV_OFFSET
    for name, value in sorted(labels):
        for part in (name, value):
            for byte in part.encode():
                h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
            h = ((h ^ _SEPARATOR) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


@dataclass(frozen=True, slots=True)
class NotifyAlert:
    labels: Labels  # sorted, with alertname and node
    annotations: tuple[tuple[str, str], ...]
    starts_at: float
    ends_at: float | None  # None while firing; when it resolved otherwise
    value: float
    fingerprint: str

    @property
    def firing(self) -> bool:
        return self.ends_at is None

    @property
    def status(self) -> str:
        return "firing" if self.ends_at is None else "resolved"

    def label(self, name: str) -> str:
        return dict(self.labels).get(name, "")

    def annotation(self, name: str) -> str:
        return dict(self.annotations).get(name, "")
