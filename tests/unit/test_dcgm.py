"""dcgm-exporter's /metrics read as gpuwatch's: real captures, DCGM 4.6 names, MIG, sentinels."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gpuwatch.exporters.dcgm import DcgmFormatError, read_dcgm

from gpuwatch import metrics as m

OURS = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm"
SHARED = OURS / "real"  # copies of ../shared/fixtures/dcgm-exporter
REAL_CAPTURES = sorted(SHARED.glob("*.prom"))
MIB = 2**20
LINE = re.compile(r'^(\w+)\{gpu="(\d+)",(?:UUID|uuid)="([^"]+)"[^}]*\} (\S+)$', re.M)


def capture_values(text: str, field: str) -> dict[str, float]:
    """gpu -> the field's value, read from the text with a regex (not the code under test)."""
    return {gpu: float(v) for name, gpu, _, v in LINE.findall(text) if name == field}


def values(reading: object, name: str) -> dict[str, float]:
    return {
        dict(s.labels)["gpu"]: s.value
        for s in reading.samples  # type: ignore[attr-defined]
        if s.name == name
    }


def test_the_real_captures_are_there() -> None:
    assert [p.name for p in REAL_CAPTURES] == [
        "a100_vgpu_grid.prom",
        "l4_default.prom",
        "t4_dcgm2x_legacy.prom",
    ]


@pytest.mark.parametrize("path", REAL_CAPTURES, ids=lambda p: p.stem)
def test_real_captures_map_to_gpuwatch_units(path: Path) -> None:
    text = path.read_text()
    reading = read_dcgm(text)
    gpus = set(capture_values(text, "DCGM_FI_DEV_SM_CLOCK"))
    assert {str(g.info.index) for g in reading.gpus.values()} == gpus
    for field, metric, scale in (
        ("DCGM_FI_DEV_GPU_TEMP", m.TEMPERATURE, 1.0),
        ("DCGM_FI_DEV_POWER_USAGE", m.POWER, 1.0),
        ("DCGM_FI_DEV_FB_USED", m.MEMORY_USED, MIB),
        ("DCGM_FI_DEV_GPU_UTIL", m.UTILIZATION, 0.01),
        ("DCGM_FI_DEV_SM_CLOCK", m.SM_CLOCK, 1e6),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", m.ENERGY, 0.001),
    ):
        expected = {g: v * scale for g, v in capture_values(text, field).items()}
        assert values(reading, metric) == pytest.approx(expected), field
    assert values(reading, m.GPU_UP) == dict.fromkeys(gpus, 1.0)
    # DCGM's fields without a gpuwatch name pass through under their own names, without
    # modelName (camelCase; it is on gpuwatch_gpu_info).
    passed = {s.name for s in reading.samples if s.name.startswith("DCGM_")}
    assert "DCGM_FI_DEV_ENC_UTIL" in passed and "DCGM_FI_DEV_GPU_TEMP" not in passed
    assert not any("modelName" in dict(s.labels) for s in reading.samples)


def test_l4_without_a_memory_sensor_has_no_memory_temperature() -> None:
    reading = read_dcgm((SHARED / "l4_default.prom").read_text())
    assert values(reading, m.MEMORY_TEMPERATURE) == {}  # DCGM says 0 °C: no sensor
    (gpu,) = reading.gpus.values()
    assert (gpu.info.model, gpu.info.pci_bus_id, gpu.driver_version) == (
        "NVIDIA L4",
        "00000000:31:00.0",
        "580.105.08",
    )
    # total = used + free + reserved, as NVML counts it: 0 + 22563 + 470 MiB
    assert values(reading, m.MEMORY_TOTAL) == {"0": (22563 + 470) * MIB}
    pcie = {
        dict(s.labels)["direction"]: s.value for s in reading.samples if s.name == m.PCIE_THROUGHPUT
    }  # DCGM's profiling gauges, already bytes/s
    assert pcie == {"tx": 112603, "rx": 17544}
    assert {s.name for s in reading.samples} >= {"DCGM_FI_PROF_PCIE_TX_BYTES"}  # and passed


def test_an_8_gpu_nvlink_node_with_dcgm_4_6_names() -> None:
    reading = read_dcgm((OURS / "h100_8gpu_nvlink_dcgm46.prom").read_text())
    assert sorted(g.info.index for g in reading.gpus.values()) == list(range(8))
    assert values(reading, m.SM_CLOCK)["5"] == 1965e6  # _HERTZ: already hertz
    assert values(reading, m.ENERGY)["0"] == 184523117  # _JOULES_TOTAL: already joules
    assert values(reading, m.UTILIZATION)["6"] == pytest.approx(0.97)  # _RATIO is field 203: %
    assert values(reading, m.TEMPERATURE)["5"] == 71
    assert values(reading, m.MEMORY_USED)["1"] == 70017 * MIB
    assert values(reading, m.MEMORY_TOTAL)["1"] == (70017 + 11542 + 520) * MIB
    crc = {
        dict(s.labels)["gpu"]: s.value
        for s in reading.samples
        if s.name == m.NVLINK_ERRORS and ("type", "crc_flit") in s.labels
    }
    assert crc["6"] == 4 and crc["0"] == 0
    power_cap = {
        dict(s.labels)["gpu"]: s.value
        for s in reading.samples
        if s.name == m.CLOCK_EVENT and ("reason", "sw_power_cap") in s.labels
    }
    assert power_cap["5"] == 1.0 and power_cap["4"] == 0.0
    gpu4 = next(g for g in reading.gpus.values() if g.info.index == 4)
    assert gpu4.xid == 13
    assert [p.job for p in gpu4.processes] == [
        "Kubernetes pod llama-pretrain-worker-1 of ml-research"
    ]
    tensor = [s for s in reading.samples if s.name == "DCGM_FI_PROF_TENSOR_UTIL_RATIO"]
    assert len(tensor) == 8 and dict(tensor[0].labels)["hostname"] == "gpu-node-07"
    xid_passed = [s for s in reading.samples if s.name == "DCGM_FI_DEV_XID_ERROR"]
    assert len(xid_passed) == 8  # rules written for DCGM's own XID gauge keep working


