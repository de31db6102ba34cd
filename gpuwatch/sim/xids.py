"""What an `xid` fault prints beyond its number: an NVLink5 XID's unit and severity (144-150),
and the MIG instance the driver attributes an XID to.

XIDs 144-150 name the NVLink5 unit that failed and whether it was fatal, in text NVML's event
does not carry: `NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13
(0x0409a0c2 0x00000008 ...)` (real lines in tests/fixtures/kmsg/gpud-pr1174.log). The units,
their codes and the error status of each are the rows of the "XID 144-150 Decode" sheet of
NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html); the first
word of the parentheses, the interrupt info, carries the unit: bits 9:5 and the XID less 143
in bits 4:0 before R575, the unit in bits 6:0 from R575.

An XID the driver attributes to a MIG instance is printed `NVRM: Xid (PCI:0000:01:00
GPU-I:05): 94, ...` (krcReportXid in the open driver's src/nvidia/src/kernel/gpu/rc/kernel_rc.c);
an `xid` fault on a GPU in MIG mode says which instance with `instance:`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gpuwatch.text.yamlfile import Checker, PathKey, one_of, whole_number


class Unit(NamedTuple):
    name: str
    v1: int  # interrupt info bits 9:5 before R575
    v2: int  # bits 6:0 from R575
    status: int  # the sheet's first error status for the unit
    fatal: bool  # at that status (a scenario picks a unit, and with it the severity)


# XID -> its units, the first the default (the decode sheet's rows).
NVLINK5_UNITS: dict[int, tuple[Unit, ...]] = {
    144: (Unit("SAW_MVB", 1, 1, 0x1, False),),
    145: (Unit("RLW_RXPIPE", 6, 6, 0x1, False), Unit("RLW_CTRL", 3, 3, 0x80000000, False),
          Unit("RLW_REMAP", 4, 4, 0x1, False), Unit("RLW_RSPCOL", 5, 5, 0x1, False),
          Unit("RLW_SRC_TRACK", 7, 7, 0x1, True), Unit("RLW_TAGSTATE", 8, 8, 0x1, False)),
    146: (Unit("TLW_CTRL", 9, 9, 0x1, False), Unit("TLW_RX/TLW_RX_PIPE0", 10, 10, 0x1, False),
          Unit("TLW_TX/TLW_TX_PIPE0", 11, 12, 0x1, False)),
    147: (Unit("TREX", 12, 14, 0x1, False),),
    148: (Unit("NVLPW_CTRL/NVLPW", 0, 15, 0x80000000, False),),
    149: (Unit("NETIR_LINK_EVT", 14, 17, 0x0, True), Unit("NETIR", 0, 24, 0x0, True),
          Unit("NETIR_BER_EVENT", 17, 19, 0x0, False), Unit("NETIR_MFDE_EVENT", 18, 20, 0x1, True)),
    150: (Unit("MSE_WATCHDOG", 0, 0, 0x0, True),),
}  # fmt: skip
XID_KEYS = ("unit", "link", "instance")  # what an xid fault may say beyond its code


def xid_details(
    c: Checker, data: dict[str, Any], path: PathKey, code: int | None
) -> dict[str, Any]:
    """An xid fault's unit and link (NVLink5 XIDs only) and instance (a MIG GPU's), as
    Fault's fields; a problem for each that does not fit."""
    out: dict[str, Any] = {}
    units = NVLINK5_UNITS.get(code or 0)
    if units is None:
        for key in ("unit", "link"):
            if key in data:
                c.problems.append(c.doc.problem((*path, key), f"only an xid 144-150 takes a {key}"))
    else:
        names = tuple(u.name for u in units)
        out["unit"] = c.value(data, path, "unit", one_of(names), names[0])
        out["link"] = c.value(data, path, "link", whole_number(-1, 17), -1)
    if "instance" in data:
        out["instance"] = c.value(data, path, "instance", whole_number(0, 63), None)
    return out


def nvlink5_text(code: int, unit: str, link: int, v2: bool) -> str:
    """What the driver prints after an NVLink5 XID's number (`v2`: a driver from R575 on)."""
    chosen = next(u for u in NVLINK5_UNITS[code] if u.name == unit)
    info = chosen.v2 if v2 else chosen.v1 << 5 | (code - 143)
    link_text = "-1" if link < 0 else f"{link:02d}"
    # The sheet names some units as before R575 / from R575 (TLW_RX/TLW_RX_PIPE0).
    name = unit.split("/")[-1 if v2 else 0]
    words = "Fatal" if chosen.fatal else "Nonfatal"
    rest = " ".join(["0x00000000"] * 4)
    return f"{name} {words} XC0 i0 Link {link_text} (0x{info:08x} 0x{chosen.status:08x} {rest})"
