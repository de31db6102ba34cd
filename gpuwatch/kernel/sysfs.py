"""sysfs as a Watcher: the PCI bus and the InfiniBand ports, read every cycle off the event loop.

One read at a time, in a thread of its own, with the cycle's deadline: a sysfs read can block
on a device in trouble, and a read still blocked is neither waited on nor started again; until
it returns, the last samples stand. The bus is scanned and the ports are found again every
RESCAN_S (a port or GPU that appears later is picked up); between scans each cycle reads only
the files of what was found: the states every cycle, the counters (error, data and AER) every
COUNTERS_EVERY_S, their last values standing between reads, as NVML's slow tier does. On a
node whose bus has NVSwitches, whether Fabric Manager answers is asked at each scan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator, KeysView
from dataclasses import dataclass
from functools import partial

from gpuwatch import metrics as m
from gpuwatch.clock import Clock, within
from gpuwatch.kernel import fabric_manager
from gpuwatch.kernel.attributes import KeptFiles
from gpuwatch.kernel.gpus import GpuDirectory
from gpuwatch.kernel.infiniband import Port, counter_samples, find_ports, port_samples
from gpuwatch.kernel.pci import Bus, BusDevice, affinity, bus_device, scan
from gpuwatch.model import GpuState, Sample
from gpuwatch.source import in_own_thread

log = logging.getLogger(__name__)

RESCAN_S = 30.0
COUNTERS_EVERY_S = 5.0  # the rules read counters over minutes: 5 s apart loses nothing


@dataclass(frozen=True, slots=True)
class _Found:
    devices: list[BusDevice]
    ports: list[Port]
    affinity: dict[tuple[str, str], str]  # (device, port) -> the GPUs near its NIC


class SysfsWatcher:
    name = "sysfs"

    def __init__(
        self,
        root: str,
        clock: Clock,
        gpus: GpuDirectory,
        deadline: float,
        fabric_manager: str | None = None,
    ) -> None:
        self.root = root
        self._fabric_manager = fabric_manager  # its command port's address; None: not asked
        self._fabric_manager_up: bool | None = None
        self._clock = clock
        self._gpus = gpus
        self._deadline = deadline
        self._bus = Bus()
        self._files = KeptFiles()  # used by read_now only, one read at a time
        self._found = _Found([], [], {})
        self._next_scan = 0.0
        self._next_counters = 0.0
        self._counters: dict[tuple[str, str], list[Sample]] = {}  # by port, as last read
        self._scanned: KeysView[str] = {}.keys()  # the GPUs listed at the last scan
        self._pending: asyncio.Future[list[Sample]] | None = None
        self._last: list[Sample] = []
        self.late = 0  # cycles whose read missed the deadline, or found one still blocked
        self._failing: set[str] = set()  # the ports and the bus while their reading raises
        self._said_missing = False

    async def start(self) -> None:
        """Learn the ports above the NVIDIA devices before the kernel log is read from this
        boot's start (the daemon starts this watcher first): the AER lines about a port
        printed before gpuwatch started are the GPU's too. The first read scans the rest."""
        learn = partial(upstream_ports, self.root, self._gpus)
        with contextlib.suppress(TimeoutError):
            await within(asyncio.to_thread(learn), self._deadline)

    async def stop(self) -> None:
        if self._pending is None or self._pending.done():
            self._files.close()  # else a read still blocked in the kernel keeps them

    async def read(self) -> list[Sample]:
        if self._pending is not None and not self._pending.done():
            # Still blocked in the kernel: waiting on it again would cost every cycle the
            # deadline. The last values stand until a read started after it returns.
            self._count_late()
            return self._with_late(self._last)
        now = self._clock.now()
        listed, count = dict(self._gpus.listed), self._gpus.driver_count
        known = self._gpus.known
        # Again every RESCAN_S, and as soon as the driver lists other GPUs (a GPU opened
        # late): the GPUs near each NIC are found against the GPUs listed.
        rescan = now >= self._next_scan or listed.keys() != self._scanned
        if rescan:
            self._next_scan = now + RESCAN_S
            self._scanned = listed.keys()
        counters = now >= self._next_counters
        if counters:
            self._next_counters = now + COUNTERS_EVERY_S
        self._pending = in_own_thread(
            "sysfs", self.read_now, listed, count, rescan, counters, known
        )
        try:
            self._last = await self._clock.wait_for(asyncio.shield(self._pending), self._deadline)
        except TimeoutError:
            self._count_late()
        return self._with_late(self._last)

    def _with_late(self, samples: list[Sample]) -> list[Sample]:
        return [*samples, Sample(m.SYSFS_READS_LATE, (), float(self.late))]

    def _count_late(self) -> None:
        self.late += 1
        if self.late == 1 or self.late % 100 == 0:
            log.warning(
                "sysfs under %s: a read took longer than %.1fs (%d cycles); keeping "
                "the last values",
                self.root,
                self._deadline,
                self.late,
            )

    def read_now(
        self,
        listed: dict[str, GpuState],
        driver_count: int | None,
        rescan: bool,
        counters: bool = True,
        known: set[str] | None = None,
    ) -> list[Sample]:
        """One blocking read (in a worker thread; tests call it directly): the states, and
        with `counters` the counters, else their last values. `known`: the addresses of the
        GPUs the node has had (the inventory's too), looked for on the bus at a scan."""
        if rescan:  # devices found again are opened again
            self._files.close()
            self._found = self._scan(listed, known if known is not None else set(listed))
        found = self._found
        read = self._files.read
        out: list[Sample] = []
        with self._isolated("the PCI bus"):
            out += self._bus.samples(found.devices, listed, driver_count, counters, read)
        if self._fabric_manager and any(d.kind == "nvswitch" for d in found.devices):
            if rescan or self._fabric_manager_up is None:
                self._fabric_manager_up = fabric_manager.answers(self._fabric_manager)
            out.append(Sample(m.FABRIC_MANAGER_UP, (), float(self._fabric_manager_up)))
        for port in found.ports:
            key = (port.device, port.port)
            with self._isolated(f"port {port.device}/{port.port}"):
                states = port_samples(port, found.affinity.get(key, ""), read)
                if counters or key not in self._counters:
                    self._counters[key] = counter_samples(port, read)
                out += states + self._counters[key]
        return out

    @contextlib.contextmanager
    def _isolated(self, what: str) -> Iterator[None]:
        """What `what` read is left out when reading it raises (a file sysfs would never
        hold, a fault of ours): the other devices and ports are read all the same. Logged
        once until it reads again."""
        try:
            yield
        except Exception:
            if what not in self._failing:
                self._failing.add(what)
                log.exception("sysfs under %s: reading %s failed; left out", self.root, what)
        else:
            self._failing.discard(what)

    def _scan(self, listed: dict[str, GpuState], known: set[str]) -> _Found:
        bus = os.path.join(self.root, "bus", "pci", "devices")
        if not self._said_missing and not os.path.isdir(bus):
            self._said_missing = True  # once: a container without /sys mounted stays so
            log.warning(
                "sysfs: %s is not there (sources.host.sysfs_root): no PCI bus or InfiniBand checks",
                bus,
            )
        devices = scan(self.root)
        # A GPU the driver lists, or the node had, was on the bus even if it no longer answers
        # as one now (a GPU that fell off the bus before gpuwatch started reads all ones).
        found = {d.address for d in devices}
        devices += [d for a in sorted(known) if a not in found and (d := bus_device(self.root, a))]
        self._gpus.learn_ports(ports_above(devices))
        ports = find_ports(self.root)
        by_address = {d.address: d for d in devices if d.kind == "gpu"}
        gpu_paths = {
            str(g.info.index): by_address[a].chain for a, g in listed.items() if a in by_address
        }
        near = {(p.device, p.port): affinity(p.pci_path, gpu_paths) for p in ports}
        return _Found(devices, ports, near)


def ports_above(devices: list[BusDevice]) -> dict[str, str]:
    """Each device's upstream port's address, to the device's."""
    return {d.chain[-2]: d.address for d in devices if len(d.chain) > 1}


def upstream_ports(root: str, gpus: GpuDirectory) -> None:
    gpus.learn_ports(ports_above(scan(root)))
