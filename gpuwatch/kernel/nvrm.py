"""What the NVIDIA driver's kernel log lines say.

The driver prints its faults to the kernel log (`NVRM:` from the GPU driver, `nvidia-nvswitchN:`
from the NVSwitch driver), often with more than NVML's events carry: the process that hit an
XID, the engine and address of a fault, or the one sign of a GPU that NVML can no longer reach.
The forms below are those real machines print (tests/fixtures/kmsg has captures, each with its
source); every other line from the driver is kept as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from gpuwatch.text.pci import pci_address

# `NVRM: Xid (PCI:0000:3b:00): 79, pid=0, name=..., GPU has fallen off the bus.`; drivers
# before R470 print no pid or name, some print the address without `PCI:`. An XID the driver
# attributes to a MIG instance carries it after the address, `GPU-I:05` and maybe
# `GPU-CI:02` (the open driver's krcReportXid, src/nvidia/src/kernel/gpu/rc/kernel_rc.c; the
# example in src/common/sdk/nvidia/inc/nverror.h).
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)(?: GPU-I:(\d{1,4}))?(?: GPU-CI:(\d{1,4}))?\): "
    r"(\d{1,6}),\s*(.*)"
)
_PID = re.compile(r"pid=('?<?[\w ]*>?'?|\d+),\s*")
_NAME = re.compile(r"name=(.*?), ")
# `nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 24007, Fatal, Link 44 ...`: the first line of
# an SXid says whether it is fatal; the lines after it (Severity, Data) are its details.
_SXID = re.compile(r"(nvidia-nvswitch\d*): SXid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d{1,6}),\s*(.*)")
_SXID_SEVERITY = re.compile(r"(Fatal|Non-fatal)\b,?\s*(.*)", re.IGNORECASE)
_LINK = re.compile(r"\bLink (\d{1,3})\b")
# `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`; older drivers print `NVRM: GPU at
# 0000:01:00.0 has fallen off the bus.`, and one probing a GPU that is already off the bus
# `NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen
# off the bus and is not responding to commands.` (three lines: read as one).
_FALLEN = re.compile(
    r"NVRM: (?:The NVIDIA )?GPU (?:at )?(?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
    r"(?:\.[0-7])?):?"
    r"(?: GPU| \(PCI ID: [^)]*\) installed in this system)? has fallen off the bus"
)
_INIT_FAILED = re.compile(
    r"NVRM: (?:GPU (?:at )?(?:PCI:)?([0-9a-fA-F:.]+): )?RmInitAdapter failed!?\s*(.*)"
)
_IDENTITY = re.compile(r"NVRM: GPU at (?:PCI:)?([0-9a-fA-F:.]+): (GPU-[0-9a-fA-F-]{36})")
_SERIAL = re.compile(r"NVRM: GPU Board Serial Number:")
_LOADED = re.compile(r"NVRM: loading NVIDIA UNIX")
_ANY_ADDRESS = re.compile(r"\b([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)")
_NVLINK = re.compile(r"nvlink|NVLink|NVLINK")
# Whose lines these are: the GPU driver and its modules (nvidia-uvm, nvidia-peermem, ...), and
# the NVSwitch driver. In a saved log they follow a syslog, journal or dmesg prefix.
# The modules' prefixes (nvidia-modeset:, nvidia-uvm:, `nvidia-peermem function:line`...);
# not the user-space tools' names a saved syslog holds (nvidia-persistenced[PID]:, a unit's
# name in systemd's lines).
_DRIVER = re.compile(
    r"(?:^|(?<=[\s\]]))(?:NVRM:|nvidia-nvswitch\d*:|nvidia:"
    r"|nvidia-(?!persistenced|smi|fabricmanager|container|ctk|cdi)[a-z]+(?=[:\s]))"
)
# The lines after the first of one message, as /dev/kmsg escapes them and dmesg indents them
# (rsyslog writes the newline as `#012`).
_NEXT_LINE = re.compile(r"\s*(?:\n|#012)\s*(?:NVRM:\s*)?")
# The first lines of the lost GPU's message above, without its end. A syslog file fed from
# the kernel's syslog interface has each line of that message as a line of its own.
_OPENING = re.compile(
    r"NVRM: The NVIDIA GPU [0-9a-fA-F:.]+(?: \(PCI ID: [^)]*\))?(?: installed in this system has)?"
)


@dataclass(frozen=True, slots=True)
class DriverLine:
    """One line of the driver's, read. `kind`: xid, sxid, sxid_detail, fallen_off_bus,
    init_failed, identity (which GPU sits at an address), serial (its board's serial number),
    loaded (the driver's load line, at boot), nvlink, other; or aer (the kernel's AER driver
    about an NVIDIA device, kernel/aer.py)."""

    kind: str
    text: str  # the whole line
    pci_bus_id: str = ""  # as gpuwatch.text.pci writes it; "" where the line names none
    code: int | None = None  # the XID or SXid
    detail: str = ""  # the driver's own words about it
    pid: int | None = None
    process: str = ""
    severity: str = ""  # an SXid's: fatal or non_fatal
    link: int | None = None  # the NVLink or NVSwitch port an SXid or NVLink line names
    uuid: str = ""  # identity lines
    gpu_instance: int | None = None  # the MIG GPU instance an XID is attributed to
    compute_instance: int | None = None  # and its compute instance, where the driver says
    reporter: str = ""  # an AER line's: the device that printed it, the port above pci_bus_id

    def mig_instance(self) -> tuple[str, dict[str, int]]:
        """The MIG instance the line names, as words for a message and as event fields."""
        if self.gpu_instance is None:
            return "", {}
        if self.compute_instance is None:
            return f" in MIG GPU instance {self.gpu_instance}", {"gpu_instance": self.gpu_instance}
        return (
            f" in MIG GPU instance {self.gpu_instance}, compute instance {self.compute_instance}",
            {"gpu_instance": self.gpu_instance, "compute_instance": self.compute_instance},
        )


def read_driver_line(text: str) -> DriverLine | None:
    """The line, read; None when it is not the NVIDIA drivers'. `text` is what the kernel
    printed (a record's message from Record.start): the driver's words must open it, since
    another line may quote what a user chose. A message the driver printed over several lines
    is read as one."""
    if _DRIVER.match(text) is None:
        return None
    message = _NEXT_LINE.sub(" ", text)
    match = _XID.match(message)
    if match is not None:
        return _xid(message, match)
    match = _SXID.match(message)
    if match is not None:
        return _sxid(message, match)
    match = _FALLEN.match(message)
    if match is not None:
        return DriverLine(
            "fallen_off_bus",
            message,
            pci_address(match.group(1)),
            detail="GPU has fallen off the bus",
        )
    match = _INIT_FAILED.match(message)
    if match is not None:
        at = pci_address(match.group(1)) if match.group(1) else ""
        return DriverLine("init_failed", message, at, detail=match.group(2).strip())
    match = _IDENTITY.match(message)
    if match is not None:
        return DriverLine("identity", message, pci_address(match.group(1)), uuid=match.group(2))
    if _SERIAL.match(message):
        return DriverLine("serial", message)
    if _LOADED.match(message):
        return DriverLine("loaded", message)
    address = _ANY_ADDRESS.search(message)
    found = pci_address(address.group(1)) if address else ""
    kind = "nvlink" if _NVLINK.search(message) else "other"
    link = _LINK.search(message)
    return DriverLine(kind, message, found, link=int(link.group(1)) if link else None)


def _xid(message: str, match: re.Match[str]) -> DriverLine:
    rest = match.group(5)
    pid: int | None = None
    process = ""
    found = _PID.match(rest)
    if found is not None:
        value = found.group(1)
        pid = int(value) if value.isdigit() else None
        rest = rest[found.end() :]
        name = _NAME.match(rest)
        if name is not None:
            process = name.group(1).strip("'")
            if process.startswith("<"):  # name=<unknown>
                process = ""
            rest = rest[name.end() :]
    return DriverLine(
        "xid",
        message,
        pci_address(match.group(1)),
        code=int(match.group(4)),
        detail=rest.strip(),
        pid=pid,
        process=process,
        gpu_instance=int(match.group(2)) if match.group(2) else None,
        compute_instance=int(match.group(3)) if match.group(3) else None,
    )


def _sxid(message: str, match: re.Match[str]) -> DriverLine:
    rest = match.group(4)
    severity = _SXID_SEVERITY.match(rest)
    link = _LINK.search(rest)
    kind, level, detail = "sxid_detail", "", rest.strip()
    if severity is not None:
        kind, detail = "sxid", severity.group(2).strip()
        level = "fatal" if severity.group(1).lower() == "fatal" else "non_fatal"
    return DriverLine(
        kind,
        message,
        pci_address(match.group(2)),
        code=int(match.group(3)),
        detail=detail,
        severity=level,
        link=int(link.group(1)) if link else None,
    )


R = TypeVar("R")


class Joiner(Generic[R]):
    """Driver lines as whole messages: the lost GPU's message, read a line at a time (a syslog
    file has each of its lines on its own), is held until its end comes and read as one. Any
    other line lets what was held go as it was."""

    def __init__(self) -> None:
        self._held: tuple[R, DriverLine] | None = None

    def feed(self, record: R, line: DriverLine | None) -> Iterator[tuple[R, DriverLine]]:
        """What to take now: (record, line) pairs, the record a joined line ended in."""
        held, self._held = self._held, None
        if held is not None:
            joined = read_driver_line(f"{held[1].text}\n{line.text}") if line else None
            if joined is not None and joined.kind == "fallen_off_bus":
                line = joined
            elif joined is not None and _OPENING.fullmatch(joined.text):
                self._held = (record, joined)
                return
            else:
                yield held
        if line is not None and line.kind == "other" and _OPENING.fullmatch(line.text):
            self._held = (record, line)
        elif line is not None:
            yield record, line
