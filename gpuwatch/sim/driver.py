"""Driver profiles: what each NVIDIA driver branch's libnvidia-ml.so.1 offers.

A profile decides which entry points the simulated library exports (a call into one it lacks
is FUNCTION_NOT_FOUND in pynvml, as a missing symbol is), which field ids exist (a higher one
answers INVALID_ARGUMENT in its own slot), which NVML event types a GPU reports, and which
recovery actions field 230 can hold. The facts come from the nvml.h each branch shipped
(`nvidia-nvml-dev` wheels: R515, R525, R535 = 12.2, R550 = 12.4, R570 = 12.8, R580 = 13.0,
13.5 for R615); R470's header is not published as a wheel: its profile is R515's without
nvmlDeviceGetComputeRunningProcesses_v3 and nvmlDeviceGetMemoryInfo_v2, which came with R510.
"""

from __future__ import annotations

from dataclasses import dataclass

# Entry points every branch gpuwatch supports has.
_BASE = frozenset(
    {
        "nvmlInit_v2",
        "nvmlInitWithFlags",
        "nvmlShutdown",
        "nvmlErrorString",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetVbiosVersion",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTemperatureThreshold",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetSupportedClocksThrottleReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetPcieThroughput",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkErrorCounter",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceIsMigDeviceHandle",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        "nvmlDeviceGetVirtualizationMode",
        "nvmlEventSetCreate",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlDeviceRegisterEvents",
        "nvmlEventSetWait_v2",
        "nvmlEventSetFree",
    }
)
_R510 = frozenset({"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetMemoryInfo_v2"})
# R535 renamed "throttle reasons" to "clocks event reasons"; both names stay exported.
# (nvmlDeviceGetGpuFabricInfo came with R525, the first branch for Hopper's NVLink fabric.)
_R535 = frozenset(
    {
        "nvmlDeviceGetSupportedClocksEventReasons",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetGpuFabricInfo",
    }
)
_R550 = frozenset({"nvmlDeviceGetGpuFabricInfoV"})
_R570 = frozenset({"nvmlDeviceGetTemperatureV"})

# NVML event types (nvml.h's nvmlEventType* bits).
EVENT_SBE = 0x1
EVENT_DBE = 0x2
EVENT_PSTATE = 0x4
EVENT_XID = 0x8
EVENT_CLOCK = 0x10
EVENT_SBE_STORM = 0x200
EVENT_DRAM_RETIREMENT = 0x400
EVENT_DRAM_RETIREMENT_FAILURE = 0x800
EVENT_RECOVERY_ACTION = 0x8000
# nvml.h: ECC events are only available on ECC-enabled devices.
ECC_EVENTS = (
    EVENT_SBE | EVENT_DBE | EVENT_SBE_STORM | EVENT_DRAM_RETIREMENT | EVENT_DRAM_RETIREMENT_FAILURE
)
_OLD_EVENTS = EVENT_SBE | EVENT_DBE | EVENT_PSTATE | EVENT_XID | EVENT_CLOCK
_R570_EVENTS = (
    _OLD_EVENTS
    | EVENT_SBE_STORM
    | EVENT_DRAM_RETIREMENT
    | EVENT_DRAM_RETIREMENT_FAILURE
    | EVENT_RECOVERY_ACTION
)


@dataclass(frozen=True, slots=True)
class DriverProfile:
    name: str
    driver_version: str
    nvml_version: str
    entry_points: frozenset[str]
    field_id_max: int  # nvml.h's NVML_FI_MAX: field ids at or above it do not exist
    event_types: int  # what nvmlDeviceGetSupportedEventTypes reports on a data-centre part
    recovery_action_max: int  # the highest nvmlDeviceGpuRecoveryAction_t value it knows
    blackwell: bool  # whether the branch supports Blackwell parts (R570 and later)
    # nvmlDeviceGetGpuFabricInfoV: the newest struct it takes (0: no such call), and how many
    # of the health mask's fields it fills (nvml.h's order; each as the nvidia-ml-py release
    # of the branch first named it: three with R550, six with R580, the GFM state with R615).
    fabric_struct: int = 0
    fabric_mask_fields: int = 0


PROFILES: dict[str, DriverProfile] = {
    p.name: p
    for p in (
        DriverProfile("R470", "470.256.02", "11.470.256.02", _BASE, 161, _OLD_EVENTS, -1, False),
        DriverProfile(
            "R535",
            "535.247.01",
            "12.535.247.01",
            _BASE | _R510 | _R535,
            197,
            _OLD_EVENTS,
            -1,
            False,
        ),
        DriverProfile(
            "R550",
            "550.163.01",
            "12.550.163.01",
            _BASE | _R510 | _R535 | _R550,
            200,
            _OLD_EVENTS,
            -1,
            False,
            2,
            3,
        ),
        DriverProfile(
            "R570",
            "570.172.08",
            "12.570.172.08",
            _BASE | _R510 | _R535 | _R550 | _R570,
            269,
            _R570_EVENTS,
            4,
            True,
            2,
            3,
        ),
        DriverProfile(
            "R580",
            "580.105.08",
            "13.580.105.08",
            _BASE | _R510 | _R535 | _R550 | _R570,
            274,
            _R570_EVENTS,
            4,
            True,
            3,
            6,
        ),
        DriverProfile(
            "R615",
            "615.33.02",
            "13.615.33.02",
            _BASE | _R510 | _R535 | _R550 | _R570,
            310,
            _R570_EVENTS,
            7,
            True,
            3,
            7,
        ),
    )
}
DEFAULT_PROFILE = "R580"
