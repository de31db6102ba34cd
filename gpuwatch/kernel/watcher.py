"""The kernel log as a source of events: the NVIDIA driver's lines, read as they are printed.

A thread of its own reads the records (gpuwatch.kernel.kmsg) and hands them to the event loop,
where each driver line becomes an event (gpuwatch.kernel.nvrm says what a line is): an XID
counts as NVML's XID events do (gpuwatch.kernel.merge keeps one XID seen by both from counting
twice), a GPU fallen off the bus is a lost GPU, an SXid counts against its NVSwitch, and any
other driver line is journaled as it is. The GPU is found by its PCI address.

At start the kernel's whole buffer is read, and every record after the last one this boot's
journal holds is taken: the records of this boot on the first start, and on a restart only
those printed since, so no XID is counted twice. A file's records are numbered by their first
line, so its events also carry which file they came from (its inode and first line): a file
replaced or written again while gpuwatch was stopped is read from its start.

The thread hands at most MAX_BATCHES_QUEUED batches to the loop before the loop has taken
them; while the loop is that far behind, the thread waits and the kernel keeps the records
(a buffer that overflows meanwhile is counted in gpuwatch_kmsg_overwritten_total). The loop
takes at most RECORDS_A_TURN records in one turn: a storm of XIDs is taken over many turns,
and scrapes, the API and sampling keep theirs in between.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from gpuwatch import metrics as m
from gpuwatch.clock import Clock
from gpuwatch.kernel.aer import read_aer_line
from gpuwatch.kernel.gpus import GpuDirectory
from gpuwatch.kernel.kmsg import KmsgReader, open_problem
from gpuwatch.kernel.line_events import SEQ, LineEvents
from gpuwatch.kernel.nvrm import DriverLine, Joiner, read_driver_line
from gpuwatch.kernel.records import Record
from gpuwatch.kernel.sxids import SxidCounts
from gpuwatch.logs import fields as log_fields
from gpuwatch.model import Event, Sample

log = logging.getLogger(__name__)

FILE = "kmsg_file"  # for a plain file, which file (KmsgReader.identity) the number is of
RETRY_S = 30.0  # how often a kernel log that cannot be opened is tried again
# How long the thread waits for a record before looking again anyway: /dev/kmsg and a file
# inotify watches wake it as a record comes, and stop() wakes it through a pipe. What inotify
# cannot tell (a file written from another host over NFS, the log's directory renamed) is
# seen this late.
LOOK_S = 5.0
# After a device said it had a record and a read found none (/dev/null always "has
# something"): the pause that keeps this from being a busy loop.
WAIT_S = 0.25
QUEUE_CHECK_S = 1.0  # how often a thread waiting for the loop to take a batch checks stop()
MAX_BATCHES_QUEUED = 16
RECORDS_A_TURN = 500  # about 25 ms of the loop's time on the development VM


@dataclass(frozen=True, slots=True)
class Batch:
    """Records read at once, with what the reader said of its log when it read them."""

    records: list[Record]
    restarts: int  # KmsgReader.restarts
    identity: str  # KmsgReader.identity


class KernelLog:
    name = "kmsg"

    def __init__(
        self,
        path: str,
        clock: Clock,
        publish: Callable[[Event], None],
        gpus: GpuDirectory,
        restored: Sequence[Event] = (),
    ) -> None:
        self._reader = KmsgReader(path)
        self._clock = clock
        self._publish = publish
        self._gpus = gpus
        # The last record taken before, by the log it is of (the newest event's: a file
        # truncated in place numbers its lines from 1 again); a log not seen before is read
        # from its first record. Events journaled before files were told apart name none.
        self._cursors: dict[str, int] = {}
        for event in restored:  # oldest first
            seq, where = event.data.get(SEQ), str(event.data.get(FILE, ""))
            if isinstance(seq, int):
                self._cursors[where] = seq
        self._unnamed = "" in self._cursors and len(self._cursors) == 1
        self._identity: str | None = None  # the log the cursor is of
        self._cursor = -1
        self._in_flight = threading.Semaphore(MAX_BATCHES_QUEUED)
        self._queued: deque[Batch] = deque()  # handed to the loop, not yet taken
        self._queue_lock = threading.Lock()
        self._draining = False  # a _drain is scheduled on the loop
        self._sxids = SxidCounts(restored)
        self._events = LineEvents(gpus, self._sxids, clock)
        self._joiner: Joiner[Record] = Joiner()
        self._restarts = 0  # the reader's, as last seen
        self._lines: Counter[str] = Counter()
        self._foreign = 0  # records the kernel did not write
        self._problem = "not started"
        self._noted = ""
        self._watch_noted = ""  # the reader's watch_problem, as last logged
        self._stop = threading.Event()
        self._wake_r, self._wake_w = -1, -1  # stop() wakes the thread's wait through it
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def path(self) -> str:
        return self._reader.path

    @property
    def problem(self) -> str:
        """Why the kernel log is not being read; "" while it is."""
        return self._problem

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Open the log and take its backlog before the first cycle; then follow it."""
        self._loop = asyncio.get_running_loop()
        batch = await asyncio.to_thread(self._open)
        self.take(batch, backlog=True)
        # Each start has a stop flag and a wake pipe of its own: a thread an earlier stop()
        # gave up waiting for keeps the ones it was told to stop by.
        self._stop = threading.Event()
        self._in_flight = threading.Semaphore(MAX_BATCHES_QUEUED)  # a stop left none queued
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(
            target=self._run, args=(self._stop, self._wake_r), name="kmsg", daemon=True
        )
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            os.write(self._wake_w, b"\0")
            await asyncio.to_thread(thread.join, 2.0)
            if not thread.is_alive():  # else it may still be waiting on the pipe
                os.close(self._wake_r)
                os.close(self._wake_w)
        self._reader.close()
        # Left untaken, as the journal closes after this: the journal does not say they were
        # taken, so the next start reads them again from the kernel's buffer or the file.
        with self._queue_lock:
            self._queued.clear()
            self._draining = False  # a start on another loop schedules its own

    async def read(self) -> list[Sample]:
        return list(self.collect())

    def _read(self) -> Batch:
        records = self._reader.read()
        problem = self._reader.watch_problem  # set on opening, and again after a rotation
        if problem != self._watch_noted:
            self._watch_noted = problem
            if problem:
                log.warning(
                    "kernel log %s: polled twice a second, as inotify cannot watch it: %s",
                    self.path,
                    problem,
                )
            else:
                log.info("kernel log %s: watched with inotify again", self.path)
        return Batch(records, self._reader.restarts, self._reader.identity)

    def _open(self) -> Batch:
        try:
            self._reader.open()
            self._skip_if_numbered_otherwise()
            batch = self._read()
        except OSError as exc:
            self._reader.close()
            self._report(open_problem(self.path, exc))
            return Batch([], self._reader.restarts, "")
        self._report("")
        return batch

    def _skip_if_numbered_otherwise(self) -> None:
        """A file an earlier gpuwatch journaled by its inode alone (numbered by count or by the
        kernel, not by line) is taken as read up to now: nothing is taken twice or skipped for
        good. Once: the events after name the file as this one does."""
        identity = self._reader.identity
        older = identity.rsplit(":", 1)[0] if identity.count(":") == 2 else ""
        if older in self._cursors and identity not in self._cursors:
            del self._cursors[older]
            self._reader.skip_to_end()
            log.info(
                "kernel log %s: journaled by an earlier gpuwatch; read from its end", self.path
            )

    def _report(self, problem: str) -> None:
        """Runs in either thread: one assignment, and one log line a change."""
        self._problem = problem
        if problem and problem != self._noted:
            log.error("kernel log: %s; retrying every %.0fs", problem, RETRY_S)
        elif not problem and self._noted:
            log.info("kernel log %s: reading it again", self.path)
        self._noted = problem

    def _run(self, stop: threading.Event, wake: int) -> None:
        while not stop.is_set():
            if not self._reader.is_open:
                if stop.wait(RETRY_S):
                    return
                batch = self._open()
            else:
                readable = self._reader.wait(LOOK_S, wake)
                if stop.is_set():
                    return
                try:
                    batch = self._read()
                except OSError as exc:
                    self._reader.close()
                    self._report(f"{self.path}: {exc.strerror or exc}")
                    continue
                if not batch.records and readable and self._reader.is_device:
                    stop.wait(WAIT_S)
            if not batch.records:
                continue
            if not self._hand_over(batch, stop):
                return

    def _hand_over(self, batch: Batch, stop: threading.Event) -> bool:
        """Queue `batch` for the loop once fewer than MAX_BATCHES_QUEUED wait; False when
        stopping."""
        while not self._in_flight.acquire(timeout=QUEUE_CHECK_S):
            if stop.is_set():
                return False
        if self._loop is None:
            return False
        with self._queue_lock:
            self._queued.append(batch)
            wake, self._draining = not self._draining, True
        if wake:
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop closed while this thread was stopping
                return False
        return True

    def _drain(self) -> None:
        """Take up to RECORDS_A_TURN of the queued records; the rest in a later turn."""
        budget = RECORDS_A_TURN
        while budget > 0:
            with self._queue_lock:
                if not self._queued:
                    self._draining = False
                    return
                batch = self._queued[0]
            part, rest = batch.records[:budget], batch.records[budget:]
            budget -= len(part)
            try:
                self.take(Batch(part, batch.restarts, batch.identity))
            except Exception:  # a fault of ours: that batch is dropped, the log read on
                log.exception("kernel log: taking %d records failed", len(part))
                rest = []
            with self._queue_lock:
                if rest:
                    self._queued[0] = Batch(rest, batch.restarts, batch.identity)
                else:
                    self._queued.popleft()
            if not rest:
                self._in_flight.release()
        if self._loop is not None:
            self._loop.call_soon(self._drain)

    # -- records to events ------------------------------------------------------------------
    def take(self, batch: Batch, backlog: bool = False) -> None:
        """Turn the driver's records after the cursor into events (on the event loop)."""
        if batch.restarts != self._restarts:
            # A log file rotated or truncated holds only what came after: its records are
            # numbered from its start again.
            self._restarts = batch.restarts
            self._identity, self._cursor = batch.identity, -1
        elif batch.identity != self._identity:  # the first read of a log: where it was left
            self._identity = batch.identity
            fallback = self._cursors.get("", -1) if self._unnamed else -1
            self._cursor = self._cursors.get(batch.identity, fallback)
        for record in batch.records:
            if record.seq <= self._cursor:
                continue
            self._cursor = record.seq
            self._record(record, backlog, batch.identity)

    def _record(self, record: Record, backlog: bool, identity: str) -> None:
        if not record.kernel:  # a program's line in a syslog file, a user-space kmsg record
            self._foreign += 1
            return
        text = record.message[record.start :]
        # AER first: the NVSwitch's PCI driver is named nvidia-nvswitch too.
        read = read_aer_line(text) or read_driver_line(text)
        for whole, line in self._joiner.feed(record, read):
            self._take_line(whole, line, backlog, identity)

    def _take_line(self, record: Record, line: DriverLine, backlog: bool, identity: str) -> None:
        if line.kind == "aer":  # only those about an NVIDIA device, or the port above one
            device = self._gpus.nvidia_device(line.pci_bus_id) or self._gpus.nvidia_device(
                line.reporter
            )
            if device is None:
                return
            line = replace(line, pci_bus_id=device)
        self._lines[line.kind] += 1
        event = self._events.event(line, record.seq, self._when(record, backlog))
        if event is None:
            return
        if identity:
            event.data[FILE] = identity
        if event.kind in ("xid", "gpu_lost", "gpu_init_failed", "sxid"):
            log.warning(
                "kernel log: %s", event.message, extra=log_fields(gpu=event.gpu, uuid=event.uuid)
            )
        self._publish(event)

    def _when(self, record: Record, backlog: bool) -> float:
        """A record read as it is printed happened now; one from the kernel's buffer at start
        happened when its timestamp says (microseconds since boot, on the monotonic clock)."""
        now = self._clock.now()
        if not backlog or not self._reader.is_device or record.uptime_us is None:
            return now
        ago = time.clock_gettime(time.CLOCK_MONOTONIC) - record.uptime_us / 1e6
        return now - max(0.0, ago)

    # -- own metrics --------------------------------------------------------------------------
    def collect(self) -> Iterable[Sample]:
        if self._loop is not None:  # started: before, only what it kept from before
            yield Sample(m.KMSG_UP, (), 0.0 if self._problem else 1.0)
        for kind, count in sorted(self._lines.items()):
            yield Sample(m.KMSG_DRIVER_LINES, (("kind", kind),), float(count))
        yield Sample(m.KMSG_SUPPRESSED, (), float(self._events.suppressed))
        yield Sample(m.KMSG_NOT_KERNEL, (), float(self._foreign))
        yield Sample(m.KMSG_OVERWRITTEN, (), float(self._reader.counts.overwritten))
        yield from self._sxids.samples()
