"""Fault events as they happen: NVML's blocking event wait, in a thread of its own.

One event set holds every watched GPU. Three things about NVML shape this (nvml.h):
- registering a mask with one type the GPU does not support registers none of them, so each
  GPU registers XIDs on their own first and every other type apart;
- the wait answers GPU_IS_LOST while any GPU of the set is lost (or another error for a GPU
  in trouble), which would cost every GPU its XIDs: on an error the waiter finds the GPUs
  whose own wait fails, leaves them out for QUARANTINE_S, and rebuilds the set without them;
- a set cannot drop a GPU: a change in the watched GPUs rebuilds it;
- a wait that answers TIMEOUT long before its timeout (a driver in trouble) would turn this
  thread into a busy loop: such a wait is followed by a pause of the wait's length.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from gpuwatch.clock import Clock
from gpuwatch.logs import fields as log_fields
from gpuwatch.nvml.errors import NvmlModule, handle_key
from gpuwatch.nvml.fields import RECOVERY_ACTION_FIELD, RECOVERY_ACTIONS, FieldValues
from gpuwatch.xid.known import xid_event_text

log = logging.getLogger(__name__)

# How long one wait blocks: how long stop() may take (it waits a second for the thread). Each
# wait that times out wakes this thread and raises NVMLError_Timeout; two a second instead of
# four halved the thread's cost (0.16% of a core to 0.07% at 8 simulated GPUs), and events
# still come the moment the driver has them.
WAIT_MS = 500
QUARANTINE_S = 30.0  # how long a GPU whose wait fails stays out of the set
BACKOFF_MAX_S = 30.0  # the longest pause between rebuilds when the wait keeps failing

# The NVML event types gpuwatch listens for, where a GPU supports them, XIDs first (nvml.h's
# bits: pynvml releases before 12.570 lack the names of the R570 types, which older drivers
# simply do not report). Single-bit ECC errors are left out on purpose: one event per corrected
# error is noise; the storm event is the signal.
EVENT_XID = 0x8
EVENT_DBE = 0x2
EVENT_SBE_STORM = 0x200
EVENT_DRAM_RETIREMENT = 0x400
EVENT_DRAM_RETIREMENT_FAILURE = 0x800
EVENT_RECOVERY_ACTION = 0x8000
EVENT_TYPES = (
    EVENT_XID,
    EVENT_DBE,
    EVENT_SBE_STORM,
    EVENT_DRAM_RETIREMENT,
    EVENT_DRAM_RETIREMENT_FAILURE,
    EVENT_RECOVERY_ACTION,
)


class EventWaiter:
    """Watches the GPUs it is given (`watch`) and reports each event through
    `on_event(uuid, event_type, data)`: for an XID, data is the XID; for a recovery-action
    event, the action the driver now asks for (read from its field: the event carries 0).

    The callback runs in this thread; it must hand the event to the event loop itself.
    """

    def __init__(
        self,
        nvml: NvmlModule,
        on_event: Callable[[str, int, int], None],
        clock: Clock,
    ) -> None:
        self._nvml = nvml
        self._on_event = on_event
        self._clock = clock
        self._now = clock.now
        self._stop = threading.Event()
        self._changed = threading.Event()
        self._lock = threading.Lock()
        self._wanted: dict[str, Any] = {}  # uuid -> device handle
        self._quarantined: dict[str, float] = {}  # uuid -> until when it stays out
        # GPUs whose trouble was logged, by kind: registering, and waiting (found by a probe
        # while registering works; noted until a wait with the GPU in the set goes well).
        self._noted: set[str] = set()
        self._noted_wait: set[str] = set()
        self._early_noted = False  # whether a wait that returned early was logged
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self.registered: dict[str, int] = {}  # uuid -> the event types registered for it
        self._field_values = FieldValues(nvml)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        self._changed.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("nvml event thread did not stop within %.1fs; abandoning it", timeout)

    def watch(self, handles: dict[str, Any]) -> None:
        """Watch exactly these GPUs (uuid -> handle) from now on."""
        with self._lock:
            if handles.keys() == self._wanted.keys():
                return
            self._wanted = dict(handles)
        self._changed.set()

    # -- the event set -----------------------------------------------------------------------
    def _register(self, event_set: Any, uuid: str, handle: Any) -> int:
        """Register one GPU for what it supports, XIDs first; the types registered."""
        nvml = self._nvml
        supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
        registered = 0
        for bit in EVENT_TYPES:
            if not supported & bit:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(handle, bit, event_set)
            except nvml.NVMLError_NotSupported:
                continue
            registered |= bit
        if not registered:
            log.info("a GPU reports no fault events", extra=log_fields(uuid=uuid))
        return registered

    def _build(self) -> tuple[Any, dict[int, tuple[str, Any]]]:
        """A new event set with every watched GPU not in quarantine."""
        nvml = self._nvml
        self._changed.clear()
        now = self._now()
        with self._lock:
            wanted = dict(self._wanted)
        self._quarantined = {u: t for u, t in self._quarantined.items() if t > now}
        event_set = nvml.nvmlEventSetCreate()
        by_handle: dict[int, tuple[str, Any]] = {}
        self.registered = {}
        for uuid, handle in wanted.items():
            if uuid in self._quarantined:
                continue
            try:
                types = self._register(event_set, uuid, handle)
            except nvml.NVMLError as exc:
                if uuid not in self._noted:  # once, not every QUARANTINE_S
                    log.warning(
                        "a GPU cannot register for fault events: %s",
                        exc,
                        extra=log_fields(uuid=uuid),
                    )
                    self._noted.add(uuid)
                self._quarantined[uuid] = now + QUARANTINE_S
                continue
            self._noted.discard(uuid)
            if types:
                by_handle[handle_key(handle)] = (uuid, handle)
                self.registered[uuid] = types
        return event_set, by_handle

    def _free(self, event_set: Any) -> None:
        try:
            self._nvml.nvmlEventSetFree(event_set)
        except self._nvml.NVMLError as exc:
            log.debug("nvmlEventSetFree: %s", exc)

    def _find_failing(self, by_handle: dict[int, tuple[str, Any]]) -> list[str]:
        """The GPUs whose own event wait fails: each in a set of its own, waited on without
        blocking. An event such a wait returns is delivered, not lost."""
        nvml = self._nvml
        failing = []
        for uuid, handle in by_handle.values():
            try:
                probe = nvml.nvmlEventSetCreate()
            except nvml.NVMLError:
                continue
            try:
                self._register(probe, uuid, handle)
                data = nvml.nvmlEventSetWait_v2(probe, 0)
                self._deliver(data, {handle_key(handle): (uuid, handle)})
            except nvml.NVMLError_Timeout:
                pass
            except nvml.NVMLError as exc:
                if uuid not in self._noted_wait:
                    log.warning(
                        "a GPU's fault events cannot be watched: %s; retrying every %.0fs",
                        exc,
                        QUARANTINE_S,
                        extra=log_fields(uuid=uuid),
                    )
                    self._noted_wait.add(uuid)
                failing.append(uuid)
            finally:
                self._free(probe)
        return failing

    # -- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        nvml = self._nvml
        backoff = 1.0
        event_set = None
        by_handle: dict[int, tuple[str, Any]] = {}
        try:
            while not self._stop.is_set():
                if event_set is None or self._changed.is_set() or self._quarantine_over():
                    if event_set is not None:
                        self._free(event_set)
                        event_set = None
                    try:
                        event_set, by_handle = self._build()
                    except nvml.NVMLError as exc:
                        log.warning("fault events unavailable: nvmlEventSetCreate: %s", exc)
                        self._clock.block_until(self._stop, BACKOFF_MAX_S)
                        continue
                if not by_handle:
                    self._clock.block_until(self._changed, 1.0)
                    continue
                began = self._now()
                try:
                    data = nvml.nvmlEventSetWait_v2(event_set, WAIT_MS)
                except nvml.NVMLError_Timeout:
                    backoff = 1.0
                    self._waited_well(by_handle)
                    self._pace(began)
                    continue
                except nvml.NVMLError as exc:
                    failing = self._find_failing(by_handle)
                    now = self._now()
                    for uuid in failing:
                        self._quarantined[uuid] = now + QUARANTINE_S
                    if not failing:  # no GPU alone fails: wait before trying again
                        log.warning("nvml event wait failed: %s; retrying in %.0fs", exc, backoff)
                        self._clock.block_until(self._stop, backoff)
                        backoff = min(backoff * 2, BACKOFF_MAX_S)
                    self._changed.set()  # rebuild without the failing GPUs
                    continue
                self._waited_well(by_handle)
                self._deliver(data, by_handle)
        finally:
            if event_set is not None:
                self._free(event_set)

    def _waited_well(self, by_handle: dict[int, tuple[str, Any]]) -> None:
        """A wait went well: the GPUs in the set whose wait had failed are watched again."""
        if not self._noted_wait:
            return
        for uuid, _ in by_handle.values():
            if uuid in self._noted_wait:
                self._noted_wait.discard(uuid)
                log.info("a GPU's fault events are watched again", extra=log_fields(uuid=uuid))

    def _pace(self, began: float) -> None:
        """After a wait that timed out: if it returned well before its timeout, pause for the
        rest of it, so that a driver whose wait does not block costs no more than one that does."""
        waited = self._now() - began
        if waited >= WAIT_MS / 2000:
            return
        if not self._early_noted:
            log.warning(
                "the nvml event wait answers TIMEOUT without waiting (after %.3fs of %.3fs);"
                " pausing between waits, fault events may be late or missing",
                waited,
                WAIT_MS / 1000,
            )
            self._early_noted = True
        self._clock.block_until(self._stop, WAIT_MS / 1000 - waited)

    def _quarantine_over(self) -> bool:
        now = self._now()
        return any(until <= now for until in self._quarantined.values())

    def _deliver(self, data: Any, by_handle: dict[int, tuple[str, Any]]) -> None:
        found = by_handle.get(handle_key(data.device))
        if found is None:
            return
        uuid, handle = found
        event_type, value = int(data.eventType), int(data.eventData)
        if event_type & EVENT_RECOVERY_ACTION:
            value = self._recovery_action(handle)
        self._on_event(uuid, event_type, value)

    def _recovery_action(self, handle: Any) -> int:
        """The action the driver asks for now; -1 when it cannot be read."""
        nvml = self._nvml
        try:
            fv = nvml.nvmlDeviceGetFieldValues(handle, [RECOVERY_ACTION_FIELD])[0]
        except nvml.NVMLError as exc:
            log.warning("the recovery action cannot be read: %s", exc)
            return -1
        returned, value = self._field_values.one(fv)
        return int(value) if returned == nvml.NVML_SUCCESS else -1


def describe(
    gpu: int | None, event_type: int, data: int
) -> tuple[str, str, dict[str, int | float | str]]:
    """(kind, message, data) of the journal entry for one NVML event."""
    if event_type & EVENT_XID:
        return "xid", *xid_event_text(data, gpu)
    if event_type & EVENT_DBE:
        return "ecc", f"GPU {gpu}: uncorrectable (double-bit) ECC error", {"type": "dbe"}
    if event_type & EVENT_SBE_STORM:
        return (
            "ecc",
            f"GPU {gpu}: storm of corrected (single-bit) ECC errors",
            {"type": "sbe_storm"},
        )
    if event_type & EVENT_DRAM_RETIREMENT:
        message = f"GPU {gpu}: memory row remapped or page retired; a GPU reset activates it"
        return "memory_retirement", message, {"outcome": "recorded"}
    if event_type & EVENT_DRAM_RETIREMENT_FAILURE:
        message = f"GPU {gpu}: memory row remapping or page retirement failed"
        return "memory_retirement", message, {"outcome": "failed"}
    if event_type & EVENT_RECOVERY_ACTION:
        if 0 <= data < len(RECOVERY_ACTIONS):
            action = RECOVERY_ACTIONS[data]
            return "recovery_action", f"GPU {gpu}: the driver asks for {action}", {"action": action}
        message = f"GPU {gpu}: the driver's recovery action changed (unreadable: {data})"
        return "recovery_action", message, {"action": str(data)}
    return "nvml_event", f"GPU {gpu}: NVML event type 0x{event_type:x}", {"data": data}
