"""What each GPU goes through, recorded by serial number as it happens: the life record's
writer, a cycle output and an event listener of the daemon.

A GPU is known by its serial, which NVML reads from the board's InfoROM and which "matches the
serial number tag that is physically attached to the board" (NVML's reference), so its record
follows it through reboots, driver upgrades and moves between slots. A GPU whose driver reports
no serial is known by its UUID, which NVML calls immutable.

Each cycle it compares what the batch says of each GPU with what the record last said: a new
slot, driver or VBIOS, a new boot, and the counts that stay with the board (aggregate ECC
errors, remapped rows, retired pages) or show a reset (volatile ECC counts that went back).
Events (XIDs with the driver's text, a GPU lost and back, the driver asking for a reset, an
acknowledgement, a drain) are held until the cycle's end and recorded with it. Only what the
hardware, the driver, the kernel or the operator said is recorded; nothing a job sends.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

from gpuwatch import metrics as m
from gpuwatch.health.view import NodeView
from gpuwatch.kernel.merge import KERNEL_LOG
from gpuwatch.kernel.merge import WINDOW_S as TWIN_WINDOW_S
from gpuwatch.life.book import GpuLife, LifeBook, NewEntry, jobs_own_xid
from gpuwatch.life.counts import COUNTED, VOLATILE, Counts, count_changes, counts_of
from gpuwatch.model import Batch, Event, GpuInfo, GpuStatus, Sample
from gpuwatch.xid.known import APPLICATION_FAULTS

REPEAT_S = 600.0  # a fault again within this of the last time: a repeat, not a new entry
APPLICATION_REPEAT_S = 86400.0  # a job's own XIDs: one entry a day, however many
REFRESH_S = 600.0  # how often a GPU's row is rewritten when nothing changes (its last sight)
HELD_EVENTS = 1000  # events held between cycles, and entries held while the disk refuses
# A job's own XIDs, held in a lane of their own: a burst of them (two events each, NVML's and
# the kernel log's) must not push a fault of the board's out of the one above.
HELD_APPLICATION_EVENTS = 100
NO_SERIAL = frozenset({"", "N/A", "[N/A]"})  # what drivers and nvidia-smi print for none
# Events that are the GPU's own, by kind; what a kind counts as among its lifetime faults.
GPU_EVENTS = {
    "gpu_lost": "lost",
    "gpu_unresponsive": "unresponsive",
    "gpu_failing": "failing",
    "gpu_missing": "missing",
    "gpu_init_failed": "init_failed",
    "gpu_recovered": "",
    "recovery_action": "",
    "acknowledged": "",
}


def life_key(info: GpuInfo, shared: bool = False) -> str:
    """The key a GPU's record is kept under: its serial, or its UUID where it reports none.
    The GPUs of a board that holds several (a K80, an A16) share the board's serial: each is
    kept under the serial and its own UUID."""
    serial = info.serial.strip()
    if serial in NO_SERIAL:
        return info.uuid
    return f"{serial}:{info.uuid}" if shared else serial


class LifeRecorder:
    def __init__(self, book: LifeBook, node: str, boot_id: str) -> None:
        self.book = book
        self.node = node
        self.boot_id = boot_id
        self.lives = book.gpus()
        self._by_uuid = {str(life.known.get("uuid", "")): s for s, life in self.lives.items()}
        self._held: deque[Event] = deque(maxlen=HELD_EVENTS)
        self._held_application: deque[Event] = deque(maxlen=HELD_APPLICATION_EVENTS)
        self._written: dict[str, float] = {}  # serial -> when its row was last written
        self._present: list[tuple[GpuInfo, str]] = []  # this cycle's GPUs and their keys
        # The identity (the GpuInfo read when the GPU was opened) and driver each GPU was last
        # compared with its record with: a GPU read as before needs no comparing.
        self._checked: dict[str, tuple[GpuInfo, str]] = {}
        # Entries a write failed to record (a full disk): tried again with the next cycle's.
        self._unwritten: list[tuple[str, NewEntry]] = []

    def on_event(self, event: Event) -> None:
        if event.kind in GPU_EVENTS or event.kind in ("xid", "action", KERNEL_LOG):
            application = event.data.get("xid") in APPLICATION_FAULTS
            (self._held_application if application else self._held).append(event)

    def after_cycle(self, now: float, view: NodeView) -> None:
        batch = view.batch
        if batch is None:
            return
        entries, self._unwritten = self._unwritten, []
        changed = {key for key, _ in entries}
        counts = counts_of(_counted_samples(batch))
        serials = Counter(state.info.serial.strip() for state in batch.gpus)
        readings: list[tuple[str, Counts]] = []  # each present GPU's key and counts
        self._present = []
        for state in batch.gpus:
            # A GPU keeps the key it was first recorded under: the other GPU of its board
            # gone missing must not make it a new record.
            key = self._by_uuid.get(state.info.uuid) or life_key(
                state.info, serials[state.info.serial.strip()] > 1
            )
            if not key:  # a GPU not yet opened: nothing says which board it is
                continue
            self._present.append((state.info, key))
            reading = counts.get(state.info.uuid, {}) if state.status == GpuStatus.OK else {}
            readings.append((key, reading))
            found = self._seen(now, state.info, key, batch.backend.driver_version, reading)
            entries += [(key, e) for e in found]
            if found or now - self._written.get(key, 0.0) >= REFRESH_S:
                changed.add(key)
        # The events before the counts: an XID comes before the count this cycle read.
        for held in (self._held, self._held_application):
            while held:
                for key, entry in self._from_event(held.popleft(), view):
                    entries.append((key, entry))
                    changed.add(key)
        for key, reading in readings:
            found = count_changes(now, self.lives[key].known, reading) if reading else []
            entries += [(key, e) for e in found]
            changed.update([key] if found else [])
        if not changed:
            return
        if self.book.write([self.lives[k] for k in changed], entries, self.boot_id):
            self._written.update((k, now) for k in changed)
        else:
            self._unwritten = _keep_faults(entries, HELD_EVENTS)

    def close(self, now: float) -> None:
        """At shutdown: each GPU's last sight, and what the last cycle did not write."""
        for _, key in self._present:
            self.lives[key].last_seen = max(self.lives[key].last_seen, now)
        entries = self._unwritten
        for held in (self._held, self._held_application):
            while held:
                entries += self._from_event(held.popleft(), NodeView())
        keys = {key for _, key in self._present} | {key for key, _ in entries}
        self.book.write([self.lives[k] for k in keys], entries, self.boot_id)

    def collect(self) -> list[Sample]:
        """Each present GPU's lifetime faults on this node, by kind: a counter that a restart,
        a reboot or a driver upgrade does not set back, for the fleet to join on serial."""
        out = []
        for info, key in self._present:
            faults: dict[str, int] = self.lives[key].known.get("faults", {})
            out += [
                Sample(m.GPU_LIFE_FAULTS, (*info.labels, ("kind", kind)), float(n))
                for kind, n in sorted(faults.items())
            ]
        return out

    # -- what a cycle shows ----------------------------------------------------------------
    def _seen(
        self, now: float, info: GpuInfo, key: str, driver: str, reading: Counts
    ) -> list[NewEntry]:
        """The entries for what a GPU's identity says: new here, a new slot, driver, VBIOS or
        boot. `reading` is what its counts were when it was first seen."""
        if self._checked.get(key) == (info, driver):  # as last cycle: the same identity read
            self.lives[key].last_seen = now
            return []
        self._checked[key] = (info, driver)
        here = {
            "uuid": info.uuid,
            "model": info.model,
            "node": self.node,
            "pci_bus_id": info.pci_bus_id,
            "index": info.index,
            "vbios": info.vbios_version,
            "driver": driver,
        }
        life = self.lives.get(key)
        if life is None:
            first = {**here, "boot_id": self.boot_id, "counts": dict(reading), "faults": {}}
            self.lives[key] = GpuLife(key, now, now, first)
            self._by_uuid[info.uuid] = key
            where = f"slot {info.pci_bus_id} (GPU {info.index})"
            message = (
                f"first seen on node {self.node} in {where}: {info.model}, "
                f"VBIOS {info.vbios_version or '?'}, driver {driver or '?'}"
            )
            return [NewEntry(now, "installed", "", message, {**here, **reading})]
        life.last_seen = now
        known = life.known
        found = list(self._identity_changes(now, known, here))
        if known.get("boot_id") != self.boot_id:
            found.append(NewEntry(now, "boot", "", "seen again after a reboot"))
            known["boot_id"] = self.boot_id
            counts: dict[str, float] = known.setdefault("counts", {})
            for volatile in VOLATILE:  # they start again at a boot: that is no reset
                counts.pop(volatile, None)
        return found

    def _identity_changes(
        self, now: float, known: dict[str, Any], here: dict[str, Any]
    ) -> Iterator[NewEntry]:
        if (known.get("node"), known.get("pci_bus_id")) != (here["node"], here["pci_bus_id"]):
            before = f"slot {known.get('pci_bus_id')} (GPU {known.get('index')})"
            if known.get("node") != here["node"]:
                before += f" of node {known.get('node')}"
            after = f"slot {here['pci_bus_id']} (GPU {here['index']})"
            data = {"from": known.get("pci_bus_id"), "to": here["pci_bus_id"]}
            yield NewEntry(now, "slot", "", f"moved from {before} to {after}", data)
        for field, what in (("driver", "driver"), ("vbios", "VBIOS"), ("uuid", "UUID")):
            old, new = known.get(field), here[field]
            if new and old != new:
                message = f"{what} {old or '?'} -> {new}"
                yield NewEntry(now, field, "", message, {"from": old, "to": new})
        known.update({k: v for k, v in here.items() if v or k == "index"})

    # -- what events tell ------------------------------------------------------------------
    def _from_event(self, event: Event, view: NodeView) -> Iterator[tuple[str, NewEntry]]:
        if event.kind == "action":
            yield from self._action(event, view)
            return
        key = self._by_uuid.get(event.uuid or "")
        if key is None:
            return
        life = self.lives[key]
        data: dict[str, Any] = dict(event.data)
        if event.kind == KERNEL_LOG:  # the driver's own words for a fault NVML reported first
            if "xid" in data:
                said = {"driver_text": data.get("driver_text", "")}
                twin = NewEntry(event.time, "xid", str(data["xid"]), "", said, TWIN_WINDOW_S)
                yield key, replace(twin, counts=False)
            return
        if event.kind == "xid":
            code = data.get("xid")
            application = code in APPLICATION_FAULTS
            window = APPLICATION_REPEAT_S if application else REPEAT_S
            entry = NewEntry(event.time, "xid", str(code), event.message, data, window)
            fault = "" if application else "xid"
        elif event.kind == "recovery_action":
            action = str(data.get("action", ""))
            if action == "none":
                return
            entry = NewEntry(event.time, event.kind, action, event.message, data, REPEAT_S)
            fault = ""
        else:
            key_of = str(data.get("cause", ""))
            entry = NewEntry(event.time, event.kind, key_of, event.message, data, REPEAT_S)
            fault = GPU_EVENTS[event.kind]
        if fault:
            faults = life.known.setdefault("faults", {})
            faults[fault] = int(faults.get(fault, 0)) + 1
        yield key, entry

    def _action(self, event: Event, view: NodeView) -> Iterator[tuple[str, NewEntry]]:
        """A drain is the history of the GPUs whose causes it named; a resume, of those it
        drained."""
        action = str(event.data.get("action", ""))
        if action == "drain":
            named = set(str(event.data.get("cause", "")).split(","))
            for index, verdict in view.gpu_verdicts.items():
                if not named & {c.key for c in verdict.causes}:
                    continue
                key = next((k for info, k in self._present if info.index == index), None)
                if key is not None:
                    self.lives[key].known["drained"] = True
                    yield key, NewEntry(event.time, "drain", "", event.message, dict(event.data))
        elif action == "resume":
            for key, life in self.lives.items():
                if life.known.pop("drained", False):
                    yield key, NewEntry(event.time, "resume", "", event.message, dict(event.data))


def _keep_faults(entries: list[tuple[str, NewEntry]], limit: int) -> list[tuple[str, NewEntry]]:
    """At most `limit` entries, a job's own XIDs given up first, then the oldest."""
    if len(entries) <= limit:
        return entries
    own = [e for e in entries if not jobs_own_xid(e[1].kind, e[1].key)]
    if len(own) >= limit:
        return own[-limit:]
    theirs = [e for e in entries if jobs_own_xid(e[1].kind, e[1].key)]
    return [*own, *theirs[len(own) - limit :]]


def _counted_samples(batch: Batch) -> Iterable[Sample]:
    """The samples the counts come from: this cycle's, and the slow tier's parts read in it
    (the others were seen when they were read)."""
    yield from (s for s in batch.samples if s.name in COUNTED)
    for _part, samples in batch.slow_read:
        yield from (s for s in samples if s.name in COUNTED)
