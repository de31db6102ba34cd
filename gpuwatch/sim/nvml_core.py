"""The simulated NVML library's plumbing: C entry points over Python methods, handles, and
how an answer is written into the caller's memory (library.py puts the calls together)."""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import logging
import random
import threading
import time
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.clock import Clock
from gpuwatch.sim import cdefs as c
from gpuwatch.sim.node import SimGpu, SimNode
from gpuwatch.sim.noise import hash01
from gpuwatch.sim.reading import RESERVED_FRACTION, SimInstance
from gpuwatch.sim.scenario import Scenario

log = logging.getLogger(__name__)

RETIRED_DBE_PAGES = 3  # of a retired_pages fault's pages, retired for double-bit errors
VIRTUALIZATION_VGPU = 2  # nvmlGpuVirtualizationMode_t: a guest with a vGPU
SUPPORTED_REASONS = 0xFF  # idle, app clocks, sw power cap, hw slowdown, sync boost, thermal, brake

# nvml.h field ids.
FI_ECC_SBE_VOL, FI_ECC_DBE_VOL, FI_ECC_SBE_AGG, FI_ECC_DBE_AGG = 3, 4, 5, 6
FI_RETIRED_SBE, FI_RETIRED_DBE, FI_RETIRED_PENDING = 29, 30, 31
FI_NVLINK_CRC_DATA_L0_5 = range(39, 45)
FI_NVLINK_CRC_DATA_L6_11 = range(102, 108)
FI_MEMORY_TEMP = 82
FI_NVLINK_SPEED_COMMON = 90
FI_NVLINK_LINK_COUNT = 91
FI_PCIE_REPLAY = 94
FI_NVLINK_TX, FI_NVLINK_RX = 138, 139
FI_REMAPPED_COR, FI_REMAPPED_UNC, FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE = 142, 143, 144, 145
FI_NVLINK_DL_REPLAY, FI_NVLINK_DL_RECOVERY, FI_NVLINK_DL_CRC = 161, 162, 163
FI_NVLINK_STATE = 165
FI_ENERGY = 191
FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES = 197, 198
PCIE_UTIL_TX, PCIE_UTIL_RX = 0, 1  # nvml.h's nvmlPcieUtilCounter_t
PCIE_THROUGHPUT_WINDOW_S = 0.02  # nvml.h: nvmlDeviceGetPcieThroughput's sampling interval
FI_NVLINK5_RECOVERY_FAILED, FI_NVLINK5_RECOVERY = 214, 215
FI_NVLINK5_EFFECTIVE_ERRORS, FI_NVLINK5_SYMBOL_ERRORS = 219, 221
FI_RECOVERY_ACTION = 230
_ECC = (FI_ECC_SBE_VOL, FI_ECC_DBE_VOL, FI_ECC_SBE_AGG, FI_ECC_DBE_AGG)
_REMAP = (FI_REMAPPED_COR, FI_REMAPPED_UNC, FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE)
_RETIRED = (FI_RETIRED_SBE, FI_RETIRED_DBE, FI_RETIRED_PENDING)
_NVLINK5 = (
    FI_NVLINK5_RECOVERY_FAILED,
    FI_NVLINK5_RECOVERY,
    FI_NVLINK5_EFFECTIVE_ERRORS,
    FI_NVLINK5_SYMBOL_ERRORS,
)
_PER_LINK = (
    FI_NVLINK_TX,
    FI_NVLINK_RX,
    FI_NVLINK_STATE,
    FI_NVLINK_DL_REPLAY,
    FI_NVLINK_DL_RECOVERY,
    FI_NVLINK_DL_CRC,
    *_NVLINK5,
)
# nvmlDeviceGetNvLinkErrorCounter's counters (nvmlNvLinkErrorCounter_t) -> their field id.
_LINK_COUNTERS = {0: FI_NVLINK_DL_REPLAY, 1: FI_NVLINK_DL_RECOVERY, 2: FI_NVLINK_DL_CRC}
_LINK_COUNTER_CRC_DATA = 3
_MEMORY_TYPE_CORRECTED = 0
_VOLATILE_ECC = 0
_RETIREMENT_CAUSE_SBE = 0
_TEMPERATURE_GPU = 0
_CLOCK_SM, _CLOCK_MEM = 1, 2
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


