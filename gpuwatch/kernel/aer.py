"""The kernel's PCIe AER lines, about a GPU or the port above it.

The kernel's AER driver prints each error it handles: the port that received the error
message (`pcieport 0000:00:03.1: AER: Uncorrectable (Fatal) error message received from
0000:03:00.0`), then for each device with error status, a block of its own (`nvidia
0000:07:00.0: PCIe Bus Error: severity=Correctable, ...`, the status and mask, one line per
error bit), and what recovery did (`AER: Downstream Port link has been reset`, `AER: device
recovery failed`). drivers/pci/pcie/aer.c prints them (aer_print_port_info, aer_print_error,
aer_root_reset). The wording changed over the years: `Corrected error received: id=0010`
before Linux 4.19, `Corrected error received: 0000:00:00.0` until 6.8, `Correctable error
message received from ...` since; every form is read. Real lines: tests/fixtures/kmsg/aer.txt.

Which device a line is about is the address before the colon; the watcher keeps only those
about a GPU or NVSwitch, or about the port above one (errors on a GPU's link are often seen
and reported at that port only).
"""

from __future__ import annotations

import re

from gpuwatch.kernel.nvrm import DriverLine
from gpuwatch.text.pci import pci_address

# `DRIVER ADDRESS: ` and what the AER driver prints after it: its own lines (`AER: ...`),
# a device's error block (`PCIe Bus Error: ...`, `  device [10de:2330] error status/mask=...`,
# `   [ 5] SDES (First)`), and the older `  TLP Header: ...`.
_AER = re.compile(
    r"[a-z][\w-]{0,31} ([0-9a-fA-F]{4,5}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): "
    r"((?:AER: (?=.*(?:rror|recover|reset|Agent))|PCIe Bus Error: |\s{1,4}device \["
    r"|\s{1,4}\[\s?\d{1,2}\] |\s{1,4}TLP Header: ).*)"
)
# The root port's own line names where the error came from: `received from 0000:29:00.0`,
# `received: 0000:29:00.0`, or before Linux 4.19 `received: id=0010` (bus, device, function).
_SOURCE = re.compile(
    r"received(?: from|:) (?:([0-9a-fA-F]{4,5}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
    r"\.[0-7])|id=([0-9a-fA-F]{4}))"
)
_SEVERITY = re.compile(
    r"(Correct(?:ed|able)|Uncorrect(?:ed|able) \((?:Non-Fatal|Fatal)\))", re.IGNORECASE
)


def read_aer_line(text: str) -> DriverLine | None:
    """An AER line, as a DriverLine of kind `aer` naming the device it is about and the
    severity it says (correctable, nonfatal, fatal; "" for a detail line); None otherwise."""
    match = _AER.match(text)  # at the start of what the kernel printed (read_driver_line)
    if match is None:
        return None
    rest = match.group(2).strip()
    found = _SEVERITY.search(rest)
    severity = ""
    if found is not None:
        said = found.group(1).lower()
        severity = (
            "correctable"
            if said.startswith("correct")
            else ("fatal" if "(fatal)" in said else "nonfatal")
        )
    message = text.strip()
    address = pci_address(match.group(1))
    source = _SOURCE.search(rest)
    about = address
    if source is not None and source.group(1):
        about = pci_address(source.group(1))
    elif source is not None:  # id=BBDF: the bus, then device and function, in the port's domain
        bdf = int(source.group(2), 16)
        domain = address.split(":")[0]
        about = f"{domain}:{bdf >> 8:02x}:{bdf >> 3 & 0x1F:02x}.{bdf & 7}"
    return DriverLine("aer", message, about, detail=rest, severity=severity, reporter=address)
