"""The simulated NVML library's calls about devices: identity, processes, MIG and events."""

from __future__ import annotations

import ctypes
from typing import Any

from gpuwatch.sim import cdefs as c
from gpuwatch.sim.driver import ECC_EVENTS
from gpuwatch.sim.node import SimEvent
from gpuwatch.sim.nvml_core import (
    VIRTUALIZATION_VGPU,
    Answer,
    Device,
    EventSet,
    LibraryCore,
    bus_id,
    put,
    put_text,
    uuid_of,
)


class DeviceCalls(LibraryCore):
    """Entry points that name devices, list their processes and deliver their events."""

    # -- identity --------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: int, out: int, length: int) -> int:
        dev = self._device(handle)
        seed, salt = self.scenario.seed, self._salt
        board = self.scenario.board(dev.gpu.index)
        if dev.instance is None:
            text = uuid_of(seed, board, salt=salt)
        else:
            text = uuid_of(seed, 1000 + board * 16 + dev.instance.index, "MIG", salt)
        put_text(out, length, text)
        return c.SUCCESS

    def nvmlDeviceGetName(self, handle: int, out: int, length: int) -> int:
        dev = self._device(handle)
        name = dev.gpu.model.name
        if dev.instance is not None:  # as the driver names a MIG device
            name = f"{name} MIG {dev.instance.profile}"
        put_text(out, length, name)
        return c.SUCCESS

    def nvmlDeviceGetSerial(self, handle: int, out: int, length: int) -> int:
        gpu = self._whole_gpu(handle)
        board = (self._salt % 10**9 or self.scenario.seed) * 1000 + self.scenario.board(gpu.index)
        put_text(out, length, f"{1650000000000 + board}")
        return c.SUCCESS

    def nvmlDeviceGetVbiosVersion(self, handle: int, out: int, length: int) -> int:
        put_text(out, length, self._whole_gpu(handle).model.vbios)
        return c.SUCCESS

    def nvmlDeviceGetPciInfo_v3(self, handle: int, out: int) -> int:
        gpu = self._device(handle).gpu
        if not out:
            return c.ERROR_INVALID_ARGUMENT
        info = c.PciInfo.from_address(out)
        text = bus_id(gpu.index)
        info.busId = text.encode()
        info.busIdLegacy = text[4:].encode()
        info.domain, info.bus = (int(part, 16) for part in text.split(":")[:2])
        info.pciDeviceId = 0x233010DE
        return c.SUCCESS

    def nvmlDeviceGetVirtualizationMode(self, handle: int, out: int) -> int:
        self._device(handle)
        put(ctypes.c_uint, out, VIRTUALIZATION_VGPU if self._vgpu else 0)
        return c.SUCCESS

    # -- processes -------------------------------------------------------------------------
    def _processes(self, dev: Device) -> list[tuple[int, int, int, int]]:
        """(pid, used memory, GPU instance id, compute instance id) of each process."""
        pids = list(self.node.pids)
        if not pids:
            return []
        gpu = dev.gpu
        instance = dev.instance
        if gpu.instances and instance is None:
            instance = gpu.instances[0]  # the parent lists its instances' processes
        elif instance is not None and instance.index != 0:
            return []
        _, _, allocated = self._memory(dev if dev.instance else Device(gpu, instance))
        shares = [0.9] + [0.1 / (len(pids) - 1)] * (len(pids) - 1) if len(pids) > 1 else [1.0]
        gi, ci = (instance.gpu_instance_id, 0) if instance else (c.NO_INSTANCE, c.NO_INSTANCE)
        return [(pid, int(allocated * s), gi, ci) for pid, s in zip(pids, shares, strict=True)]

    def _write_processes(self, handle: int, count: int, infos: int, struct: Any) -> int:
        found = self._processes(self._device(handle))
        if not count:
            return c.ERROR_INVALID_ARGUMENT
        room = ctypes.c_uint.from_address(count)
        if room.value < len(found) or (found and not infos):
            room.value = len(found)
            return c.ERROR_INSUFFICIENT_SIZE
        size = ctypes.sizeof(struct)
        for i, (pid, used, gi, ci) in enumerate(found):
            info = struct.from_address(infos + i * size)
            info.pid, info.usedGpuMemory = pid, used
            if hasattr(info, "gpuInstanceId"):
                info.gpuInstanceId, info.computeInstanceId = gi, ci
        room.value = len(found)
        return c.SUCCESS

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int, count: int, infos: int) -> int:
        return self._write_processes(handle, count, infos, c.ProcessInfoV1)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: int, count: int, infos: int) -> int:
        return self._write_processes(handle, count, infos, c.ProcessInfoV2)

    # R510 and later: the same 24-byte struct as _v2 (nvmlProcessInfo_t).
    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses_v2

    # -- MIG -------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: int, current: int, pending: int) -> int:
        gpu = self._whole_gpu(handle)
        if not gpu.model.mig_capable:
            return c.ERROR_NOT_SUPPORTED
        mode = 1 if gpu.instances else 0
        put(ctypes.c_uint, current, mode)
        put(ctypes.c_uint, pending, mode)
        return c.SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        if not gpu.model.mig_capable:
            return c.ERROR_NOT_SUPPORTED
        put(ctypes.c_uint, out, 7)
        return c.SUCCESS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, index: int, out: int) -> int:
        gpu = self._whole_gpu(handle)
        if not gpu.instances:
            return c.ERROR_NOT_SUPPORTED if not gpu.model.mig_capable else c.ERROR_INVALID_ARGUMENT
        dev = self._instances.get((gpu.index, index))
        if dev is None:
            return c.ERROR_NOT_FOUND
        put(ctypes.c_void_p, out, dev.address)
        return c.SUCCESS

    def nvmlDeviceIsMigDeviceHandle(self, handle: int, out: int) -> int:
        put(ctypes.c_uint, out, int(self._device(handle).instance is not None))
        return c.SUCCESS

    def nvmlDeviceGetGpuInstanceId(self, handle: int, out: int) -> int:
        dev = self._device(handle)
        if dev.instance is None:
            return c.ERROR_NOT_SUPPORTED
        put(ctypes.c_uint, out, dev.instance.gpu_instance_id)
        return c.SUCCESS

    def nvmlDeviceGetComputeInstanceId(self, handle: int, out: int) -> int:
        if self._device(handle).instance is None:
            return c.ERROR_NOT_SUPPORTED
        put(ctypes.c_uint, out, 0)
        return c.SUCCESS

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: int, out: int) -> int:
        dev = self._device(handle)
        if dev.instance is None:
            return c.ERROR_NOT_SUPPORTED
        put(ctypes.c_void_p, out, self._gpus[dev.gpu.index].address)
        return c.SUCCESS

    # -- events ----------------------------------------------------------------------------
    def nvmlEventSetCreate(self, out: int) -> int:
        self._check_init()
        now = self.clock.now()  # a new set gets the events from now on
        event_set = EventSet(delivered=sum(1 for e in self.node.events if e.time <= now))
        with self._lock:
            self._event_sets[ctypes.addressof(event_set.memory)] = event_set
        put(ctypes.c_void_p, out, ctypes.addressof(event_set.memory))
        return c.SUCCESS

    def _event_set(self, address: int | None) -> EventSet:
        self._check_init()
        event_set = self._event_sets.get(address or 0)
        if event_set is None:
            raise Answer(c.ERROR_INVALID_ARGUMENT)
        return event_set

    def _event_types(self) -> int:
        types = self.profile.event_types
        return types if self.scenario.ecc else types & ~ECC_EVENTS

    def nvmlDeviceGetSupportedEventTypes(self, handle: int, out: int) -> int:
        self._whole_gpu(handle)
        put(ctypes.c_ulonglong, out, self._event_types())
        return c.SUCCESS

    def nvmlDeviceRegisterEvents(self, handle: int, event_types: int, address: int) -> int:
        gpu = self._whole_gpu(handle)
        event_set = self._event_set(address)
        if event_types & ~self._event_types():
            # nvml.h: NOT_SUPPORTED if some requested type is not; none of them is registered.
            return c.ERROR_NOT_SUPPORTED
        with self._lock:
            event_set.masks[gpu.index] = event_set.masks.get(gpu.index, 0) | event_types
        return c.SUCCESS

    def nvmlEventSetWait_v2(self, address: int, out: int, timeout_ms: int) -> int:
        event_set = self._event_set(address)
        if not out:
            return c.ERROR_INVALID_ARGUMENT
        deadline = self.clock.now() + timeout_ms / 1000.0
        while True:
            # As a driver does (and NVIDIA's own mock NVML models): events up to a GPU's loss
            # are delivered, its XID 79 among them; from then on the wait answers
            # GPU_IS_LOST at once, for every GPU of the set, while the lost one is in it.
            error, since = self._wait_error(event_set)
            event = self._next_event(event_set, until=since)
            if event is not None:
                data = c.EventData.from_address(out)
                data.device = self._gpus[event.gpu].address
                data.eventType, data.eventData = event.event_type, event.data
                data.gpuInstanceId = data.computeInstanceId = c.NO_INSTANCE
                return c.SUCCESS
            if error is not None:
                return error
            now = self.clock.now()
            if now >= deadline:
                return c.ERROR_TIMEOUT
            # Sleep until the next scheduled event or the timeout, like a blocking wait.
            self.clock.block(min(deadline, self._next_event_time(event_set)) - now)

    def _wait_error(self, event_set: EventSet) -> tuple[int | None, float]:
        """The error the wait answers (GPU_IS_LOST while a GPU of the set is lost; an
        event_wait_error fault's error), and since when: (None, inf) when none."""
        now = self.clock.now()
        found: tuple[int | None, float] = (None, float("inf"))
        for index in list(event_set.masks):
            gpu = self.node.gpus[index]
            lost = gpu.lost_since(now)
            fault = gpu.active("event_wait_error", now)
            if lost is not None:
                candidate = (c.ERROR_GPU_IS_LOST, lost)
            elif fault is not None and fault.error:
                candidate = (c.ERRORS[fault.error], self.node.start + fault.at)
            else:
                continue
            if candidate[1] < found[1]:
                found = candidate
        return found

    def _next_event(self, event_set: EventSet, until: float) -> SimEvent | None:
        """The set's next event due by now and no later than `until`, consumed."""
        limit = min(self.clock.now(), until)
        with self._lock:
            while event_set.delivered < len(self.node.events):
                event = self.node.events[event_set.delivered]
                if event.time > limit:
                    return None
                event_set.delivered += 1
                if event_set.masks.get(event.gpu, 0) & event.event_type:
                    return event
        return None

    def _next_event_time(self, event_set: EventSet) -> float:
        with self._lock:
            pending = self.node.events[event_set.delivered :]
        return pending[0].time if pending else float("inf")

    def nvmlEventSetFree(self, address: int) -> int:
        event_set = self._event_set(address)
        with self._lock:
            event_set.masks.clear()
            self._event_sets.pop(address, None)
        return c.SUCCESS
