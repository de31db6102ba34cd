"""The simulated node's host beside NVML: a sysfs tree and a kernel log, in a directory it owns.

The daemon reads them as it reads a real host's (`sources.host.sysfs_root` and
`sources.kmsg.path` point here): PCI devices (the GPUs, NVSwitches and InfiniBand NICs, under
PCIe switches as on an HGX board, each NIC beside its GPU), the InfiniBand ports with their
state, rate and counters, and the driver's kernel log lines: an `NVRM: Xid` line for every XID
the simulated GPUs raise (the driver prints each XID that NVML hands out), a GPU fallen off the
bus, a GPU that failed to initialise, and NVSwitch SXids; with NVSwitches, Fabric Manager's
command port (gpuwatch.sim.fabric_manager). `update()` writes what the scenario
says at the clock's now; `start()` runs it in a thread of its own, which wakes for the files
twice a (simulated) second and for each kernel log line at its time.

The thread also keeps `cpu` in the directory up to date: the CPU seconds the simulator has
spent in the daemon's process, the library's entry points' (when it accounts them) and its own
thread's, so that bench/daemon_cost.py can tell the daemon's cost from its stand-in hardware's.
"""

from __future__ import annotations

import math
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gpuwatch.config import Config
from gpuwatch.sim.fabric_manager import SimFabricManager
from gpuwatch.sim.faults import Fault
from gpuwatch.sim.kernel_log import kernel_lines, switch_address
from gpuwatch.sim.node import SimNode
from gpuwatch.sim.nvml_core import bus_id
from gpuwatch.text.pci import pci_address

FILES_EVERY_S = 0.5  # seconds (the node's) between updates of the sysfs files
BOOTED_BEFORE_S = 600.0  # the simulated machine booted this long before the scenario started
FLAP_PERIOD_S = 20.0  # an ib_port_flap takes the link down for FLAP_DOWN_S of every period
FLAP_DOWN_S = 4.0
COUNTER16 = 65535  # PortCounters' 16-bit error counters stop here
NIC_BYTES_PER_S = 10e9  # traffic through an up port
GPU_FILE_KINDS = frozenset(
    {"fall_off_bus", "pcie_replay_storm", "pcie_aer"}
)  # what a GPU's files show
GPU_CLASS, SWITCH_CLASS, NIC_CLASS = "0x030200", "0x068000", "0x020700"
CONFIG_HEADER = 64  # what sysfs's `config` shows a reader without CAP_SYS_ADMIN
# A device that no longer answers: a config read completes with all ones (the kernel's
# PCI_ERROR_RESPONSE, include/linux/pci.h).
GONE = b"\xff" * CONFIG_HEADER


def config_space(vendor: str, device: str, klass: str) -> bytes:
    """A config space header, little-endian as the bus answers it: vendor and device IDs at
    0x00 and 0x02, the class code (interface, subclass, class) at 0x09."""
    header = bytearray(CONFIG_HEADER)
    header[0:2] = int(vendor, 16).to_bytes(2, "little")
    header[2:4] = int(device, 16).to_bytes(2, "little")
    header[9:12] = int(klass, 16).to_bytes(3, "little")
    return bytes(header)


