"""PCI addresses as the tools write them, read into one form.

NVML says `00000000:3B:00.0` (an 8-digit domain), the driver's kernel log lines
`PCI:0000:3b:00` (no function) or `0000:3b:00.0`, sysfs `0000:3b:00.0`. They are compared as
`0000:3b:00.0`: a 4-digit domain, lower case, function 0 where none is given. A domain past
16 bits (Intel VMD puts the devices behind it in domains from 10000) keeps all its digits.
"""

from __future__ import annotations

import re

_ADDRESS = re.compile(
    r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?"
)


def pci_address(text: str) -> str:
    """`text` (an address in any of the forms above) as `dddd:bb:dd.f`; "" when it is not one."""
    match = _ADDRESS.fullmatch(text.strip().removeprefix("PCI:"))
    if match is None:
        return ""
    domain, bus, device, function = match.groups()
    number = int(domain or "0", 16)
    return f"{number:04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function or '0'}"
