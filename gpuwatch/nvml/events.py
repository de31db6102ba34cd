"""XID events as they happen: NVML's blocking event wait, in a thread of its own."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from gpuwatch.nvml.device import NvmlModule, handle_key

log = logging.getLogger(__name__)

WAIT_MS = 250  # how long one wait blocks; bounds how long stop() takes


class EventWaiter:
    """Registers every GPU for XID events and reports each one through `on_xid(uuid, code)`.

    The callback runs in this thread; it must hand the event to the event loop itself.
    """

    def __init__(
        self,
        nvml: NvmlModule,
        handles: dict[str, Any],
        on_xid: Callable[[str, int], None],
    ) -> None:
        self._nvml = nvml
        self._handles = handles
        self._on_xid = on_xid
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
        for uuid, handle in self._handles.items():
            try:
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
                mask = supported & nvml.nvmlEventTypeXidCriticalError
                if not mask:
                    log.info("uuid=%s does not report XID events", uuid)
                    continue
                nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
            except nvml.NVMLError as exc:
                log.warning("uuid=%s cannot register for XID events: %s", uuid, exc)
                continue
            by_handle[handle_key(handle)] = uuid
            self.registered.append(uuid)
        return by_handle

    def _run(self) -> None:
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.warning("XID events unavailable: nvmlEventSetCreate failed: %s", exc)
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
                if data.eventType & nvml.nvmlEventTypeXidCriticalError:
                    uuid = by_handle.get(handle_key(data.device))
                    if uuid is not None:
                        self._on_xid(uuid, int(data.eventData))
        finally:
            try:
                nvml.nvmlEventSetFree(event_set)
            except nvml.NVMLError as exc:
                log.debug("nvmlEventSetFree: %s", exc)
