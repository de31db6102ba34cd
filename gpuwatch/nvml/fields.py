"""Which NVML field values gpuwatch asks for, and what each becomes.

Most counters and states come from one nvmlDeviceGetFieldValues call per tier; each entry has
its own return code, so a field the driver lacks costs only that field. NVLink5 (Blackwell)
replaced the data-link error counters (fields 161-163, unsupported there) with its own:
they are asked for on every part and answer NOT_SUPPORTED where they do not apply.
"""

from __future__ import annotations

import ctypes
import re
import struct
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwatch import metrics as m
from gpuwatch.model import Labels, series_text
from gpuwatch.nvml.errors import NvmlModule
from gpuwatch.nvml.fallbacks import Reader

CLOCK_EVENT_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clock_setting"),
)
# nvmlDeviceGpuRecoveryAction_t, in order (nvml.h 13.5 added 5-7).
RECOVERY_ACTIONS = (
    "none",
    "gpu_reset",
    "node_reboot",
    "drain_p2p",
    "drain_and_reset",
    "recover_imex_domain",
    "bus_reset",
    "system_reboot",
)
# nvml.h's NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (R570); pynvml names it from 12.570 only.
RECOVERY_ACTION_FIELD = 230
# PCIe traffic counters (R550; pynvml releases before 12.570 lack their names). nvml.h says
# only "Value can be wrapped": a 32-bit answer would wrap every 4 GiB, more often than a
# saturated link is read, so only a 64-bit answer is kept (FieldPlan.wide).
PCIE_BYTES_FIELDS = ((197, "tx"), (198, "rx"))
NARROW_TYPES = frozenset({1, 5, 6})  # nvmlValueType_t: unsigned int, signed int, unsigned short
# Legacy per-link CRC data counters exist for links 0-11 only; NVLink4+ parts do not report them.
LEGACY_LINKS = 12
# NVLink5 counters (nvml.h field ids; pynvml releases before 12.570 lack their names).
NVLINK5_ERRORS = (
    (214, "link_recovery_failed"),  # NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS
    (215, "link_recovery"),  # NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS
    (219, "effective"),  # NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS: left after FEC
    (221, "symbol"),  # NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS: corrected by FEC
)


@dataclass(frozen=True, slots=True)
class FieldPlan:
    """One requested field value and how it becomes a sample (or several, for one-hot fields)."""

    request: int | tuple[int, int]
    name: str
    labels: Labels
    scale: float = 1.0
    one_hot: tuple[str, ...] = ()
    slow: bool = True  # read only in the slow tier (most fields: counters and states)
    wide: bool = False  # a counter whose 32-bit answer wraps too often to be read as a rate

    @property
    def what(self) -> str:
        """How a log line names it: the link of a per-link field is in its labels, so that
        the same field on every link folds into one entry."""
        field_id = self.request[0] if isinstance(self.request, tuple) else self.request
        return f"{series_text(self.name, self.labels[2:])} (field {field_id})"


