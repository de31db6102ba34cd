"""The simulator's fault magnitudes, resets, shutdowns, missing GPUs and mixed nodes, read
through the real pynvml over the simulated NVML library."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuwatch.clock import ManualClock
from gpuwatch.sim.job import TrainingJob
from gpuwatch.sim.scenario import load_scenario
from gpuwatch.text.yamlfile import FileError
from tests.conftest import Simulate

FI_DL_REPLAY = pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY
FI_DL_RECOVERY = pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY
FI_DL_CRC = pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC
FI_NVLINK5_RECOVERY = 215  # NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS


def open_node(simulate: Simulate, tmp_path: Path, text: str) -> ManualClock:
    path = tmp_path / "node.yaml"
    path.write_text(text)
    clock = ManualClock()
    simulate(load_scenario(str(path)), clock)
    pynvml.nvmlInit()
    return clock


def field(gpu: int, field_id: int, link: int | None = None) -> Any:
    """One field value of a GPU: its value, or raises the NVML error its slot carries."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    request = field_id if link is None else (field_id, link)
    [value] = pynvml.nvmlDeviceGetFieldValues(handle, [request])
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(value.nvmlReturn)
    return value.value.ullVal


def test_a_scenario_sets_how_hard_and_where_a_fault_hits(
    simulate: Simulate, tmp_path: Path
) -> None:
    clock = open_node(
        simulate,
        tmp_path,
        "node: {gpus: 2, model: A100}\n"
        "faults:\n"
        "  - {kind: pcie_replay_storm, gpu: 0, at: 10s, duration: 60s, rate: 0.25}\n"
        "  - {kind: nvlink_crc_storm, gpu: 1, at: 10s, rate: 120, link: 4, count: 0}\n"
        "  - {kind: nvlink_replay, gpu: 1, at: 10s, link: 2}\n"
        "  - {kind: nvlink_recovery, gpu: 1, at: 10s, link: 2, count: 3}\n",
    )
    clock.advance(38)
    assert field(0, pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER) == 1 + 0.25 * 28
    clock.advance(62)  # past the storm's end: the counter stays where it got to
    assert field(0, pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER) == 1 + 0.25 * 60
    assert field(1, FI_DL_CRC, 4) == 120 * 90
    assert field(1, FI_DL_CRC, 0) == 0
    assert (field(1, FI_DL_REPLAY, 2), field(1, FI_DL_RECOVERY, 2)) == (1, 3)
    assert (field(1, FI_DL_REPLAY, 0), field(1, FI_DL_RECOVERY, 0)) == (0, 0)


def test_nvlink5_counts_recoveries_in_its_own_counter(simulate: Simulate, tmp_path: Path) -> None:
    clock = open_node(
        simulate,
        tmp_path,
        "node: {gpus: 1, model: B200, driver: R580}\n"
        "faults: [{kind: nvlink_recovery, gpu: 0, at: 5s, link: 7, count: 2}]\n",
    )
    clock.advance(6)
    assert field(0, FI_NVLINK5_RECOVERY, 7) == 2
    with pytest.raises(pynvml.NVMLError_NotSupported):  # nvml.h: none from Blackwell on
        field(0, FI_DL_RECOVERY, 7)


def test_a_reset_clears_volatile_counts_and_applies_a_pending_remap(
    simulate: Simulate, tmp_path: Path
) -> None:
    clock = open_node(
        simulate,
        tmp_path,
        "node: {gpus: 1, model: H100}\n"
        "faults:\n"
        "  - {kind: ecc_dbe, gpu: 0, at: 5s}\n"
        "  - {kind: row_remap_pending, gpu: 0, at: 5s, count: 512}\n"
        "  - {kind: recovery_action, gpu: 0, at: 5s}\n"
        "  - {kind: row_remap_failure, gpu: 0, at: 6s}\n"
        "  - {kind: gpu_reset, gpu: 0, at: 20s}\n"
        "  - {kind: ecc_sbe, gpu: 0, at: 30s, count: 7}\n",
    )
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    volatile = (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
    aggregate = (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC)
    clock.advance(10)
    assert pynvml.nvmlDeviceGetTotalEccErrors(h, *volatile) == 1
    assert pynvml.nvmlDeviceGetRemappedRows(h) == (0, 513, 1, 1)
    assert field(0, 230) == 1  # the driver asks for a GPU reset
    clock.advance(15)
    assert pynvml.nvmlDeviceGetTotalEccErrors(h, *volatile) == 0
    assert pynvml.nvmlDeviceGetTotalEccErrors(h, *aggregate) == 1
    # The failure stays: NVML reports that a remapping has failed in the past.
    assert pynvml.nvmlDeviceGetRemappedRows(h) == (0, 513, 0, 1)
    assert field(0, 230) == 0
    clock.advance(10)  # a fault after the reset counts from 0 again
    corrected = (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC)
    assert pynvml.nvmlDeviceGetTotalEccErrors(h, *corrected) == 7
    clock.advance(60)  # a count alone: that many, no storm after it
    assert pynvml.nvmlDeviceGetTotalEccErrors(h, *corrected) == 7


def test_a_thermal_shutdown_climbs_then_the_gpu_leaves_the_bus(
    simulate: Simulate, tmp_path: Path
) -> None:
    clock = open_node(
        simulate,
        tmp_path,
        "node: {gpus: 2, model: H100}\n"
        "faults: [{kind: thermal_shutdown, gpu: 1, at: 10s, duration: 60s}]\n",
    )
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    events = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, events)
    # The board's own limits, as NVML answers them for an H100 SXM.
    limits = [
        pynvml.nvmlDeviceGetTemperatureThreshold(h, kind)
        for kind in (
            pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
        )
    ]
    assert limits == [87, 89, 95]
    start = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    clock.advance(40)  # halfway up from about 70 °C to 95 °C
    halfway = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    assert start + 5 < halfway < 89
    clock.advance(29)
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) >= 94
    reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert reasons & pynvml.nvmlClocksEventReasonHwThermalSlowdown
    with pytest.raises(pynvml.NVMLError_Timeout):  # not off yet
        pynvml.nvmlEventSetWait_v2(events, 0)
    clock.advance(2)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    assert pynvml.nvmlEventSetWait_v2(events, 0).eventData == 79


