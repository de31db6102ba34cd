"""NVIDIA devices on the PCI bus (`bus/pci/devices/` under the sysfs root), held against the
GPUs the driver lists.

A GPU the bus shows and the driver does not list (it failed to initialise, or NVML lost it
without an XID) and a device the bus has lost (gone from sysfs, or answering all ones, as a
device that fell off the bus does) are what NVML alone cannot tell. The PCIe AER counters
(`aer_dev_correctable`, `aer_dev_nonfatal`, `aer_dev_fatal`, where the kernel has AER) count
the link errors the device itself detected, and are read for each device and for the port
above it, its link partner (a root port, or a PCIe switch's downstream port): errors on a
GPU's link are often seen and counted at the port only, the GPU's own counters staying at 0
(the kernel's Documentation/ABI/testing/sysfs-bus-pci-devices-aer).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gpuwatch import metrics as m
from gpuwatch.kernel.attributes import Read, read_small
from gpuwatch.kernel.infiniband import pci_path
from gpuwatch.model import GpuState, Sample

NVIDIA = 0x10DE
CLASS_DISPLAY = 0x03  # VGA (0x0300) and 3D (0x0302) controllers: GPUs
CLASS_BRIDGE_OTHER = 0x0680  # NVSwitches
AER_FILES = (("aer_dev_correctable", "correctable"), ("aer_dev_nonfatal", "nonfatal"),
             ("aer_dev_fatal", "fatal"))  # fmt: skip
AER_TOTALS = ("TOTAL_ERR_COR", "TOTAL_ERR_NONFATAL", "TOTAL_ERR_FATAL")
MAX_DEVICES = 4096  # entries of bus/pci/devices read at most


@dataclass
class BusDevice:
    address: str
    kind: str  # gpu or nvswitch
    path: str
    chain: tuple[str, ...]  # its PCI path from the root port (infiniband.pci_path)
    driver: str | None = None  # the kernel driver bound to it at the scan (None: none)

    @property
    def port(self) -> str | None:
        """The sysfs directory of the port above it (its link partner); None when it sits
        on the root complex itself."""
        parent = os.path.dirname(os.path.realpath(self.path))
        return parent if len(self.chain) > 1 else None

    @property
    def for_nvidia_driver(self) -> bool:
        """Whether the NVIDIA driver should list it: bound to it, or to no driver (a probe
        that failed). One given to vfio-pci (a VM's) or another driver is not its to list."""
        return self.driver in (None, "nvidia")


def _hex(path: str, read: Read = read_small) -> int | None:
    try:
        return int(read(path) or "", 16)
    except ValueError:
        return None


def scan(sysfs_root: str) -> list[BusDevice]:
    """The NVIDIA GPUs and NVSwitches on the bus now."""
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(base))[:MAX_DEVICES]
    except OSError:
        return []
    out = []
    for name in names:
        path = os.path.join(base, name)
        if _hex(os.path.join(path, "vendor")) != NVIDIA:
            continue
        klass = _hex(os.path.join(path, "class"))
        if klass is None:
            continue
        if klass >> 16 == CLASS_DISPLAY:
            kind = "gpu"
        elif klass >> 8 == CLASS_BRIDGE_OTHER:
            kind = "nvswitch"
        else:
            continue  # the GPU's audio function, USB-C controller...
        out.append(BusDevice(name, kind, path, pci_path(path), _driver(path)))
    return out


def _driver(path: str) -> str | None:
    try:
        return os.path.basename(os.readlink(os.path.join(path, "driver")))
    except OSError:
        return None


def bus_device(sysfs_root: str, address: str) -> BusDevice | None:
    """The GPU at `address` whatever it answers now, where sysfs has its directory."""
    path = os.path.join(sysfs_root, "bus", "pci", "devices", address)
    if not os.path.isdir(path):
        return None
    return BusDevice(address, "gpu", path, pci_path(path), _driver(path))


def answers(device: BusDevice, read: Read = read_small) -> bool:
    """Whether the device is still there and answers config reads: one that fell off the
    bus answers all ones (its vendor ID reads 0xffff in config space), one the kernel removed
    is gone from sysfs. The `vendor` attribute cannot tell: the kernel shows the ID it read at
    enumeration (drivers/pci/pci-sysfs.c), 0x10de whatever the device answers now. It serves
    only a tree without `config` (a copy of /sys that left it out)."""
    vendor = config_vendor(os.path.join(device.path, "config"))
    if vendor is None:
        vendor = _hex(os.path.join(device.path, "vendor"), read)
    return vendor == NVIDIA