class Answer(Exception):  # noqa: N818 - not an error: the return code to hand back
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def node_salt(node: str) -> int:
    """A number from a node's name that makes its simulated identities its own: two simulated
    nodes with the same scenario must not share GPU UUIDs (one Prometheus scrapes both).
    0 for no name, which keeps the identities a scenario has always had."""
    if not node:
        return 0
    return int.from_bytes(hashlib.blake2b(node.encode(), digest_size=8).digest(), "big")


def uuid_of(seed: int, index: int, prefix: str = "GPU", salt: int = 0) -> str:
    parts = (seed, index) if not salt else (seed, salt, index)
    digits = "".join(f"{int(hash01(*parts, k) * 2**32):08x}" for k in range(4))
    return f"{prefix}-{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:32]}"


def bus_id(index: int) -> str:
    """GPU `index`'s PCI address, as NVML writes it: an HGX board's buses, and past 8 GPUs (the
    benchmarks' nodes) more boards, each in a PCI domain of its own, as a bus number has 8
    bits. Domains 1 and 2 are the simulated host's NICs' and NVSwitches'."""
    board, slot = divmod(index, len(_HGX_BUSES))
    domain = 0x10 + board if board else 0
    return f"{domain:08X}:{_HGX_BUSES[slot]:02X}:00.0"


@dataclass(eq=False)
class Device:
    """What a handle points at: a GPU, or one of its MIG instances."""

    gpu: SimGpu
    instance: SimInstance | None = None
    # The handle is the address of this buffer: unique while the library lives.
    memory: ctypes.Array[ctypes.c_char] = field(
        default_factory=lambda: ctypes.create_string_buffer(8)
    )

    @property
    def address(self) -> int:
        return ctypes.addressof(self.memory)


@dataclass(eq=False)
class EventSet:
    masks: dict[int, int] = field(default_factory=dict)  # GPU index -> registered types
    delivered: int = 0  # how many of the node's events this set has gone past
    memory: ctypes.Array[ctypes.c_char] = field(
        default_factory=lambda: ctypes.create_string_buffer(8)
    )


def put(ctype: Any, address: int | None, value: Any) -> None:
    if not address:
        raise Answer(c.ERROR_INVALID_ARGUMENT)
    ctype.from_address(address).value = value


def put_text(address: int | None, length: int, text: str) -> None:
    data = text.encode() + b"\0"
    if not address:
        raise Answer(c.ERROR_INVALID_ARGUMENT)
    if len(data) > length:
        raise Answer(c.ERROR_INSUFFICIENT_SIZE)
    ctypes.memmove(address, data, len(data))


ACCOUNT_EVERY = 8  # with account_cpu: one call in this many is timed, on average


def _clock_read_cost() -> float:
    """What reading the thread's CPU clock adds to an interval timed by it (the least of a few
    empty intervals)."""
    return min(-time.thread_time() + time.thread_time() for _ in range(64))