def test_a_missing_gpu_leaves_the_driver_s_list_and_the_rest_move_up(
    simulate: Simulate, tmp_path: Path
) -> None:
    clock = open_node(
        simulate,
        tmp_path,
        "node: {gpus: 4, model: [H100, H100, L4, L4]}\n"
        "faults: [{kind: gpu_missing, gpu: 1, at: 10s}]\n",
    )
    names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(4)]
    assert names == ["NVIDIA H100 80GB HBM3"] * 2 + ["NVIDIA L4"] * 2
    held = pynvml.nvmlDeviceGetHandleByIndex(1)
    uuids = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(4)]
    clock.advance(10)
    assert pynvml.nvmlDeviceGetCount() == 3
    now = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(3)]
    assert now == [uuids[0], uuids[2], uuids[3]]
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetTemperature(held, pynvml.NVML_TEMPERATURE_GPU)


def test_magnitudes_and_mixed_nodes_are_checked_against_the_node(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "node: {gpus: 3, model: [H100, L4, V100]}\n"
        "faults:\n"
        "  - {kind: xid, gpu: 0, code: 13, rate: 5}\n"
        "  - {kind: nvlink_down, gpu: 1}\n"
        "  - {kind: nvlink_crc_storm, gpu: 0, link: 18}\n"
        "  - {kind: row_remap_pending, gpu: 2}\n"
        "  - {kind: ecc_sbe, gpu: 0, rate: -1}\n"
        "  - {kind: retired_pages, gpu: 0}\n"
    )
    with pytest.raises(FileError) as caught:
        load_scenario(str(path))
    problems = str(caught.value).splitlines()
    at = f"{path}:{{}}: faults[{{}}].{{}}".format
    assert at(3, 0, "rate: only ecc_sbe, ecc_dbe, pcie_replay_storm") in " ".join(problems)
    assert at(4, 1, "kind: NVIDIA L4 has no NVLink") in problems
    assert at(5, 2, "link: expected a whole number from 0 to 17, got 18") in problems
    assert (
        at(
            6,
            3,
            "kind: Tesla V100-SXM2-32GB retires pages instead of remapping rows (retired_pages)",
        )
        in problems
    )
    rate = at(7, 4, "rate: must be a number of errors a second")
    assert any(p.startswith(rate) for p in problems)
    assert (
        at(8, 5, "kind: NVIDIA H100 80GB HBM3 remaps rows instead of retiring pages (row_remap_*)")
        in problems
    )
    short = tmp_path / "short.yaml"
    short.write_text("node: {gpus: 3, model: [H100, L4]}\nfaults: [{kind: xid, gpu: ALL}]\n")
    with pytest.raises(FileError) as caught:
        load_scenario(str(short))
    assert str(caught.value).splitlines() == [
        f"{short}:1: node.model: lists 2 models for 3 GPUs",
        f"{short}:2: faults[0].gpu: expected a GPU index from 0 to 2 or all, got 'ALL'",
        f"{short}:2: faults[0]: missing 'code' (the XID number)",
    ]


XID_FORMS = """\
name: forms
node: {gpus: 3, model: [B200, B200, H100], driver: R580, seed: 1,
       mig: [{gpu: 0, instances: [3g.90gb, 3g.90gb]}]}
faults:
  - {kind: xid, gpu: 0, at: 1s, code: 94, instance: 2}
  - {kind: xid, gpu: 1, at: 2s, code: 145, unit: RLW_SRC_TRACK, link: 13}
  - {kind: xid, gpu: 1, at: 3s, code: 146, unit: TLW_TX/TLW_TX_PIPE0}
"""


