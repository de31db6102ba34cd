"""What each NVML call gpuwatch makes returns, GPU by GPU, as JSON: a capture to keep from a
real GPU host and to hold the simulator's driver profiles against.

    python bench/nvml_capture.py > capture-h100-r580.json          # the real driver
    python bench/nvml_capture.py --simulate mig > capture-sim.json  # a simulated node

Each call is recorded as its value or the pynvml exception it raised (class and text); field
values with each entry's own return code. Nothing is written to the GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

from gpuwatch.nvml.fabric import fabric_calls

FIELDS = [3, 4, 5, 6, 29, 30, 31, 82, 90, 91, 94, 142, 143, 144, 145, 191, 197, 198, 230]
LINK_FIELDS = [138, 139, 161, 162, 163, 165, 214, 215, 219, 221]


def _plain(value: Any) -> Any:
    """A pynvml answer as JSON: structs as their fields, bytes as text."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, list | tuple | ctypes.Array):  # pynvml answers field values in one
        return [_plain(v) for v in value]
    fields = getattr(value, "_fields_", None)
    if fields is not None:
        return {name: _plain(getattr(value, name)) for name, *_ in fields}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "__dict__"):
        return {k: _plain(v) for k, v in vars(value).items()}
    return value


def _call(fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"value": _plain(fn())}
    except Exception as exc:  # recorded, whatever pynvml raised
        return {"error": type(exc).__name__, "text": str(exc)}


def capture(nvml: Any) -> dict[str, Any]:
    nvml.nvmlInit()
    out: dict[str, Any] = {
        "nvidia-ml-py": getattr(nvml, "__file__", "?"),
        "driver": _call(nvml.nvmlSystemGetDriverVersion),
        "nvml": _call(nvml.nvmlSystemGetNVMLVersion),
        "gpus": [],
    }
    for index in range(nvml.nvmlDeviceGetCount()):
        out["gpus"].append(_gpu(nvml, nvml.nvmlDeviceGetHandleByIndex(index)))
    nvml.nvmlShutdown()
    return out


def _gpu(nvml: Any, h: Any) -> dict[str, Any]:
    calls: dict[str, Callable[[], Any]] = {
        "name": lambda: nvml.nvmlDeviceGetName(h),
        "uuid": lambda: nvml.nvmlDeviceGetUUID(h),
        "pci": lambda: nvml.nvmlDeviceGetPciInfo(h).busId,
        "virtualization": lambda: nvml.nvmlDeviceGetVirtualizationMode(h),
        "temperature": lambda: nvml.nvmlDeviceGetTemperature(h, 0),
        "temperature_v": lambda: nvml.nvmlDeviceGetTemperatureV(h, 0),
        "power_mw": lambda: nvml.nvmlDeviceGetPowerUsage(h),
        "power_limit_mw": lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h),
        "energy_mj": lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h),
        "utilization": lambda: nvml.nvmlDeviceGetUtilizationRates(h),
        "memory_v1": lambda: nvml.nvmlDeviceGetMemoryInfo(h),
        "memory_v2": lambda: nvml.nvmlDeviceGetMemoryInfo(h, nvml.nvmlMemory_v2),
        "clock_events_supported": lambda: nvml.nvmlDeviceGetSupportedClocksEventReasons(h),
        "clock_events": lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(h),
        "throttle_reasons": lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        "pcie_generation": lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "pcie_width": lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(h),
        "pcie_max_generation": lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
        "pcie_max_width": lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(h),
        "processes": lambda: nvml.nvmlDeviceGetComputeRunningProcesses(h),
        "processes_v2": lambda: nvml.nvmlDeviceGetComputeRunningProcesses_v2(h),
        "remapped_rows": lambda: nvml.nvmlDeviceGetRemappedRows(h),
        "supported_events": lambda: nvml.nvmlDeviceGetSupportedEventTypes(h),
        "mig_mode": lambda: nvml.nvmlDeviceGetMigMode(h),
        "nvlink0_state": lambda: nvml.nvmlDeviceGetNvLinkState(h, 0),
    }
    gpu: dict[str, Any] = {name: _call(fn) for name, fn in calls.items()}
    # The fabric calls through gpuwatch's own nvml.h structs, newest first (v3, v2, v1).
    for struct, read in fabric_calls(nvml, h).items():
        gpu[f"fabric_{struct}"] = _call(read)
    requests: list[Any] = [*FIELDS, *((f, 0) for f in LINK_FIELDS)]
    values = _call(lambda: nvml.nvmlDeviceGetFieldValues(h, requests))
    if "value" in values:
        values = {"value": [_field(v) for v in values["value"]]}
    gpu["field_values"] = values
    return gpu


def _field(v: dict[str, Any]) -> dict[str, Any]:
    return {
        "field": v["fieldId"],
        "scope": v["scopeId"],
        "return": v["nvmlReturn"],
        "type": v["valueType"],
        "ull": v["value"]["ullVal"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--simulate", metavar="SCENARIO", help="a simulated node instead")
    args = parser.parse_args()
    if args.simulate:
        from gpuwatch.clock import SystemClock
        from gpuwatch.sim.library import SimulatedNvml
        from gpuwatch.sim.scenario import load_scenario

        SimulatedNvml(load_scenario(args.simulate), SystemClock()).install()
    import pynvml

    json.dump(capture(pynvml), sys.stdout, indent=1, default=str)
    print()


if __name__ == "__main__":
    main()