class LibraryCore:
    """The state every group of entry points shares, and the plumbing they call."""

    def __init__(
        self, scenario: Scenario, clock: Clock, *, account_cpu: bool = False, node: str = ""
    ) -> None:
        self.node = SimNode(scenario, clock)
        self._salt = node_salt(node)
        # The CPU time spent inside this library's entry points (benches: what a real
        # driver's C code would cost instead), when asked for. One call in ACCOUNT_EVERY,
        # drawn at random, is timed and counts for that many: reading a thread's CPU clock
        # is a system call, and two for every call cost the daemon about as much as it
        # measured its own changes by.
        # A timed call also holds one clock read's own cost: taken off, or counting each
        # timed call eight times would charge it to the seven untimed ones too.
        self.account_cpu = account_cpu
        self.cpu_seconds = 0.0
        self._draw = random.Random(0).random
        self._clock_read = _clock_read_cost() if account_cpu else 0.0
        self.scenario = scenario
        self.profile = scenario.driver
        self.clock = clock
        self.calls = itertools.count()  # entry-point calls made (tests and benches read it)
        self.called: Counter[str] = Counter()  # the same, by entry point (approximate)
        self._lock = threading.Lock()
        self._initialized = 0
        self._gpus = [Device(gpu) for gpu in self.node.gpus]
        self._instances = {
            (gpu.index, inst.index): Device(gpu, inst)
            for gpu in self.node.gpus
            for inst in gpu.instances
        }
        self._devices = {dev.address: dev for dev in (*self._gpus, *self._instances.values())}
        self._event_sets: dict[int, EventSet] = {}
        self._error_texts: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self.library = types.SimpleNamespace(
            **{name: self._entry_point(name) for name in sorted(self.profile.entry_points)}
        )

    def cpu_used(self) -> float:
        """CPU seconds spent in the entry points so far (0 unless `account_cpu`)."""
        return self.cpu_seconds

    # -- plumbing --------------------------------------------------------------------------
    def _entry_point(self, name: str) -> Any:
        impl: Callable[..., int | None] = getattr(self, name)
        restype = ctypes.c_void_p if name == "nvmlErrorString" else ctypes.c_int
        prototype = ctypes.CFUNCTYPE(restype, *c.SIGNATURES[name])

        called = self.called

        def call(*args: Any) -> int | None:
            next(self.calls)
            called[name] += 1
            try:
                return impl(*args)
            except Answer as answer:
                return answer.code
            except Exception:  # a simulator bug must not look like a driver answer of 0
                log.exception("simulated %s failed", name)
                return c.ERROR_UNKNOWN

        def accounted(*args: Any) -> int | None:
            if self._draw() >= 1 / ACCOUNT_EVERY:
                return call(*args)
            start = time.thread_time()
            try:
                return call(*args)
            finally:
                spent = max(0.0, time.thread_time() - start - self._clock_read)
                with self._lock:
                    self.cpu_seconds += spent * ACCOUNT_EVERY

        return prototype(accounted if self.account_cpu else call)

    def _check_init(self) -> None:
        if not self._initialized:
            raise Answer(c.ERROR_UNINITIALIZED)

    def _device(self, handle: int | None) -> Device:
        """The device behind a handle, after playing its GPU's faults: a hang blocks, a lost
        GPU answers GPU_IS_LOST, an nvml_error fault answers its error."""
        self._check_init()
        dev = self._devices.get(handle or 0)
        if dev is None:
            raise Answer(c.ERROR_INVALID_ARGUMENT)
        gpu = dev.gpu
        now = self.clock.now()
        until = gpu.hang_until(now)
        if until is not None:
            self.clock.block(until - now)
        if gpu.lost(self.clock.now()):
            raise Answer(c.ERROR_GPU_IS_LOST)
        error = gpu.error_now()
        if error is not None:
            raise Answer(error)
        return dev

    def _whole_gpu(self, handle: int | None) -> SimGpu:
        """A GPU handle for a call MIG instances do not answer."""
        dev = self._device(handle)
        if dev.instance is not None:
            raise Answer(c.ERROR_NOT_SUPPORTED)
        return dev.gpu

    @property
    def _vgpu(self) -> bool:
        return self.scenario.virtualization == "vgpu_guest"

    def _not_in_vgpu_guest(self) -> None:
        if self._vgpu:
            raise Answer(c.ERROR_NOT_SUPPORTED)

    def _memory(self, dev: Device) -> tuple[int, int, int]:
        """(total, reserved, allocated) in bytes."""
        gpu = dev.gpu
        r = gpu.reading()
        share = r.memory_used / r.memory_total
        if dev.instance is not None:
            total = dev.instance.memory_total
            return total, 0, int(total * share) if dev.instance.index == 0 else 0
        reserved = int(r.memory_total * RESERVED_FRACTION)
        if gpu.instances:  # the parent of MIG instances: what they hold together
            first = gpu.instances[0]
            return r.memory_total, reserved, int(first.memory_total * share)
        return r.memory_total, reserved, r.memory_used
