"""NVIDIA's XID catalog: what each error means, how serious it is, and what to do.

From NVIDIA's XID documentation for Ampere and newer (../shared/REFERENCE.md). The class says
what the XID does to the GPU: `critical` (the GPU needs a reset or more), `warning` (watch
it), `application` (an application fault; the GPU stays healthy), `info` (context for the XIDs
around it), and `driver` for XID 154, whose text carries the driver's recovery action.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Xid:
    code: int
    meaning: str
    xid_class: str
    action: str

    def as_data(self) -> dict[str, int | float | str]:
        """What an event carries about its XID."""
        return {
            "xid": self.code,
            "class": self.xid_class,
            "meaning": self.meaning,
            "action": self.action,
        }


def _entries() -> dict[int, Xid]:
    rows: list[tuple[tuple[int, ...], str, str, str]] = [
        ((8,), "GPU stopped processing (idle timeout)", "warning", "Restart the application."),
        ((13,), "Graphics engine exception, usually an application bug", "application",
         "Restart the application; if it repeats on the same GPU, run diagnostics."),
        ((31,), "GPU memory page fault (illegal address)", "application",
         "Restart the application; if it repeats on one GPU, run diagnostics."),
        ((32,), "Corrupted push buffer", "application", "Restart the application."),
        ((43,), "GPU stopped processing a channel; the GPU stays healthy", "application",
         "None needed."),
        ((45,), "Preemptive cleanup (kill, Ctrl-C, reset, or after a double-bit ECC error)",
         "info", "Correlate with the XID logged next to it."),
        ((46,), "GPU timeout", "critical", "Reset the GPU."),
        ((48,), "Double-bit ECC error", "critical",
         "Reset the GPU; together with XID 63 or 64, drain the node and reset."),
        ((61,), "Micro-controller breakpoint (unused on Ampere and newer)", "warning",
         "Contact NVIDIA support."),
        ((62,), "Micro-controller halt", "critical", "Reset the GPU."),
        ((63,), "Row remap or page retirement recorded", "info",
         "Nothing now; reset the GPU when convenient to activate it."),
        ((64,), "Row remap or page retirement failed", "critical",
         "Reset the GPU; if it recurs, RMA it."),
        ((68, 69), "Video decoder or graphics class error", "application",
         "Restart the application."),
        ((74,), "NVLink error", "critical", "Reset the GPU and check the link."),
        ((79,), "GPU has fallen off the bus", "critical",
         "Drain the node and reboot it; reseat or RMA the GPU if it does not come back."),
        ((92,), "Excessive single-bit ECC error rate", "warning", "Watch the trend."),
        ((94,), "Contained memory error (one application affected)", "warning",
         "Restart the application; reset the GPU when convenient."),
        ((95,), "Uncontained memory error", "critical", "Reset the GPU."),
        ((109,), "Context-switch timeout", "critical", "Reset the GPU."),
        ((110,), "Security fault", "critical", "Reset the GPU."),
        ((119,), "GSP RPC timeout", "critical", "Reset the GPU."),
        ((120,), "GSP error", "critical", "Reset the GPU."),
        ((121,), "C2C link error", "warning", "Contact NVIDIA support."),
        ((136,), "NVLink training failed", "critical",
         "Reset the GPU; inspect the link and its cables."),
        ((137,), "Illegal NVLink peer access, an application bug", "application",
         "Check the application."),
        ((140,), "Unrecovered ECC error escaped", "critical", "Reset the GPU."),
        ((143,), "GPU initialisation error", "critical", "Reset the GPU."),
        (tuple(range(144, 151)), "NVLink5 error (Blackwell)", "critical",
         "Decode the error registers; the link or the GPU is in a fatal state: reset the GPU."),
        ((154,), "The driver's recovery action changed (None, GPU Reset Required, Node "
         "Reboot Required, Drain P2P, Drain and Reset; newer drivers add IMEX domain recovery, "
         "bus reset and system reboot)", "driver",
         "Do what the driver's text says: it is authoritative."),
    ]  # fmt: skip
    return {code: Xid(code, meaning, cls, action) for codes, meaning, cls, action in rows
            for code in codes}  # fmt: skip


CATALOG: Mapping[int, Xid] = MappingProxyType(_entries())


# What this catalog is: a reader of "unknown to this catalog" must know how old it is.
CATALOG_VERSION = (
    "gpuwatch's XID catalog, from NVIDIA's XID documentation for Ampere and newer (R580)"
)


def lookup(code: int) -> Xid:
    """The catalog entry, or an honest 'unknown' for a code this catalog lacks. NVIDIA adds
    XIDs with new drivers (155, 156, 158 came after this catalog), so an unknown one is not
    harmless: the verdict holds the GPU degraded, as for a warning XID."""
    found = CATALOG.get(code)
    if found is not None:
        return found
    return Xid(
        code,
        f"Unknown to {CATALOG_VERSION}",
        "unknown",
        "Read the driver's text for it (`dmesg | grep -i xid`) and NVIDIA's XID catalog for "
        "this driver; until then treat the GPU as degraded.",
    )


def xid_event_text(code: int, gpu: int | None) -> tuple[str, dict[str, int | float | str]]:
    """The journal message and data of an XID event, whichever source saw it."""
    xid = lookup(code)
    return f"XID {code} on GPU {gpu}: {xid.meaning}", xid.as_data()
