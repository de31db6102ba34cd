"""The C side of NVML as nvml.h declares it: return codes, the structs the simulated library
writes, and each entry point's C signature.

These are written from NVIDIA's nvml.h (the `nvidia-nvml-dev` wheels, R515 to 13.5), not taken
from pynvml: the point of simulating one level down is that pynvml's own structs are checked
against the layout a driver writes. Where a struct changed between branches, each version is
here under its nvml.h name.
"""

from __future__ import annotations

import ctypes
from ctypes import (
    Structure,
    Union,
    c_char,
    c_double,
    c_int,
    c_longlong,
    c_uint,
    c_ulong,
    c_ulonglong,
    c_ushort,
    c_void_p,
)

# nvmlReturn_t
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_IRQ_ISSUE = 11
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_CORRUPTED_INFOROM = 14
ERROR_GPU_IS_LOST = 15
ERROR_RESET_REQUIRED = 16
ERROR_OPERATING_SYSTEM = 17
ERROR_LIB_RM_VERSION_MISMATCH = 18
ERROR_ARGUMENT_VERSION_MISMATCH = 25  # a versioned struct the library does not take
ERROR_GPU_NOT_FOUND = 28
ERROR_UNKNOWN = 999

# The errors a scenario may make a GPU's calls (or the event wait) answer, by nvml.h's name
# without the NVML_ERROR_ prefix.
ERRORS = {
    "UNINITIALIZED": ERROR_UNINITIALIZED,
    "INVALID_ARGUMENT": ERROR_INVALID_ARGUMENT,
    "NOT_SUPPORTED": ERROR_NOT_SUPPORTED,
    "NO_PERMISSION": ERROR_NO_PERMISSION,
    "NOT_FOUND": ERROR_NOT_FOUND,
    "TIMEOUT": ERROR_TIMEOUT,
    "IRQ_ISSUE": ERROR_IRQ_ISSUE,
    "CORRUPTED_INFOROM": ERROR_CORRUPTED_INFOROM,
    "GPU_IS_LOST": ERROR_GPU_IS_LOST,
    "RESET_REQUIRED": ERROR_RESET_REQUIRED,
    "OPERATING_SYSTEM": ERROR_OPERATING_SYSTEM,
    "LIB_RM_VERSION_MISMATCH": ERROR_LIB_RM_VERSION_MISMATCH,
    "GPU_NOT_FOUND": ERROR_GPU_NOT_FOUND,
    "UNKNOWN": ERROR_UNKNOWN,
}

# nvmlValueType_t
VALUE_TYPE_UNSIGNED_INT = 1
VALUE_TYPE_UNSIGNED_LONG_LONG = 3
VALUE_TYPE_SIGNED_LONG_LONG = 4

NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId when MIG is off


class Value(Union):
    _fields_ = (
        ("dVal", c_double),
        ("siVal", c_int),
        ("uiVal", c_uint),
        ("ulVal", c_ulong),
        ("ullVal", c_ulonglong),
        ("sllVal", c_longlong),
        ("usVal", c_ushort),
    )


class FieldValue(Structure):
    _fields_ = (
        ("fieldId", c_uint),
        ("scopeId", c_uint),
        ("timestamp", c_longlong),
        ("latencyUsec", c_longlong),
        ("valueType", c_int),
        ("nvmlReturn", c_int),
        ("value", Value),
    )


class PciInfo(Structure):  # nvmlPciInfo_t, as nvmlDeviceGetPciInfo_v3 fills it
    _fields_ = (
        ("busIdLegacy", c_char * 16),
        ("domain", c_uint),
        ("bus", c_uint),
        ("device", c_uint),
        ("pciDeviceId", c_uint),
        ("pciSubSystemId", c_uint),
        ("busId", c_char * 32),
    )


class Utilization(Structure):
    _fields_ = (("gpu", c_uint), ("memory", c_uint))