class FieldValues:
    """Reads an nvmlFieldValue_t array: each entry's return code and value.

    A whole array is unpacked in one struct call, at the offsets pynvml's struct declares:
    reading entry by entry through pynvml's structs (which override __getattribute__ to decode
    strings) was most of a read's own time at ~120 fields a GPU a cycle. The value union is
    decoded by its type from its bytes, which also reads the unsigned short (type 6) that
    pynvml releases before 12.570 have no name for.
    """

    def __init__(self, nvml: Any) -> None:
        cls = nvml.c_nvmlFieldValue_t
        parts = sorted(
            [(cls.valueType.offset, "I", 0), (cls.nvmlReturn.offset, "I", 1),
             (cls.value.offset, "Q", 2)]
        )  # fmt: skip
        fmt, position = "=", 0  # native: as the library wrote it
        for offset, code, _ in parts:
            fmt += f"{offset - position}x{code}"
            position = offset + struct.calcsize("=" + code)
        self._entry = struct.Struct(f"{fmt}{ctypes.sizeof(cls) - position}x")
        order = [i for _, _, i in parts]
        self._type, self._return, self._value = (order.index(i) for i in range(3))
        # The union's members all start at its first byte; read as an unsigned 64-bit
        # number, types 2 and 3 (unsigned long, unsigned long long) need nothing more.
        self._other_types = {0: "=d", 1: "=I", 4: "=q", 5: "=i", 6: "=H"}

    def entries(self, array: Any) -> Iterator[tuple[int, float, bool]]:
        """(return code, value, whether the value came in 32 bits or fewer) of each entry;
        the value means something only where the code is NVML_SUCCESS."""
        t, r, v, other = self._type, self._return, self._value, self._other_types
        for entry in self._entry.iter_unpack(memoryview(array).cast("B")):
            kind, raw = entry[t], entry[v]
            if kind in other:
                raw = struct.unpack_from(other[kind], raw.to_bytes(8, sys.byteorder))[0]
            yield entry[r], float(raw), kind in NARROW_TYPES

    def one(self, fv: Any) -> tuple[int, float]:
        """(return code, value) of one entry."""
        code, value, _ = next(self.entries(bytes(fv)))
        return code, value


def plan_fields(nvml: Any, base: Labels, links: int) -> list[FieldPlan]:
    ecc, retired, remap = m.ECC_ERRORS, m.RETIRED_PAGES, m.REMAPPED_ROWS
    n = nvml
    plan = [
        FieldPlan(n.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, ecc,
                  (*base, ("type", "corrected"), ("scope", "volatile"))),
        FieldPlan(n.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, ecc,
                  (*base, ("type", "uncorrected"), ("scope", "volatile"))),
        FieldPlan(n.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, ecc,
                  (*base, ("type", "corrected"), ("scope", "aggregate"))),
        FieldPlan(n.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, ecc,
                  (*base, ("type", "uncorrected"), ("scope", "aggregate"))),
        FieldPlan(n.NVML_FI_DEV_RETIRED_SBE, retired, (*base, ("cause", "sbe"))),
        FieldPlan(n.NVML_FI_DEV_RETIRED_DBE, retired, (*base, ("cause", "dbe"))),
        FieldPlan(n.NVML_FI_DEV_RETIRED_PENDING, m.RETIRED_PAGES_PENDING, base),
        FieldPlan(n.NVML_FI_DEV_REMAPPED_COR, remap, (*base, ("type", "correctable"))),
        FieldPlan(n.NVML_FI_DEV_REMAPPED_UNC, remap, (*base, ("type", "uncorrectable"))),
        FieldPlan(n.NVML_FI_DEV_REMAPPED_PENDING, m.ROW_REMAP_PENDING, base),
        FieldPlan(n.NVML_FI_DEV_REMAPPED_FAILURE, m.ROW_REMAP_FAILED, base),
        FieldPlan(n.NVML_FI_DEV_MEMORY_TEMP, m.MEMORY_TEMPERATURE, base, slow=False),
        FieldPlan(n.NVML_FI_DEV_ENERGY, m.ENERGY, base, scale=0.001, slow=False),
        FieldPlan(n.NVML_FI_DEV_PCIE_REPLAY_COUNTER, m.PCIE_REPLAYS, base),
        FieldPlan(RECOVERY_ACTION_FIELD, m.RECOVERY_ACTION, base, one_hot=RECOVERY_ACTIONS),
    ]  # fmt: skip
    plan += [
        FieldPlan(field_id, m.PCIE_BYTES, (*base, ("direction", direction)), wide=True)
        for field_id, direction in PCIE_BYTES_FIELDS
    ]
    if links:
        # MBps, of one direction of each active link (nvidia-smi nvlink -s prints it in GB/s).
        plan.append(FieldPlan(n.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON, m.NVLINK_SPEED, base, 1e6))
    for link in range(links):
        lb = (*base, ("link", str(link)))
        plan += [
            FieldPlan(
                (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link),
                m.NVLINK_BYTES,
                (*lb, ("direction", "tx")),
                scale=1024.0,
            ),
            FieldPlan(
                (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link),
                m.NVLINK_BYTES,
                (*lb, ("direction", "rx")),
                scale=1024.0,
            ),
            FieldPlan((n.NVML_FI_DEV_NVLINK_GET_STATE, link), m.NVLINK_LINK_UP, lb),
            FieldPlan(
                (n.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, link),
                m.NVLINK_ERRORS,
                (*lb, ("type", "replay")),
            ),
            FieldPlan(
                (n.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, link),
                m.NVLINK_ERRORS,
                (*lb, ("type", "recovery")),
            ),
            FieldPlan(
                (n.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, link),
                m.NVLINK_ERRORS,
                (*lb, ("type", "crc_flit")),
            ),
        ]
        plan += [
            FieldPlan((field_id, link), m.NVLINK_ERRORS, (*lb, ("type", kind)))
            for field_id, kind in NVLINK5_ERRORS
        ]
        if link < LEGACY_LINKS:
            first = (
                n.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0
                if link < 6
                else n.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6 - 6
            )
            plan.append(FieldPlan(first + link, m.NVLINK_ERRORS, (*lb, ("type", "crc_data"))))
    return plan


