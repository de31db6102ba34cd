"""Specifications of the GPU models the simulator can play."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    memory_bytes: int
    power_limit_w: float
    idle_power_w: float
    max_sm_clock_mhz: float
    idle_sm_clock_mhz: float
    memory_clock_mhz: float
    nvlinks: int
    # Each link's line rate in one direction, in MBps as NVML's field 90 answers (nvidia-smi
    # nvlink -s prints it in GB/s; sources in docs/simulator.md).
    nvlink_speed_mbps: int
    pcie_generation: int
    pcie_width: int
    # What nvmlDeviceGetTemperatureThreshold answers: where software capping (max operating),
    # the hardware's thermal slowdown and its shutdown begin, and the memory's limit (0: none).
    # Sources in docs/simulator.md.
    max_operating_temp_c: float
    slowdown_temp_c: float
    shutdown_temp_c: float
    memory_max_temp_c: float
    thermal_resistance: float  # °C per W above ambient at steady state
    vbios: str
    has_row_remapping: bool  # Ampere and newer remap rows; older parts retire pages
    has_nvlink_crc_data: bool  # NVLink4 (Hopper) reports one CRC counter, not flit/data
    nvlink_generation: int = 0  # 5 (Blackwell): the DL error counters gave way to NVLink5's
    mig_capable: bool = False


MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel(
            name="NVIDIA H100 80GB HBM3",
            memory_bytes=81559 * 1024**2,
            power_limit_w=700.0,
            idle_power_w=72.0,
            max_sm_clock_mhz=1980.0,
            idle_sm_clock_mhz=345.0,
            memory_clock_mhz=2619.0,
            nvlinks=18,
            nvlink_speed_mbps=26562,
            pcie_generation=5,
            pcie_width=16,
            max_operating_temp_c=87.0,
            slowdown_temp_c=89.0,
            shutdown_temp_c=95.0,
            memory_max_temp_c=0.0,
            thermal_resistance=0.06,
            vbios="96.00.99.00.01",
            has_row_remapping=True,
            has_nvlink_crc_data=False,
            nvlink_generation=4,
            mig_capable=True,
        ),
        GpuModel(
            name="NVIDIA B200",
            memory_bytes=183359 * 1024**2,
            power_limit_w=1000.0,
            idle_power_w=140.0,
            max_sm_clock_mhz=1965.0,
            idle_sm_clock_mhz=120.0,
            memory_clock_mhz=3996.0,
            nvlinks=18,
            nvlink_speed_mbps=53125,
            pcie_generation=5,
            pcie_width=16,
            max_operating_temp_c=88.0,
            slowdown_temp_c=91.0,
            shutdown_temp_c=93.0,
            memory_max_temp_c=0.0,
            thermal_resistance=0.045,
            vbios="97.00.82.00.11",
            has_row_remapping=True,
            has_nvlink_crc_data=False,
            nvlink_generation=5,
            mig_capable=True,
        ),
        GpuModel(
            name="NVIDIA A100-SXM4-80GB",
            memory_bytes=81920 * 1024**2,
            power_limit_w=400.0,
            idle_power_w=60.0,
            max_sm_clock_mhz=1410.0,
            idle_sm_clock_mhz=210.0,
            memory_clock_mhz=1593.0,
            nvlinks=12,
            nvlink_speed_mbps=25000,
            pcie_generation=4,
            pcie_width=16,
            max_operating_temp_c=85.0,
            slowdown_temp_c=89.0,
            shutdown_temp_c=92.0,
            memory_max_temp_c=95.0,
            thermal_resistance=0.1,
            vbios="92.00.45.00.06",
            has_row_remapping=True,
            has_nvlink_crc_data=True,
            nvlink_generation=3,
            mig_capable=True,
        ),
        GpuModel(
            name="NVIDIA L4",
            memory_bytes=23034 * 1024**2,
            power_limit_w=72.0,
            idle_power_w=16.0,
            max_sm_clock_mhz=2040.0,
            idle_sm_clock_mhz=210.0,
            memory_clock_mhz=6251.0,
            nvlinks=0,
            nvlink_speed_mbps=0,
            pcie_generation=4,
            pcie_width=16,
            max_operating_temp_c=86.0,
            slowdown_temp_c=88.0,
            shutdown_temp_c=91.0,
            memory_max_temp_c=0.0,
            thermal_resistance=0.6,
            vbios="95.04.39.00.0A",
            has_row_remapping=True,
            has_nvlink_crc_data=False,
        ),
        GpuModel(
            name="Tesla V100-SXM2-32GB",
            memory_bytes=32510 * 1024**2,
            power_limit_w=300.0,
            idle_power_w=40.0,
            max_sm_clock_mhz=1530.0,
            idle_sm_clock_mhz=135.0,
            memory_clock_mhz=877.0,
            nvlinks=6,
            nvlink_speed_mbps=25781,
            pcie_generation=3,
            pcie_width=16,
            max_operating_temp_c=83.0,
            slowdown_temp_c=87.0,
            shutdown_temp_c=90.0,
            memory_max_temp_c=85.0,
            thermal_resistance=0.13,
            vbios="88.00.80.00.01",
            has_row_remapping=False,  # Volta retires pages instead
            has_nvlink_crc_data=True,
            nvlink_generation=2,
        ),
    )
}

ALIASES = {
    "H100": "NVIDIA H100 80GB HBM3",
    "B200": "NVIDIA B200",
    "A100": "NVIDIA A100-SXM4-80GB",
    "L4": "NVIDIA L4",
    "V100": "Tesla V100-SXM2-32GB",
}


def find_model(name: str) -> GpuModel | None:
    return MODELS.get(ALIASES.get(name, name))
