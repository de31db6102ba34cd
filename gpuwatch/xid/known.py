"""Looking an XID up: the catalog's entry, or an honest 'unknown'."""

from __future__ import annotations

from gpuwatch.xid.catalog import CATALOG, CATALOG_VERSION
from gpuwatch.xid.entry import UNKNOWN, Xid


def lookup(code: int) -> Xid:
    """The catalog entry, or an honest 'unknown' for a code this catalog lacks. NVIDIA adds
    XIDs with new drivers (155, 156, 158 came after the first catalogs), so an unknown one is
    not harmless: the verdict holds the GPU degraded, as for a warning XID."""
    found = CATALOG.get(code)
    if found is not None:
        return found
    return Xid(
        code,
        f"Unknown to {CATALOG_VERSION}",
        UNKNOWN,
        "Read the driver's text for it (`dmesg | grep -i xid`) and NVIDIA's XID catalog for "
        "this driver; until then treat the GPU as degraded.",
    )


# XIDs a program's own fault raises, with no error counter or state of the GPU changed:
# NVIDIA's Kubernetes device plugin skips these when it judges a GPU, less 109 (a context
# switch timeout), which this catalog holds critical.
APPLICATION_FAULTS = frozenset({13, 31, 43, 45, 68})


def xid_event_text(code: int, gpu: int | None) -> tuple[str, dict[str, int | float | str]]:
    """The journal message and data of an XID event, whichever source saw it."""
    xid = lookup(code)
    return f"XID {code} on GPU {gpu}: {xid.meaning}", xid.as_data()
