"""InfiniBand and RoCE ports, as sysfs shows them under `class/infiniband/<device>/ports/<n>/`.

`state` and `phys_state` read `4: ACTIVE` and `5: LinkUp`, `rate` `400 Gb/sec (4X NDR)`,
`link_layer` `InfiniBand` or `Ethernet`; `counters/` holds the port's error counters (the
PortCounters of the InfiniBand spec: most are 8 to 16 bits wide and stop at their maximum
rather than wrap, unless the driver reads the 64-bit extended ones) and its data counters in
units of 4 bytes (Documentation/ABI/testing/sysfs-class-infiniband).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from gpuwatch import metrics as m
from gpuwatch.kernel.attributes import Read, read_small
from gpuwatch.model import Labels, Sample
from gpuwatch.text.pci import pci_address
from gpuwatch.text.units import ascii_int

# The error counters read, by their file name under counters/ (the `type` label).
ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
)
DATA_COUNTERS = (("port_xmit_data", "tx"), ("port_rcv_data", "rx"))
STATE_ACTIVE = 4
PHYS_LINK_UP = 5
_RATE = re.compile(r"([0-9]{1,6}(?:\.[0-9]{1,6})?)\s*Gb/sec")
MAX_PORTS = 256  # ports read at most: a bound on what a strange sysfs can make us read


@dataclass(frozen=True, slots=True)
class Port:
    device: str  # mlx5_0
    port: str  # 1
    path: str  # .../class/infiniband/mlx5_0/ports/1
    link_layer: str
    pci_bus_id: str  # the NIC's PCI function; "" where sysfs does not say
    pci_path: tuple[str, ...]  # the NIC's PCI devices from its root port down
    # The counter files this port has, (label, path), found once: a cycle opens only these.
    errors: tuple[tuple[str, str], ...] = ()
    data: tuple[tuple[str, str], ...] = ()

    @property
    def labels(self) -> Labels:
        return (("device", self.device), ("port", self.port))


def _number(text: str) -> int | None:
    """`4: ACTIVE` -> 4; `123` -> 123; None when it starts with no number."""
    return ascii_int(text.split(":", 1)[0].strip())


def pci_path(device_dir: str) -> tuple[str, ...]:
    """The PCI addresses from the root port down to a device, from where its sysfs directory
    really is (`devices/pci0000:15/0000:15:01.0/0000:16:00.0/...`): the PCIe switches a device
    sits under, which tell which GPUs share them."""
    real = os.path.realpath(device_dir)
    return tuple(a for part in real.split(os.sep) if (a := pci_address(part)) and ":" in part)


def find_ports(sysfs_root: str) -> list[Port]:
    """Every port under class/infiniband, in name order."""
    base = os.path.join(sysfs_root, "class", "infiniband")
    try:
        devices = sorted(os.listdir(base))
    except OSError:
        return []
    out: list[Port] = []
    for device in devices:
        ports_dir = os.path.join(base, device, "ports")
        try:
            ports = sorted(os.listdir(ports_dir), key=lambda p: (len(p), p))
        except OSError:
            continue
        nic = os.path.join(base, device, "device")
        chain = pci_path(nic) if os.path.exists(nic) else ()
        for port in ports:
            path = os.path.join(ports_dir, port)
            layer = read_small(os.path.join(path, "link_layer")) or ""
            counters = os.path.join(path, "counters")
            errors = tuple(
                (n, f) for n in ERROR_COUNTERS if os.path.exists(f := os.path.join(counters, n))
            )
            data = tuple(
                (d, f) for n, d in DATA_COUNTERS if os.path.exists(f := os.path.join(counters, n))
            )
            address = chain[-1] if chain else ""
            out.append(Port(device, port, path, layer, address, chain, errors, data))
            if len(out) >= MAX_PORTS:
                return out
    return out


def port_samples(port: Port, affinity: str, read: Read = read_small) -> list[Sample]:
    """The port's state: its info, states and rate; a file that cannot be read is left out,
    never 0."""
    labels = port.labels
    out = [
        Sample(
            m.IB_PORT_INFO,
            (
                *labels,
                ("link_layer", port.link_layer),
                ("pci_bus_id", port.pci_bus_id),
                ("gpus", affinity),
            ),
            1.0,
        )
    ]
    state = _number(read(os.path.join(port.path, "state")) or "")
    phys = _number(read(os.path.join(port.path, "phys_state")) or "")
    if state is not None:
        out.append(Sample(m.IB_PORT_STATE, labels, float(state)))
    if phys is not None:
        out.append(Sample(m.IB_PORT_PHYSICAL_STATE, labels, float(phys)))
    if state is not None and phys is not None:
        up = state == STATE_ACTIVE and phys == PHYS_LINK_UP
        out.append(Sample(m.IB_PORT_UP, labels, 1.0 if up else 0.0))
    rate = _RATE.match(read(os.path.join(port.path, "rate")) or "")
    if rate is not None:
        out.append(Sample(m.IB_PORT_RATE, labels, float(rate.group(1)) * 1e9 / 8))
    return out


def counter_samples(port: Port, read: Read = read_small) -> list[Sample]:
    """The port's error and data counters."""
    labels = port.labels
    out: list[Sample] = []
    for name, path in port.errors:
        value = _counter(read(path))
        if value is not None:
            out.append(Sample(m.IB_PORT_ERRORS, (*labels, ("type", name)), value))
    for direction, path in port.data:
        value = _counter(read(path))
        if value is not None:  # in units of 4 bytes
            out.append(Sample(m.IB_PORT_DATA, (*labels, ("direction", direction)), value * 4))
    return out


def _counter(text: str | None) -> float | None:
    """A counter's value; None for anything but the up to 20 digits of a 64-bit count."""
    if text is None or len(text) > 20 or not text.isascii() or not text.isdigit():
        return None
    return float(text)