class FieldRequest:
    """One tier's field ids as the nvmlFieldValue_t array nvmlDeviceGetFieldValues fills: built
    once, filled again by every call (each entry's return code and value are the driver's).

    pynvml's wrapper builds a new array on every call, through its structs' slow __setattr__;
    at ~230 fields a GPU a second that was the largest part of a read's own time. This calls
    the same entry point with the same arguments and maps the return code through pynvml, as
    the wrapper does; with a pynvml that lacks the helpers for that, it calls the wrapper.
    The array is read before the next call, by the thread that made it.
    """

    def __init__(self, nvml: Any, requests: Sequence[int | tuple[int, int]]) -> None:
        self._nvml = nvml
        self._requests = list(requests)
        self._lookup: Any = getattr(nvml, "_nvmlGetFunctionPointer", None)
        self._check: Any = getattr(nvml, "_nvmlCheckReturn", None)
        self._array: Any = None  # None: call pynvml's wrapper
        if self._lookup is None or self._check is None or not requests:
            return
        array = (nvml.c_nvmlFieldValue_t * len(requests))()
        for slot, request in zip(array, requests, strict=True):
            field_id, scope = request if isinstance(request, tuple) else (request, 0)
            slot.fieldId, slot.scopeId = field_id, scope
        self._array = array
        self._count = ctypes.c_int32(len(requests))
        self._pointer = ctypes.byref(array)

    def __call__(self, handle: Any) -> Any:
        if self._array is None:
            return self._nvml.nvmlDeviceGetFieldValues(handle, self._requests)
        call = self._lookup("nvmlDeviceGetFieldValues")  # FunctionNotFound, as the wrapper
        self._check(call(handle, self._count, self._pointer))
        return self._array


class FieldSet:
    """One tier's fields, asked for in one nvmlDeviceGetFieldValues call. A field the driver
    refuses moves to `fallbacks` (read through its older call) or is dropped, until the next
    recheck puts it back."""

    __slots__ = ("all_plans", "fallbacks", "nvml", "plans", "request")

    def __init__(self, nvml: NvmlModule, plans: list[FieldPlan]) -> None:
        self.nvml = nvml
        self.all_plans = plans
        self.fallbacks: list[tuple[FieldPlan, Reader]] = []
        self.keep(plans)

    def keep(self, plans: list[FieldPlan]) -> None:
        self.plans = plans
        self.request = FieldRequest(self.nvml, [f.request for f in plans])

    def reset(self) -> None:
        self.keep(self.all_plans)
        self.fallbacks = []


_LINK_LABEL = re.compile(r'link="\d+",?')


def per_link_folded(items: list[str]) -> list[str]:
    """The same value on 18 links is one entry with a count, not 18."""
    counts = Counter(_LINK_LABEL.sub("", item).replace("{}", "") for item in items)
    return [f"{item} on {n} links" if n > 1 else item for item, n in counts.items()]
