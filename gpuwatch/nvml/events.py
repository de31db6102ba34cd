"""Fault events as they happen: NVML's blocking event wait, in a thread of its own."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from gpuwatch.nvml.device import RECOVERY_ACTIONS, NvmlModule, handle_key
from gpuwatch.xid import xid_event_text

log = logging.getLogger(__name__)

WAIT_MS = 250  # how long one wait blocks; bounds how long stop() takes

# The NVML event types gpuwatch listens for, where a GPU supports them. Single-bit ECC errors
# are left out on purpose: one event per corrected error is noise; the storm event is the signal.
EVENT_TYPES = (
    "nvmlEventTypeXidCriticalError",
    "nvmlEventTypeDoubleBitEccError",
    "nvmlEventTypeSingleBitEccErrorStorm",
    "nvmlEventTypeDramRetirementEvent",
    "nvmlEventTypeDramRetirementFailure",
    "nvmlEventTypeGpuRecoveryAction",
)


def wanted_mask(nvml: NvmlModule) -> int:
    """The event types above that this pynvml knows (older ones lack the newer types)."""
    mask = 0
    for name in EVENT_TYPES:
        mask |= int(getattr(nvml, name, 0))
    return mask


class EventWaiter:
    """Registers every GPU for the event types above and reports each event through
    `on_event(uuid, event_type, event_data)`; for an XID, event_data is the XID.

    The callback runs in this thread; it must hand the event to the event loop itself.
    """

    def __init__(
        self,
        nvml: NvmlModule,
        handles: dict[str, Any],
        on_event: Callable[[str, int, int], None],
    ) -> None:
        self._nvml = nvml
        self._handles = handles
        self._on_event = on_event
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self.registered: list[str] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("nvml event thread did not stop within %.1fs; abandoning it", timeout)

    def _register(self, event_set: Any) -> dict[int, str]:
        nvml = self._nvml
        by_handle: dict[int, str] = {}
        wanted = wanted_mask(nvml)
        for uuid, handle in self._handles.items():
            try:
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
                mask = supported & wanted
                if not mask:
                    log.info("uuid=%s reports no fault events", uuid)
                    continue
                nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
            except nvml.NVMLError as exc:
                log.warning("uuid=%s cannot register for fault events: %s", uuid, exc)
                continue
            by_handle[handle_key(handle)] = uuid
            self.registered.append(uuid)
        return by_handle

    def _run(self) -> None:
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.warning("fault events unavailable: nvmlEventSetCreate failed: %s", exc)
            return
        try:
            by_handle = self._register(event_set)
            while by_handle and not self._stop.is_set():
                try:
                    data = nvml.nvmlEventSetWait_v2(event_set, WAIT_MS)
                except nvml.NVMLError_Timeout:
                    continue
                except nvml.NVMLError as exc:
                    log.warning("nvml event wait failed: %s", exc)
                    self._stop.wait(1.0)
                    continue
                uuid = by_handle.get(handle_key(data.device))
                if uuid is not None:
                    self._on_event(uuid, int(data.eventType), int(data.eventData))
        finally:
            try:
                nvml.nvmlEventSetFree(event_set)
            except nvml.NVMLError as exc:
                log.debug("nvmlEventSetFree: %s", exc)


def describe(
    nvml: NvmlModule, gpu: int | None, event_type: int, data: int
) -> tuple[str, str, dict[str, int | float | str]]:
    """(kind, message, data) of the journal entry for one NVML event."""
    if event_type & nvml.nvmlEventTypeXidCriticalError:
        return "xid", *xid_event_text(data, gpu)
    if event_type & nvml.nvmlEventTypeDoubleBitEccError:
        return "ecc", f"GPU {gpu}: uncorrectable (double-bit) ECC error", {"type": "dbe"}
    if event_type & getattr(nvml, "nvmlEventTypeSingleBitEccErrorStorm", 0):
        return (
            "ecc",
            f"GPU {gpu}: storm of corrected (single-bit) ECC errors",
            {"type": "sbe_storm"},
        )
    if event_type & getattr(nvml, "nvmlEventTypeDramRetirementEvent", 0):
        message = f"GPU {gpu}: memory row remapped or page retired; a GPU reset activates it"
        return "memory_retirement", message, {"outcome": "recorded"}
    if event_type & getattr(nvml, "nvmlEventTypeDramRetirementFailure", 0):
        message = f"GPU {gpu}: memory row remapping or page retirement failed"
        return "memory_retirement", message, {"outcome": "failed"}
    if event_type & getattr(nvml, "nvmlEventTypeGpuRecoveryAction", 0):
        action = RECOVERY_ACTIONS[data] if 0 <= data < len(RECOVERY_ACTIONS) else str(data)
        return "recovery_action", f"GPU {gpu}: the driver asks for {action}", {"action": action}
    return "nvml_event", f"GPU {gpu}: NVML event type 0x{event_type:x}", {"data": data}
