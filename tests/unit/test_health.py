"""The verdict from one sample's facts: DCGM's thresholds, worst cause first, and it clears."""

from __future__ import annotations

from gpuwatch import metrics as m
from gpuwatch.health import GpuFacts, Health, gpu_facts, gpu_verdict
from gpuwatch.model import GpuInfo, GpuState, GpuStatus, Sample

INFO = GpuInfo(3, "GPU-3", "NVIDIA H100 80GB HBM3", "0000:1b:00.0", "1653", "96.00", 18)
GPU = GpuState(INFO, GpuStatus.OK, "")
BASE = (("gpu", "3"), ("uuid", "GPU-3"))


def facts(*samples: tuple[str, tuple[tuple[str, str], ...], float]) -> GpuFacts:
    return gpu_facts([Sample(n, (*BASE, *labels), v) for n, labels, v in samples])["GPU-3"]


def test_a_double_bit_error_and_a_pending_remap_make_it_unhealthy_worst_first() -> None:
    verdict = gpu_verdict(
        GPU,
        facts(
            (m.ROW_REMAP_PENDING, (), 1.0),
            (m.ECC_ERRORS, (("type", "uncorrected"), ("scope", "volatile")), 2.0),
            (m.ECC_ERRORS, (("type", "uncorrected"), ("scope", "aggregate")), 7.0),
        ),
    )
    assert verdict.state == Health.UNHEALTHY
    assert verdict.reasons == [
        "GPU 3: 2 uncorrectable ECC errors since the last reset",
        "GPU 3: a row remap waits for a GPU reset",
    ]
    assert verdict.actions == [
        "drain the GPU's jobs and reset the GPU",
        "reset the GPU when it is idle",
    ]


def test_after_a_reset_the_volatile_counts_are_zero_and_the_gpu_is_healthy_again() -> None:
    cleared = facts(
        (m.ROW_REMAP_PENDING, (), 0.0),
        (m.ECC_ERRORS, (("type", "uncorrected"), ("scope", "volatile")), 0.0),
        (m.ECC_ERRORS, (("type", "uncorrected"), ("scope", "aggregate")), 7.0),  # history only
    )
    assert gpu_verdict(GPU, cleared).state == Health.HEALTHY


def test_dcgm_thresholds_and_the_recovery_action() -> None:
    retired = facts(
        (m.RETIRED_PAGES, (("cause", "sbe"),), 60.0), (m.RETIRED_PAGES, (("cause", "dbe"),), 3.0)
    )
    assert gpu_verdict(GPU, retired).reasons == ["GPU 3: 63 retired memory pages"]
    remapped = facts((m.REMAPPED_ROWS, (("type", "uncorrectable"),), 512.0))
    assert gpu_verdict(GPU, remapped).state == Health.DEGRADED
    p2p = facts((m.RECOVERY_ACTION, (("action", "drain_p2p"),), 1.0))
    assert gpu_verdict(GPU, p2p).state == Health.DEGRADED
    reboot = facts((m.RECOVERY_ACTION, (("action", "node_reboot"),), 1.0))
    assert gpu_verdict(GPU, reboot).actions == ["drain the node and reboot it"]
    link = facts(
        (m.NVLINK_LINK_UP, (("link", "5"),), 0.0), (m.NVLINK_LINK_UP, (("link", "6"),), 1.0)
    )
    assert gpu_verdict(GPU, link).reasons == ["GPU 3: NVLink 5 down"]