class SimHost:
    def __init__(
        self,
        node: SimNode,
        directory: Path,
        salt: int = 0,
        library_cpu: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.node = node
        self.directory = directory
        self._library_cpu = library_cpu
        self.sysfs = directory / "sys"
        self.kmsg = directory / "kmsg"
        shutil.rmtree(self.sysfs, ignore_errors=True)  # what an earlier run left
        directory.mkdir(parents=True, exist_ok=True)
        self.kmsg.write_bytes(b"")
        self._clock = node.clock
        self._boot = node.start - BOOTED_BEFORE_S
        self._written: dict[str, bytes] = {}
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        scenario = node.scenario
        self._faults = [f for f in scenario.faults if f.kind.startswith(("ib_", "sxid"))]
        self._port_faults = [
            [f for f in self._faults if f.port == port] for port in range(scenario.ib_ports)
        ]
        self._ports_written: set[int] = set()
        self._gpus_written: set[int] = set()
        self._lines = sorted(kernel_lines(node, self._boot, salt), key=lambda line: line.time)
        self._next_line = 0
        self.fabric_manager = SimFabricManager(node) if scenario.nvswitches else None
        self._build()
        self.update()

    # -- the tree -------------------------------------------------------------------------
    def _device(self, chain: list[str], vendor: str, device: str, klass: str) -> Path:
        """A PCI device under the root port and switches `chain` (addresses, root first),
        with its bus/pci/devices link, as the kernel lays them out."""
        root = chain[0].rsplit(":", 1)[0]  # 0000:15:01.0 -> 0000:15
        path = self.sysfs / "devices" / f"pci{root}"
        for address in chain:
            path /= address
        path.mkdir(parents=True, exist_ok=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", klass)):
            self._put(str(path / name), value)
        self._put_raw(str(path / "config"), config_space(vendor, device, klass))
        link = self.sysfs / "bus" / "pci" / "devices" / chain[-1]
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(path, link.parent))
        return path

    @staticmethod
    def _switch(bus: int, domain: str = "0000") -> list[str]:
        """The root port and PCIe switch a device on `bus` sits under."""
        return [
            f"{domain}:{bus - 3:02x}:01.0",
            f"{domain}:{bus - 2:02x}:00.0",
            f"{domain}:{bus - 1:02x}:00.0",
        ]

    def _build(self) -> None:
        scenario = self.node.scenario
        self._gpu_dirs: list[str] = []
        for gpu in range(scenario.gpus):
            domain, bus = _domain_and_bus(gpu)
            chain = [*self._switch(bus, domain), pci_address(bus_id(gpu))]
            device = self._device(chain, "0x10de", "0x2330", GPU_CLASS)
            self._gpu_dirs.append(str(device))
            drivers = self.sysfs / "bus" / "pci" / "drivers" / "nvidia"
            drivers.mkdir(parents=True, exist_ok=True)
            if not (device / "driver").is_symlink():
                (device / "driver").symlink_to(os.path.relpath(drivers, device))
        for switch in range(scenario.nvswitches):  # in a PCI domain of their own
            self._device(
                [*self._switch(switch * 4 + 7, "0002"), switch_address(switch)],
                "0x10de",
                "0x22a3",
                SWITCH_CLASS,
            )
        self._ports: list[str] = []
        for port in range(scenario.ib_ports):
            # NIC i beside GPU i, under its PCIe switch; past the GPUs, under switches of its own.
            if port < scenario.gpus:
                domain, bus = _domain_and_bus(port)
                chain = [*self._switch(bus, domain)[:2], f"{domain}:{bus - 1:02x}:01.0",
                         f"{domain}:{bus + 1:02x}:00.0"]  # fmt: skip
            else:  # in a PCI domain of their own
                bus = port * 4 + 7
                chain = [*self._switch(bus, "0001"), f"0001:{bus:02x}:00.0"]
            nic = self._device(chain, "0x15b3", "0x1021", NIC_CLASS)
            name = f"mlx5_{port}"
            ib = nic / "infiniband" / name
            (ib / "ports" / "1" / "counters").mkdir(parents=True, exist_ok=True)
            if not (ib / "device").is_symlink():
                (ib / "device").symlink_to("../..")
            link = self.sysfs / "class" / "infiniband" / name
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(os.path.relpath(ib, link.parent))
            self._put(str(ib / "ports" / "1" / "link_layer"), "InfiniBand")
            self._ports.append(str(ib / "ports" / "1"))

    def _put(self, path: str, text: str) -> None:
        self._put_raw(path, (text + "\n").encode("ascii"))

    def _put_raw(self, path: str, data: bytes) -> None:
        """Write a file whose content changed, in place in one write (a reader sees the old
        content or the new, as sysfs answers a read), and cut what the old had beyond it."""
        if self._written.get(path) == data:
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
        self._written[path] = data

    # -- the kernel log ---------------------------------------------------------------------
    def _write_lines(self, now: float) -> None:
        records = []
        while self._next_line < len(self._lines) and self._lines[self._next_line].time <= now:
            line = self._lines[self._next_line]
            self._next_line += 1
            # Sequence numbers that keep growing across restarts of a simulated daemon (its
            # clock carries on), as the kernel's do within a boot.
            self._seq = max(self._seq + 1, int(line.time * 1000))
            uptime = max(0, int((line.time - self._boot) * 1e6))
            records.append(f"{line.priority},{self._seq},{uptime},-;{line.message}\n")
        if records:
            with open(self.kmsg, "a", encoding="utf-8") as f:
                f.write("".join(records))  # one write: a reader never sees half a record

    # -- what the faults do to the files ------------------------------------------------------
    def update(self, files: bool = True) -> None:
        """The kernel log's lines due by now, and with `files` the sysfs files."""
        now = self._clock.now()
        with self._lock:
            self._write_lines(now)
            if not files:
                return
            if self.fabric_manager is not None:
                self.fabric_manager.update(now)
            for index, path in enumerate(self._ports):
                self._write_port(index, path, now)
            for index, path in enumerate(self._gpu_dirs):
                gpu = self.node.gpus[index]
                if index in self._gpus_written and gpu.fault_kinds.isdisjoint(GPU_FILE_KINDS):
                    continue  # its files change only with these faults
                self._gpus_written.add(index)
                # Fallen off the bus, the GPU answers config reads with all ones; `vendor` is
                # what the kernel cached at enumeration and stays 0x10de (pci-sysfs.c).
                lost = gpu.fault_now("fall_off_bus")
                config = GONE if lost else config_space("0x10de", "0x2330", GPU_CLASS)
                self._put_raw(f"{path}/config", config)
                # The GPU's own AER counters stay at 0: errors on its link are seen and
                # counted by its link partner, the port above it (the kernel's
                # Documentation/ABI/testing/sysfs-bus-pci-devices-aer): the replays the GPU
                # counts are the bad TLPs the port received and NAKed.
                for where in (path, os.path.dirname(path)):
                    port = where != path
                    bad = gpu.fault_count("pcie_replay_storm") if port else 0
                    n = {
                        s: gpu.fault_count("pcie_aer", severity=s) if port else 0
                        for s in ("correctable", "nonfatal", "fatal")
                    }
                    aer_files = (("correctable", "BadTLP", "COR", bad + n["correctable"]),
                                 ("nonfatal", "TLP", "NONFATAL", n["nonfatal"]),
                                 ("fatal", "SDES", "FATAL", n["fatal"]))  # fmt: skip
                    for name, bit, total, count in aer_files:
                        self._put(
                            f"{where}/aer_dev_{name}", f"{bit} {count}\nTOTAL_ERR_{total} {count}"
                        )
            self._write_cpu()

    def _active(self, kind: str, port: int, now: float) -> list[Fault]:
        elapsed = now - self.node.start
        return [f for f in self._port_faults[port] if f.kind == kind and f.active(elapsed)]

    def _write_port(self, port: int, path: str, now: float) -> None:
        elapsed = now - self.node.start
        traffic = str(int(int(max(0.0, elapsed)) * NIC_BYTES_PER_S / 4))  # by the second
        self._put(f"{path}/counters/port_xmit_data", traffic)
        self._put(f"{path}/counters/port_rcv_data", traffic)
        if not self._port_faults[port] and port in self._ports_written:
            # A port without faults: only its traffic moves (the rest costs no system call,
            # but working it out twice a second on 8 ports was most of this thread's time).
            return
        self._ports_written.add(port)
        down = bool(self._active("ib_port_down", port, now))
        downs = 0  # times the link has gone down so far
        for f in self._port_faults[port]:
            if elapsed < f.at:
                continue
            end = elapsed if f.duration is None else min(elapsed, f.at + f.duration)
            if f.kind == "ib_port_down":
                downs += 1
            elif f.kind == "ib_port_flap":
                # One down at the start of each period begun: while it lasts, the one now
                # included; once over, those begun before its end (a flap of exactly two
                # periods went down twice, not three times).
                if f.active(elapsed):
                    downs += int((elapsed - f.at) // FLAP_PERIOD_S) + 1
                else:
                    downs += math.ceil((end - f.at) / FLAP_PERIOD_S)
                if f.active(elapsed) and (elapsed - f.at) % FLAP_PERIOD_S < FLAP_DOWN_S:
                    down = True

        def counted(kind: str) -> float:  # errors the port's faults of `kind` made by now
            return sum(
                f.errors_at_once
                + f.errors_per_s
                * ((elapsed if f.duration is None else min(elapsed, f.at + f.duration)) - f.at)
                for f in self._port_faults[port]
                if f.kind == kind and elapsed >= f.at
            )

        halved = bool(self._active("ib_rate_drop", port, now))
        self._put(f"{path}/state", "1: DOWN" if down else "4: ACTIVE")
        self._put(f"{path}/phys_state", "2: Polling" if down else "5: LinkUp")
        self._put(f"{path}/rate", "200 Gb/sec (2X NDR)" if halved else "400 Gb/sec (4X NDR)")
        values = {
            "symbol_error": min(COUNTER16, int(counted("ib_symbol_errors"))),
            # The port's training failed recovery and took the link down: LinkDowned. A
            # recovery that kept the link up (LinkErrorRecovery, counted apart in the
            # InfiniBand specification's PortCounters) is no fault the simulator plays.
            "link_downed": min(255, downs),
            "link_error_recovery": 0,
            "port_rcv_errors": min(COUNTER16, int(counted("ib_rcv_errors"))),
            "port_xmit_discards": 0,
            "excessive_buffer_overrun_errors": 0,
            # A 4-bit counter in PortCounters: it stops at 15.
            "local_link_integrity_errors": min(15, int(counted("ib_link_integrity_errors"))),
        }
        for name, value in values.items():
            self._put(f"{path}/counters/{name}", str(value))

    # -- the thread --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sim-host", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        if self.fabric_manager is not None:
            self.fabric_manager.close()

    def _run(self) -> None:
        """The files every FILES_EVERY_S of the node's time; a kernel log line at its time."""
        clock = self._clock
        files_due = clock.now()
        while not self._stop.is_set():
            now = clock.now()
            files = now >= files_due
            self.update(files=files)
            if files:
                files_due = now + FILES_EVERY_S
            with self._lock:
                pending = self._lines[self._next_line :]
            next_line = pending[0].time if pending else float("inf")
            clock.block_until(self._stop, max(0.0, min(files_due, next_line) - clock.now()))

    def _write_cpu(self) -> None:
        """The library's CPU seconds and the calling thread's: the host's own, which does
        nothing but this work, once start() has run it."""
        text = f"{self._library_cpu():.6f} {time.thread_time():.6f}"
        self._put(str(self.directory / "cpu"), text)


def _domain_and_bus(gpu: int) -> tuple[str, int]:
    """GPU `gpu`'s PCI domain (as sysfs writes it) and bus number."""
    domain, bus = pci_address(bus_id(gpu)).split(":")[:2]
    return domain, int(bus, 16)


def with_sim_host(config: Config, host: SimHost) -> Config:
    """`config` reading the simulated host's sysfs and kernel log instead of the machine's."""
    # The simulated Fabric Manager's port, unless the config says not to ask one.
    fabric_manager = None
    if host.fabric_manager is not None and config.sources.fabric_manager is not None:
        fabric_manager = host.fabric_manager.address
    sources = replace(
        config.sources,
        kmsg_path=str(host.kmsg),
        sysfs_root=str(host.sysfs),
        fabric_manager=fabric_manager,
    )
    return replace(config, sources=sources)
