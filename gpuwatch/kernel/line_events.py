"""What each line of the NVIDIA drivers' (and the kernel's AER lines about an NVIDIA device)
becomes: an XID, a GPU lost or not initialised, an SXid counted against its NVSwitch, or a
line journaled as it is, at most OTHER_PER_MINUTE of those a minute."""

from __future__ import annotations

from collections import deque

from gpuwatch.clock import Clock
from gpuwatch.host.processes import with_jobs
from gpuwatch.kernel.gpus import GpuDirectory
from gpuwatch.kernel.nvrm import DriverLine
from gpuwatch.kernel.sxids import SxidCounts
from gpuwatch.model import Event
from gpuwatch.xid.known import xid_event_text

SOURCE = "kernel_log"
SEQ = "kmsg_seq"  # the record's sequence number, in every event this source journals
TEXT_LIMIT = 1024  # of a driver line kept in an event
# Lines that are neither XIDs nor SXids nor a lost GPU: at most this many events a minute;
# a driver that prints a storm of them is counted, not journaled line by line.
OTHER_PER_MINUTE = 30


class LineEvents:
    def __init__(self, gpus: GpuDirectory, sxids: SxidCounts, clock: Clock) -> None:
        self._gpus = gpus
        self._sxids = sxids
        self._clock = clock
        self.suppressed = 0  # lines past the limit
        self._others: deque[float] = deque(maxlen=OTHER_PER_MINUTE)
        # The AER lines' own: a bad riser prints several a second, which must not crowd
        # out the driver's lines.
        self._aer_lines: deque[float] = deque(maxlen=OTHER_PER_MINUTE)

    def event(self, line: DriverLine, seq: int, when: float) -> Event | None:
        """The event a driver line (read from the record numbered `seq`) is; None for one
        that is no news, or past this minute's limit."""
        at = self._gpus.find(line.pci_bus_id) if line.pci_bus_id else None
        gpu, uuid = (at.index, at.uuid) if at is not None else (None, None)
        where = f"GPU {gpu}" if gpu is not None else f"GPU at {line.pci_bus_id or '?'}"
        data: dict[str, int | float | str] = {"source": SOURCE, SEQ: seq}
        data["driver_text"] = line.text[:TEXT_LIMIT]
        if line.pci_bus_id:
            data["pci_bus_id"] = line.pci_bus_id
        if line.kind == "xid" and line.code is not None:
            message, about = xid_event_text(line.code, gpu)
            if gpu is None:
                message = message.replace("on GPU None", f"on {where}")
            data.update(about)
            if line.pid is not None:
                data["pid"] = line.pid
            if line.process:
                data["process"] = line.process[:64]
            said, instance = line.mig_instance()  # a MIG instance's is the GPU's XID too
            message += said
            data.update(instance)
            if line.detail and _said(line.detail) != _said(str(about["meaning"])):
                message += f" ({line.detail[:200]})"
            if at is not None and at.state is not None:
                message, data = with_jobs(message, data, at.state.processes)
            return Event(when, "xid", gpu, uuid, message, data)
        if line.kind == "fallen_off_bus":
            message = f"{where} lost: the driver says it has fallen off the bus"
            return Event(when, "gpu_lost", gpu, uuid, message, data)
        if line.kind == "init_failed":
            message = f"the driver could not initialise {where}: {line.detail[:200]}"
            return Event(when, "gpu_init_failed", gpu, uuid, message, data)
        if line.kind == "sxid" and line.code is not None:
            data.update(sxid=line.code, severity=line.severity)
            if line.link is not None:
                data["link"] = line.link
            self._sxids.count(line.pci_bus_id, str(line.code), line.severity, when)
            level = "fatal" if line.severity == "fatal" else "non-fatal"
            message = f"NVSwitch {line.pci_bus_id}: {level} SXid {line.code}: {line.detail[:200]}"
            return Event(when, "sxid", None, None, message, data)
        if line.kind == "identity":
            self._gpus.learn(line.pci_bus_id, line.uuid)
            return None
        if line.kind in ("serial", "loaded"):  # a board's serial, the driver loading: no news
            return None
        if line.kind == "aer":
            return self._aer(line, when, gpu, uuid, data)
        return self._other(line, when, gpu, uuid, data)

    def _aer(
        self,
        line: DriverLine,
        when: float,
        gpu: int | None,
        uuid: str | None,
        data: dict[str, int | float | str],
    ) -> Event | None:
        """An AER line about a GPU (or NVSwitch) or the port above it: at most
        OTHER_PER_MINUTE a minute, a budget of their own, since a storm of correctable errors
        prints several lines each."""
        if not self._admit(self._aer_lines):
            return None
        data["reporter"] = line.reporter
        if line.severity:
            data["severity"] = line.severity
        where = f"GPU {gpu}" if gpu is not None else f"the device at {line.pci_bus_id}"
        if line.reporter != line.pci_bus_id:
            where += f" (reported by {line.reporter})"
        return Event(when, "pcie_aer", gpu, uuid, f"PCIe AER on {where}: {line.detail[:200]}", data)

    def _other(
        self,
        line: DriverLine,
        when: float,
        gpu: int | None,
        uuid: str | None,
        data: dict[str, int | float | str],
    ) -> Event | None:
        if not self._admit(self._others):
            return None
        kind = "nvlink" if line.kind == "nvlink" else "kernel_log"
        return Event(when, kind, gpu, uuid, f"kernel log: {line.text[:TEXT_LIMIT]}", data)

    def _admit(self, taken: deque[float]) -> bool:
        """Whether one more line fits in this minute's OTHER_PER_MINUTE of its kind."""
        now = self._clock.now()
        if len(taken) == OTHER_PER_MINUTE and taken[0] > now - 60.0:
            self.suppressed += 1
            return False
        taken.append(now)
        return True


def _said(text: str) -> str:
    """Text as compared for saying the same: the driver's `GPU has fallen off the bus.` and
    the catalogue's `GPU has fallen off the bus`."""
    return text.strip().rstrip(".").lower()