class Memory(Structure):  # nvmlMemory_t (v1): `used` includes what the driver reserves
    _fields_ = (("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong))


class MemoryV2(Structure):  # nvmlMemory_v2_t: reserved apart, `used` is what was allocated
    _fields_ = (
        ("version", c_uint),
        ("total", c_ulonglong),
        ("reserved", c_ulonglong),
        ("free", c_ulonglong),
        ("used", c_ulonglong),
    )


MEMORY_V2_VERSION = ctypes.sizeof(MemoryV2) | (2 << 24)


class TemperatureV1(Structure):  # nvmlTemperature_v1_t (R570 and later)
    _fields_ = (("version", c_uint), ("sensorType", c_int), ("temperature", c_int))


TEMPERATURE_V1_VERSION = ctypes.sizeof(TemperatureV1) | (1 << 24)


class ProcessInfoV1(Structure):  # nvmlProcessInfo_v1_t: the unversioned call
    _fields_ = (("pid", c_uint), ("usedGpuMemory", c_ulonglong))


class ProcessInfoV2(Structure):  # nvmlProcessInfo_v2_t: the _v2 and _v3 calls, 24 bytes
    _fields_ = (
        ("pid", c_uint),
        ("usedGpuMemory", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    )


class GpuFabricInfo(Structure):  # nvmlGpuFabricInfo_t: the unversioned call (R525), 28 bytes
    _fields_ = (
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", c_int),
        ("cliqueId", c_uint),
        ("state", ctypes.c_ubyte),  # nvmlGpuFabricState_t is an unsigned char
    )


class GpuFabricInfoV2(Structure):  # nvmlGpuFabricInfo_v2_t (R550), 36 bytes
    _fields_ = (
        ("version", c_uint),
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", c_int),
        ("cliqueId", c_uint),
        ("state", ctypes.c_ubyte),
        ("healthMask", c_uint),
    )


class GpuFabricInfoV3(Structure):  # nvmlGpuFabricInfo_v3_t (R580), 40 bytes
    _fields_ = (*GpuFabricInfoV2._fields_, ("healthSummary", ctypes.c_ubyte))


GPU_FABRIC_INFO_V2 = ctypes.sizeof(GpuFabricInfoV2) | (2 << 24)
GPU_FABRIC_INFO_V3 = ctypes.sizeof(GpuFabricInfoV3) | (3 << 24)


class EventData(Structure):
    _fields_ = (
        ("device", c_void_p),
        ("eventType", c_ulonglong),
        ("eventData", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    )


P = c_void_p  # every pointer argument: the simulated library reads and writes through it
U = c_uint
ULL = c_ulonglong

# Entry point -> its C argument types (enums unsigned, as pynvml passes them). Each returns
# nvmlReturn_t but nvmlErrorString, which returns a const char *. Only the calls gpuwatch, or
# pynvml's wrappers of them, make.
SIGNATURES: dict[str, tuple[type, ...]] = {
    "nvmlInit_v2": (),
    "nvmlInitWithFlags": (U,),
    "nvmlShutdown": (),
    "nvmlErrorString": (U,),
    "nvmlSystemGetDriverVersion": (P, U),
    "nvmlSystemGetNVMLVersion": (P, U),
    "nvmlDeviceGetCount_v2": (P,),
    "nvmlDeviceGetHandleByIndex_v2": (U, P),
    "nvmlDeviceGetUUID": (P, P, U),
    "nvmlDeviceGetName": (P, P, U),
    "nvmlDeviceGetSerial": (P, P, U),
    "nvmlDeviceGetVbiosVersion": (P, P, U),
    "nvmlDeviceGetPciInfo_v3": (P, P),
    "nvmlDeviceGetTemperature": (P, U, P),
    "nvmlDeviceGetTemperatureV": (P, P),
    "nvmlDeviceGetTemperatureThreshold": (P, U, P),
    "nvmlDeviceGetPowerUsage": (P, P),
    "nvmlDeviceGetEnforcedPowerLimit": (P, P),
    "nvmlDeviceGetTotalEnergyConsumption": (P, P),
    "nvmlDeviceGetUtilizationRates": (P, P),
    "nvmlDeviceGetMemoryInfo": (P, P),
    "nvmlDeviceGetMemoryInfo_v2": (P, P),
    "nvmlDeviceGetClockInfo": (P, U, P),
    "nvmlDeviceGetSupportedClocksThrottleReasons": (P, P),
    "nvmlDeviceGetCurrentClocksThrottleReasons": (P, P),
    "nvmlDeviceGetSupportedClocksEventReasons": (P, P),
    "nvmlDeviceGetCurrentClocksEventReasons": (P, P),
    "nvmlDeviceGetCurrPcieLinkGeneration": (P, P),
    "nvmlDeviceGetMaxPcieLinkGeneration": (P, P),
    "nvmlDeviceGetMaxPcieLinkWidth": (P, P),
    "nvmlDeviceGetCurrPcieLinkWidth": (P, P),
    "nvmlDeviceGetFieldValues": (P, c_int, P),
    "nvmlDeviceGetComputeRunningProcesses": (P, P, P),
    "nvmlDeviceGetComputeRunningProcesses_v2": (P, P, P),
    "nvmlDeviceGetComputeRunningProcesses_v3": (P, P, P),
    "nvmlDeviceGetTotalEccErrors": (P, U, U, P),
    "nvmlDeviceGetRemappedRows": (P, P, P, P, P),
    "nvmlDeviceGetRetiredPages": (P, U, P, P),
    "nvmlDeviceGetRetiredPagesPendingStatus": (P, P),
    "nvmlDeviceGetPcieReplayCounter": (P, P),
    "nvmlDeviceGetPcieThroughput": (P, U, P),
    "nvmlDeviceGetNvLinkState": (P, U, P),
    "nvmlDeviceGetNvLinkErrorCounter": (P, U, U, P),
    "nvmlDeviceGetMigMode": (P, P, P),
    "nvmlDeviceGetMaxMigDeviceCount": (P, P),
    "nvmlDeviceGetMigDeviceHandleByIndex": (P, U, P),
    "nvmlDeviceIsMigDeviceHandle": (P, P),
    "nvmlDeviceGetGpuInstanceId": (P, P),
    "nvmlDeviceGetComputeInstanceId": (P, P),
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": (P, P),
    "nvmlDeviceGetVirtualizationMode": (P, P),
    "nvmlDeviceGetGpuFabricInfo": (P, P),
    "nvmlDeviceGetGpuFabricInfoV": (P, P),
    "nvmlEventSetCreate": (P,),
    "nvmlDeviceGetSupportedEventTypes": (P, P),
    "nvmlDeviceRegisterEvents": (P, ULL, P),
    "nvmlEventSetWait_v2": (P, P, U),
    "nvmlEventSetFree": (P,),
}