def test_mig_instances_add_up_their_memory_and_do_not_repeat_the_gpu() -> None:
    reading = read_dcgm((OURS / "a100_mig_dcgm3.prom").read_text())
    assert sorted(g.info.index for g in reading.gpus.values()) == [0, 1]
    assert values(reading, m.MEMORY_USED) == {"0": (10477 + 2946) * MIB, "1": 68176 * MIB}
    assert values(reading, m.TEMPERATURE) == {"0": 39, "1": 52}
    assert values(reading, m.UTILIZATION) == {"1": 0.96}  # blank under MIG: absent, not 0
    instances = {
        (dict(s.labels)["gpu_i_id"], dict(s.labels)["gpu_i_profile"], s.name): s.value
        for s in reading.samples
        if s.name in (m.INSTANCE_MEMORY_USED, m.INSTANCE_MEMORY_TOTAL)
    }  # the same names and labels as the NVML source gives MIG instances
    assert instances[("1", "3g.40gb", m.INSTANCE_MEMORY_USED)] == 10477 * MIB
    assert instances[("2", "3g.40gb", m.INSTANCE_MEMORY_USED)] == 2946 * MIB
    assert len(instances) == 4
    gpu0 = next(g for g in reading.gpus.values() if g.info.index == 0)
    assert sorted(p.job for p in gpu0.processes) == [
        "Kubernetes pod embed-svc-7d9f6-x2kq of inference",
        "Kubernetes pod rerank-svc-5c8b4-m7tz of inference",
    ]
    idle = {
        dict(s.labels)["gpu"]: s.value
        for s in reading.samples
        if s.name == m.CLOCK_EVENT and ("reason", "gpu_idle") in s.labels
    }
    assert idle == {"0": 1.0, "1": 0.0}  # the pre-3.3 name, CLOCK_THROTTLE_REASONS
    engine = [dict(s.labels) for s in reading.samples if s.name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    assert sorted(e.get("GPU_I_ID", "-") for e in engine) == ["-", "1", "2"]
    keys = [(s.name, s.labels) for s in reading.samples]
    assert len(keys) == len(set(keys))  # one series per name and labels


def test_blank_and_not_supported_sentinels_are_absent() -> None:
    text = "\n".join(
        f'{name}{{gpu="0",uuid="GPU-a"}} {value}'
        for name, value in (
            ("DCGM_FI_DEV_GPU_TEMP", "2147483632"),  # DCGM_INT32_BLANK
            ("DCGM_FI_DEV_POWER_USAGE", "140737488355330"),  # DCGM_FP64_BLANK + 2
            ("DCGM_FI_DEV_FB_USED", "9223372036854775794"),  # DCGM_INT64_BLANK + 2
            ("DCGM_FI_DEV_GPU_UTIL", "7"),
        )
    )
    reading = read_dcgm(text + "\n")
    names = {s.name for s in reading.samples}
    assert m.TEMPERATURE not in names and m.POWER not in names and m.MEMORY_USED not in names
    assert values(reading, m.UTILIZATION) == {"0": 0.07}  # the 1.x `uuid` label works too


def test_text_that_is_not_the_format_is_refused() -> None:
    with pytest.raises(DcgmFormatError):
        read_dcgm('DCGM_FI_DEV_GPU_TEMP{gpu="0" 31\n')


def test_pcie_profiling_under_mig_is_each_instances_and_only_passed_through() -> None:
    """Under MIG, DCGM's PCIe profiling gauges come per GPU instance: neither instance's is
    the GPU's traffic, so none becomes gpuwatch's series; both keep their DCGM names."""
    labels = 'gpu="0",UUID="GPU-8f3c2b11-04d2-5e7a-9b21-6c0e7d3a4f58",GPU_I_PROFILE="3g.40gb"'
    text = "# TYPE DCGM_FI_PROF_PCIE_TX_BYTES gauge\n" + "".join(
        f'DCGM_FI_PROF_PCIE_TX_BYTES{{{labels},GPU_I_ID="{i}"}} {v}\n'
        for i, v in ((1, 100), (2, 900))
    )
    reading = read_dcgm(text)
    assert not [s for s in reading.samples if s.name == m.PCIE_THROUGHPUT]
    passed = [s for s in reading.samples if s.name == "DCGM_FI_PROF_PCIE_TX_BYTES"]
    assert sorted(s.value for s in passed) == [100, 900]
