"""Which NVML field values gpuwatch asks for, and what each becomes.

Most counters and states come from one nvmlDeviceGetFieldValues call per tier; each entry has
its own return code, so a field the driver lacks costs only that field. NVLink5 (Blackwell)
replaced the data-link error counters (fields 161-163, unsupported there) with its own:
they are asked for on every part and answer NOT_SUPPORTED where they do not apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuwatch import metrics as m
from gpuwatch.model import Labels

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

    @property
    def what(self) -> str:
        """How a log line names it: the link of a per-link field is in its labels, so that
        the same field on every link folds into one entry."""
        field_id = self.request[0] if isinstance(self.request, tuple) else self.request
        return f"{self.name}{dict(self.labels[2:]) or ''} (field {field_id})"


def value_members() -> dict[int, str]:
    """NVML value type (nvmlValueType_t) -> the member of the nvmlValue_t union that holds
    it. Numbers from nvml.h: pynvml releases before 12.570 lack the unsigned short's name."""
    return {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


class FieldValues:
    """Reads entries of an nvmlFieldValue_t array.

    pynvml's structs override __getattribute__ (to decode strings); reading through the ctypes
    field descriptors skips that, which matters at ~150 fields per GPU per cycle.
    """

    def __init__(self, nvml: Any) -> None:
        cls = nvml.c_nvmlFieldValue_t
        self._return = cls.nvmlReturn.__get__
        self._type = cls.valueType.__get__
        self._value = cls.value.__get__
        self._members = value_members()

    def returned(self, fv: Any) -> int:
        return int(self._return(fv))

    def value(self, fv: Any) -> float:
        return float(getattr(self._value(fv), self._members.get(self._type(fv), "ullVal")))


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
    for link in range(links):
        lb = (*base, ("link", str(link)))
        plan += [
            FieldPlan((n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link), m.NVLINK_BYTES,
                      (*lb, ("direction", "tx")), scale=1024.0),
            FieldPlan((n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link), m.NVLINK_BYTES,
                      (*lb, ("direction", "rx")), scale=1024.0),
            FieldPlan((n.NVML_FI_DEV_NVLINK_GET_STATE, link), m.NVLINK_LINK_UP, lb),
            FieldPlan((n.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, link), m.NVLINK_ERRORS,
                      (*lb, ("type", "replay"))),
            FieldPlan((n.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, link), m.NVLINK_ERRORS,
                      (*lb, ("type", "recovery"))),
            FieldPlan((n.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, link), m.NVLINK_ERRORS,
                      (*lb, ("type", "crc_flit"))),
        ]  # fmt: skip
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