def test_the_kernel_log_prints_an_xid_as_the_driver_does_for_mig_and_nvlink5(
    tmp_path: Path,
) -> None:
    """A MIG instance's XID names the instance (krcReportXid's form); an NVLink5 XID names
    its unit and severity from NVIDIA's 144-150 decode sheet, with the unit in the interrupt
    info as an R575 or later driver encodes it; and gpuwatch's parser reads each back."""
    from gpuwatch.kernel.nvrm import read_driver_line
    from gpuwatch.sim.kernel_log import kernel_lines
    from gpuwatch.sim.node import SimNode

    path = tmp_path / "forms.yaml"
    path.write_text(XID_FORMS)
    node = SimNode(load_scenario(str(path)), ManualClock())
    xids = [
        line.message for line in kernel_lines(node, node.start - 600, 0) if "Xid" in line.message
    ]
    assert xids == [
        "NVRM: Xid (PCI:0000:18:00 GPU-I:02): 94, pid='<unknown>', name=<unknown>, "
        "Contained memory error (one application affected)",
        "NVRM: Xid (PCI:0000:2a:00): 145, RLW_SRC_TRACK Fatal XC0 i0 Link 13 (0x00000007 "
        "0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)",
        "NVRM: Xid (PCI:0000:2a:00): 146, TLW_TX_PIPE0 Nonfatal XC0 i0 Link -1 (0x0000000c "
        "0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)",
    ]
    read = [read_driver_line(x) for x in xids]
    assert [(r.code, r.gpu_instance) for r in read if r] == [(94, 2), (145, None), (146, None)]


@pytest.mark.parametrize(
    ("fault", "problem"),
    [
        ("{kind: xid, gpu: 0, code: 94, instance: 5}", "GPU 0's GPU instances are 1, 2"),
        ("{kind: xid, gpu: 1, code: 94, instance: 1}", "GPU 1 is not in MIG mode"),
        ("{kind: xid, gpu: 1, code: 145, unit: SAW_MVB}", "expected one of RLW_RXPIPE"),
        ("{kind: xid, gpu: 1, code: 79, unit: SAW_MVB}", "only an xid 144-150 takes a unit"),
        ("{kind: xid, gpu: 2, code: 145}", "NVIDIA H100 80GB HBM3 has no NVLink5"),
        ("{kind: ecc_sbe, gpu: 1, instance: 1}", "only xid faults take instance"),
    ],
)
def test_an_xid_fault_s_instance_and_unit_must_fit(
    tmp_path: Path, fault: str, problem: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(XID_FORMS.split("faults:", maxsplit=1)[0] + f"faults:\n  - {fault}\n")
    with pytest.raises(FileError, match=problem):
        load_scenario(str(path))


def test_a_jobs_memory_at_its_edge_an_input_bound_rank_and_caught_ooms(
    simulate: Simulate, tmp_path: Path
) -> None:
    """GPU 0 at the edge of its memory (memory_pressure), GPU 1 the same with CUDA's error
    caught every 30 s (cuda_oom), GPU 2 waiting on its data loader (input_bound), GPU 3 a
    healthy rank; read through pynvml as the daemon reads them, and the job's own reports."""
    text = (
        "node: {gpus: 4, model: H100, workload: training}\n"
        "faults:\n"
        "  - {kind: memory_pressure, gpu: 0, at: 60s}\n"
        "  - {kind: cuda_oom, gpu: 1, at: 60s}\n"
        "  - {kind: input_bound, gpu: 2, at: 60s}\n"
    )
    clock = open_node(simulate, tmp_path, text)
    job = TrainingJob(load_scenario(str(tmp_path / "node.yaml")))

    def memory_share(gpu: int) -> float:
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(gpu))
        return float(info.used) / float(info.total)

    def busy(gpu: int) -> float:
        handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100

    clock.advance(30)
    before = job.at(30)
    assert all(memory_share(g) < 0.95 for g in range(4))
    assert all(busy(g) > 0.85 for g in range(4))
    steps: list[list[float]] = []
    elapsed = 30
    for t in range(60, 300, 5):
        clock.advance(t - elapsed)
        elapsed = t
        reports = job.at(t)
        steps.append([reports[r]["step"] for r in range(4)])
        assert memory_share(0) > 0.98 and memory_share(1) > 0.98
        assert memory_share(3) < 0.95
        assert 0.2 <= busy(2) <= 0.4 and busy(3) > 0.85
    # One error at the fault's start, then one every 30 s: 8 by 295 s, on rank 1 only.
    assert reports[1]["oom_total"] == 8
    assert all("oom_total" not in reports[r] for r in (0, 2, 3)) and "oom_total" not in before[1]
    made = [last - first for first, last in zip(steps[0], steps[-1], strict=True)]
    assert made[2] == pytest.approx(0.35 * made[3], rel=0.02)  # waiting on its input
