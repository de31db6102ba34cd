"""One XID as the catalog describes it, and what its class means for the GPU."""

from __future__ import annotations

from dataclasses import dataclass

CRITICAL = "critical"  # the GPU needs a reset or the node a reboot
WARNING = "warning"  # contact support or check the hardware: something is wearing
APPLICATION = "application"  # a program's fault: the GPU stays healthy
INFO = "info"  # context for the XIDs around it
DRIVER = "driver"  # XID 154: the driver's text says what to do
UNKNOWN = "unknown"  # a newer driver's, not in this catalog
CLASSES = (CRITICAL, WARNING, APPLICATION, INFO, DRIVER)

# A warning XID (or one the catalog lacks) holds its GPU degraded this long after it was last
# seen; a critical one holds it unhealthy until the GPU is reset.
WARNING_HOLD_S = 3600.0


@dataclass(frozen=True, slots=True)
class Xid:
    code: int
    meaning: str
    xid_class: str
    action: str

    @property
    def holds_until_reset(self) -> bool:
        return self.xid_class == CRITICAL

    @property
    def holds_for_a_while(self) -> bool:
        """Degraded for WARNING_HOLD_S: wear, or a code no one here can judge."""
        return self.xid_class in (WARNING, UNKNOWN)

    def as_data(self) -> dict[str, int | float | str]:
        """What an event carries about its XID."""
        return {
            "xid": self.code,
            "class": self.xid_class,
            "meaning": self.meaning,
            "action": self.action,
        }
