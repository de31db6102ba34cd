"""Which GPU sits at a PCI address, for what names a GPU only by its address (the driver's
kernel log lines, sysfs): the GPUs the driver lists, refreshed every cycle, the GPUs this node
had before (the inventory), and what the driver's own `GPU at PCI:...: GPU-<uuid>` lines say."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatch.model import GpuState, MissingGpu
from gpuwatch.text.pci import pci_address

MAX_LEARNED = 4096  # addresses learned from the kernel log, at most


@dataclass(frozen=True, slots=True)
class GpuAt:
    """What is known of the GPU at an address: its index and UUID where known, and its state
    (processes included) when the driver lists it."""

    index: int | None
    uuid: str | None
    state: GpuState | None = None


class GpuDirectory:
    def __init__(self) -> None:
        self._listed: dict[str, GpuState] = {}
        self._before: dict[str, MissingGpu] = {}
        self._learned: dict[str, str] = {}  # address -> uuid, from the kernel log
        self._ports: dict[str, str] = {}  # a port's address -> the device's below it (sysfs)
        self.driver_count: int | None = None  # GPUs the driver lists; None: driver down

    def update(self, gpus: list[GpuState], missing: tuple[MissingGpu, ...], up: bool) -> None:
        """The GPUs of this cycle's batch (every GPU the driver counts, opened or not) and
        those it no longer lists."""
        self._listed = {a: g for g in gpus if (a := pci_address(g.info.pci_bus_id))}
        self._before = {a: g for g in missing if (a := pci_address(g.pci_bus_id))}
        self.driver_count = len(gpus) if up else None

    def learn_ports(self, ports: dict[str, str]) -> None:
        """The PCI bus's ports above the NVIDIA devices, each to the device whose link it is."""
        self._ports = dict(list(ports.items())[:MAX_LEARNED])

    def nvidia_device(self, address: str) -> str | None:
        """The NVIDIA device (a GPU or NVSwitch) at `address`, or whose upstream port is at
        `address`: its address; None when neither."""
        if address in self.known or address in self._ports.values():
            return address
        return self._ports.get(address)

    def learn(self, address: str, uuid: str) -> None:
        if address in self._learned or len(self._learned) < MAX_LEARNED:
            self._learned[address] = uuid

    @property
    def listed(self) -> dict[str, GpuState]:
        """The GPUs the driver lists whose address is known, by address."""
        return self._listed

    @property
    def known(self) -> set[str]:
        """The addresses of the GPUs the driver lists and of those the node had before."""
        return self._listed.keys() | self._before.keys()

    def find(self, address: str) -> GpuAt:
        listed = self._listed.get(address)
        if listed is not None:
            return GpuAt(listed.info.index, listed.info.uuid, listed)
        uuid = self._learned.get(address)
        by_uuid = next((g for g in self._listed.values() if g.info.uuid == uuid), None)
        if by_uuid is not None:
            return GpuAt(by_uuid.info.index, by_uuid.info.uuid, by_uuid)
        before = self._before.get(address)
        if before is not None:
            return GpuAt(before.index, before.uuid)
        return GpuAt(None, uuid)