def config_vendor(path: str) -> int | None:
    """The vendor ID config space answers now: its first two bytes, little-endian."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        head = os.pread(fd, 2, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    return int.from_bytes(head, "little") if len(head) == 2 else None


def aer_counts(path: str, read: Read = read_small) -> dict[str, float]:
    """severity -> the AER total of the device whose sysfs directory is `path`; empty where
    the kernel has no AER counters."""
    out: dict[str, float] = {}
    for name, severity in AER_FILES:
        text = read(os.path.join(path, name))
        if text is None:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key in AER_TOTALS and value.strip().isdigit():
                out[severity] = float(value)
    return out


@dataclass
class Bus:
    """What the bus showed: the devices seen since the daemon started, by address."""

    seen: dict[str, BusDevice] = field(default_factory=dict)
    # As last read, by address: the device's own, and under "ADDRESS^" its port's.
    aer: dict[str, dict[str, float]] = field(default_factory=dict)

    def samples(
        self,
        present: list[BusDevice],
        listed: dict[str, GpuState],
        driver_count: int | None,
        counters: bool = True,
        read: Read = read_small,
    ) -> list[Sample]:
        """gpuwatch_pci_* for the devices `scan` found, against the GPUs the driver lists
        (by address) and counts (None: the driver is down, so nothing is unlisted); the AER
        counters read again when `counters`, else as last read."""
        for device in present:
            self.seen[device.address] = device
        up = {
            address: answers(device, read) for address, device in self.seen.items()
        }  # one read each
        out: list[Sample] = []
        gpus = [d for d in present if d.kind == "gpu" and up[d.address]]
        out.append(Sample(m.PCI_GPUS, (), float(len(gpus))))
        # More GPUs on the bus than the driver counts: those it lists by address are fine; an
        # unopened one has no address yet, so nothing is unlisted while the counts agree.
        ours = [d for d in gpus if d.for_nvidia_driver]
        fewer = driver_count is not None and len(ours) > driver_count
        for device in ours:
            unlisted = fewer and device.address not in listed
            out.append(
                Sample(
                    m.PCI_GPU_UNLISTED, (("pci_bus_id", device.address),), 1.0 if unlisted else 0.0
                )
            )
        for device in self.seen.values():
            answered = up[device.address]
            labels = _labels(device, listed)
            out.append(Sample(m.PCI_DEVICE_UP, (*labels, ("kind", device.kind)), float(answered)))
            fresh = counters or device.address not in self.aer
            if answered and fresh:
                self.aer[device.address] = aer_counts(device.path, read)
            if fresh and (port := device.port) is not None:
                # The port answers whatever the device below it does: a fatal error on the
                # link (a surprise down) is what takes a GPU off the bus.
                self.aer[device.address + "^"] = aer_counts(port, read)
            if answered:
                for severity, total in self.aer.get(device.address, {}).items():
                    out.append(Sample(m.PCIE_AER_ERRORS, (*labels, ("severity", severity)), total))
            # The port's, labelled with the device whose link it is: its cause lands there.
            if (port_counts := self.aer.get(device.address + "^")) is not None:
                port_labels = (*labels[:-1], ("pci_bus_id", device.chain[-2]),
                               ("serves", device.address))  # fmt: skip
                for severity, total in port_counts.items():
                    out.append(
                        Sample(m.PCIE_AER_ERRORS, (*port_labels, ("severity", severity)), total)
                    )
        return out


def _labels(device: BusDevice, listed: dict[str, GpuState]) -> tuple[tuple[str, str], ...]:
    gpu = listed.get(device.address)
    ident = gpu.info.labels if gpu is not None else ()
    return (*ident, ("pci_bus_id", device.address))


def _shared(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """How many PCI devices two paths from the root port share, from the top."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def affinity(chain: tuple[str, ...], gpus: dict[str, tuple[str, ...]]) -> str:
    """The GPUs (indices, `0,1`) under the same PCIe switch or root port as a device with PCI
    path `chain`, the nearest ones where several are; "" when it shares none with any."""
    best, chosen = 0, []
    for index, path in gpus.items():
        common = _shared(chain[:-1], path[:-1])
        if common > best:
            best, chosen = common, [index]
        elif common == best and common > 0:
            chosen.append(index)
    return ",".join(sorted(chosen, key=int))
