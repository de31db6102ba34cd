"""The verdict: states one reading shows, XID classes, causes firing alerts raise, resets and
acknowledgements. Worst cause first; it clears when its cause does."""

from __future__ import annotations

from pathlib import Path

from gpuwatch import metrics as m
from gpuwatch.health.acks import AckStore
from gpuwatch.health.judge import RAISED_ACK_GRACE_S, HealthJudge
from gpuwatch.health.line import health_line
from gpuwatch.health.raised import RaisedCause, raised_causes
from gpuwatch.health.verdict import Health, Verdict
from gpuwatch.model import (
    BackendState,
    GpuInfo,
    GpuState,
    GpuStatus,
    MissingGpu,
    PerPart,
    Sample,
)
from gpuwatch.xid.counter import OTHER

INFO = GpuInfo(3, "GPU-3", "NVIDIA H100 80GB HBM3", "0000:1b:00.0", "1653", "96.00", 18)
GPU = GpuState(INFO, GpuStatus.OK, "")
BASE = (("gpu", "3"), ("uuid", "GPU-3"))
UP = BackendState(up=True, name="nvml")
DBE_VOLATILE = (("type", "uncorrected"), ("scope", "volatile"))
Facts = tuple[str, tuple[tuple[str, str], ...], float]


def judge_at(judge: HealthJudge, now: float, *samples: Facts, gpu: GpuState = GPU) -> Verdict:
    batch = [Sample(n, (*BASE, *labels), v) for n, labels, v in samples]
    return judge.judge(now, UP, [gpu], batch)[0][3]


def verdict(*samples: Facts) -> Verdict:
    return judge_at(HealthJudge(AckStore(None)), 0.0, *samples)


def test_a_double_bit_error_and_a_pending_remap_make_it_unhealthy_worst_first() -> None:
    v = verdict(
        (m.ROW_REMAP_PENDING, (), 1.0),
        (m.ECC_ERRORS, DBE_VOLATILE, 2.0),
        (m.ECC_ERRORS, (("type", "uncorrected"), ("scope", "aggregate")), 7.0),
    )
    assert v.state == Health.UNHEALTHY
    assert v.reasons == [
        "GPU 3: 2 uncorrectable ECC errors since the last reset",
        "GPU 3: a row remap waits for a GPU reset",
    ]
    assert v.actions == ["drain the GPU's jobs and reset the GPU", "reset the GPU when it is idle"]


def test_after_a_reset_the_volatile_counts_are_zero_and_the_gpu_is_healthy_again() -> None:
    cleared = verdict(
        (m.ROW_REMAP_PENDING, (), 0.0),
        (m.ECC_ERRORS, DBE_VOLATILE, 0.0),
        (m.ECC_ERRORS, (("type", "uncorrected"), ("scope", "aggregate")), 7.0),  # history only
    )
    assert cleared.state == Health.HEALTHY


def test_the_slow_tier_counts_as_read_until_read_again() -> None:
    judge = HealthJudge(AckStore(None))
    fast = [Sample(m.CLOCK_EVENT, (*BASE, ("reason", "hw_slowdown")), 1.0)]
    dbe = [Sample(m.ECC_ERRORS, (*BASE, *DBE_VOLATILE), 1.0)]
    for now in (0.0, 1.0):  # the same reading of the slow tier, cycle after cycle
        v = judge.judge(now, UP, [GPU], fast, slow=[dbe])[0][3]
        assert [c.key for c in v.causes] == ["ecc-dbe", "clocks-hw_slowdown"]
    reset = [Sample(m.ECC_ERRORS, (*BASE, *DBE_VOLATILE), 0.0)]
    assert judge.judge(2.0, UP, [GPU], fast, slow=[reset])[0][3].reasons == [
        "GPU 3: HW slowdown is holding the clocks down"
    ]


def test_what_each_slow_part_gives_is_made_again_only_when_the_part_is_read_again() -> None:
    made: list[list[Sample]] = []

    def derive(part: list[Sample]) -> float:
        made.append(part)
        return sum(s.value for s in part)

    per_part = PerPart(derive)
    a, b = [Sample("x", (), 1.0)], [Sample("x", (), 2.0)]
    assert per_part([a, b]) == [1.0, 2.0]
    assert per_part([a, b]) == [1.0, 2.0] and made == [a, b]
    b2 = [Sample("x", (), 5.0)]  # b read again: a new list, with the same contents or not
    assert per_part([a, b2]) == [1.0, 5.0] and made == [a, b, b2]
    assert per_part([b2]) == [5.0]  # a part gone is forgotten
    assert per_part([a]) == [1.0] and made[-1] is a


def test_the_recovery_action_and_a_link_down() -> None:
    assert verdict((m.RECOVERY_ACTION, (("action", "drain_p2p"),), 1.0)).state == Health.DEGRADED
    reboot = verdict((m.RECOVERY_ACTION, (("action", "node_reboot"),), 1.0))
    assert reboot.actions == ["drain the node and reboot it"]
    link = verdict(
        (m.NVLINK_LINK_UP, (("link", "5"),), 0.0), (m.NVLINK_LINK_UP, (("link", "6"),), 1.0)
    )
    assert link.reasons == ["GPU 3: NVLink 5 down"]


def test_a_critical_xid_holds_until_the_gpu_is_reset() -> None:
    judge = HealthJudge(AckStore(None))
    judge.record_xid("GPU-3", 100.0, 48)
    v = judge_at(judge, 101.0, (m.ECC_ERRORS, DBE_VOLATILE, 1.0))
    assert v.state == Health.UNHEALTHY
    assert [c.key for c in v.causes] == ["ecc-dbe", "xid-48"]
    assert v.causes[0].reason == "GPU 3: 1 uncorrectable ECC error since the last reset"
    assert v.causes[1].reason.startswith(
        "GPU 3: XID 48 (Double-bit ECC error) at 1970-01-01T00:01:40"
    )
    assert v.causes[1].action.startswith("reset the GPU")
    # A day later it still holds: nothing has shown the GPU was reset, not even a cycle in
    # which the ECC counts could not be read.
    assert judge_at(judge, 86399.0).state == Health.UNHEALTHY
    assert judge_at(judge, 86400.0, (m.ECC_ERRORS, DBE_VOLATILE, 1.0)).state == Health.UNHEALTHY
    assert judge_at(judge, 86400.5).state == Health.UNHEALTHY
    # The reset zeroes the volatile count: that clears the XID too.
    assert judge_at(judge, 86401.0, (m.ECC_ERRORS, DBE_VOLATILE, 0.0)).state == Health.HEALTHY


def test_a_lost_gpu_that_comes_back_was_reset() -> None:
    judge = HealthJudge(AckStore(None))
    judge.record_xid("GPU-3", 1.0, 79)
    lost = GpuState(INFO, GpuStatus.LOST, "NVML: GPU is lost")
    v = judge_at(judge, 2.0, gpu=lost)
    assert [c.key for c in v.causes] == ["gpu-lost", "xid-79"]
    assert judge_at(judge, 60.0).state == Health.HEALTHY


def test_a_gpu_lost_before_the_daemon_came_was_reset_when_it_is_back() -> None:
    """Lost when the daemon started, the GPU could not be opened and has no UUID yet; the
    kernel log's XID 79 is under its UUID (from its PCI address). Opened later, it is back."""
    judge = HealthJudge(AckStore(None))
    judge.record_xid("GPU-3", 1.0, 79)
    unopened = GpuInfo(3, "", "", "", "", "", 0)
    v = judge_at(judge, 2.0, gpu=GpuState(unopened, GpuStatus.LOST, "NVML: GPU is lost"))
    assert [c.key for c in v.causes] == ["gpu-lost"]
    assert judge_at(judge, 60.0).state == Health.HEALTHY


def test_another_gpu_at_a_lost_gpus_index_keeps_its_xids() -> None:
    """After a re-enumeration index 3 is another GPU: the lost one's coming back is not its."""
    judge = HealthJudge(AckStore(None))
    judge.record_xid("GPU-9", 1.0, 48)
    judge_at(judge, 2.0, gpu=GpuState(INFO, GpuStatus.LOST, "NVML: GPU is lost"))
    other = GpuState(
        GpuInfo(3, "GPU-9", INFO.model, "0000:9b:00.0", "1654", "96.00", 18), GpuStatus.OK, ""
    )
    assert [c.key for c in judge_at(judge, 3.0, gpu=other).causes] == ["xid-48"]


def test_warning_xids_degrade_for_an_hour_and_application_xids_not_at_all() -> None:
    judge = HealthJudge(AckStore(None))
    judge.record_xid("GPU-3", 0.0, 13)  # an application's own fault
    assert judge_at(judge, 1.0).state == Health.HEALTHY
    judge.record_xid("GPU-3", 5.0, 94)  # contained: NVIDIA says restart the application
    assert judge_at(judge, 6.0).state == Health.HEALTHY
    judge.record_xid("GPU-3", 10.0, 54)
    judge.record_xid("GPU-3", 20.0, 54)
    v = judge_at(judge, 30.0)
    assert v.state == Health.DEGRADED
    assert "XID 54 (Auxiliary power not connected to the board) 2 times since" in v.reasons[0]
    assert judge_at(judge, 20.0 + 3601.0).state == Health.HEALTHY


def test_an_xid_the_catalog_lacks_degrades_for_an_hour_never_healthy() -> None:
    judge = HealthJudge(AckStore(None))
    judge.record_xid("GPU-3", 10.0, 180)  # a newer driver's than the catalog
    v = judge_at(judge, 11.0)
    assert v.state == Health.DEGRADED
    assert "XID 180 (Unknown to gpuwatch's XID catalog, from NVIDIA's" in v.reasons[0]
    assert "dmesg" in v.actions[0]
    assert judge_at(judge, 10.0 + 3601.0).state == Health.HEALTHY
    judge.record_xid("GPU-3", 5000.0, 45)  # preemptive cleanup: the XID next to it speaks
    assert judge_at(judge, 5001.0).state == Health.HEALTHY


def test_an_acknowledged_cause_stops_counting_until_it_changes_or_clears(tmp_path: Path) -> None:
    judge = HealthJudge(AckStore(tmp_path))
    judge.record_xid("GPU-3", 1.0, 74)
    v = judge_at(judge, 2.0)
    judge.acks.add("GPU-3", v.causes[0], 2.0, "link replaced, ticket 4411")
    v = judge_at(judge, 3.0)
    assert v.state == Health.HEALTHY
    assert [c.key for c in v.acknowledged] == ["xid-74"]
    # The acknowledgement survives a restart of the daemon.
    restarted = HealthJudge(AckStore(tmp_path))
    restarted.record_xid("GPU-3", 1.0, 74)
    assert judge_at(restarted, 4.0).state == Health.HEALTHY
    # One more XID 74 is news: the acknowledgement no longer covers it.
    restarted.record_xid("GPU-3", 5.0, 74)
    assert judge_at(restarted, 6.0).state == Health.UNHEALTHY


def test_an_acknowledgement_is_dropped_once_its_cause_clears(tmp_path: Path) -> None:
    judge = HealthJudge(AckStore(tmp_path))
    pending = (m.ROW_REMAP_PENDING, (), 1.0)
    judge.acks.add("GPU-3", judge_at(judge, 0.0, pending).causes[0], 0.0, "")
    assert judge_at(judge, 1.0, pending).state == Health.HEALTHY
    assert judge_at(judge, 2.0, (m.ROW_REMAP_PENDING, (), 0.0)).state == Health.HEALTHY
    assert list(AckStore(tmp_path)) == []
    assert judge_at(judge, 3.0, pending).state == Health.DEGRADED


def test_a_gpu_the_node_had_before_and_no_longer_lists_makes_the_node_unhealthy() -> None:
    judge = HealthJudge(AckStore(None))
    gone = MissingGpu("GPU-7", 7, "NVIDIA H100 80GB HBM3", "1656", "0000:db:00.0")
    backend = BackendState(up=True, name="nvml", missing=(gone,))
    gpus, node = judge.judge(0.0, backend, [GPU], [])
    assert gpus[3].state == Health.HEALTHY
    assert node.state == Health.UNHEALTHY
    assert node.causes[0].key == "gpu-missing-GPU-7"
    assert "last seen as GPU 7" in node.reasons[0]
    judge.acks.add("", node.causes[0], 0.0, "pulled for RMA")
    assert judge.judge(1.0, backend, [GPU], [])[1].state == Health.HEALTHY


def alert(name: str, severity: str, cause: str, uuid: str = "GPU-3", **notes: str) -> RaisedCause:
    labels = {"alertname": name, "severity": severity, "cause": cause, "gpu": "3", "uuid": uuid}
    [raised] = raised_causes([(labels, {"summary": f"{name} on GPU 3", **notes})])
    return raised


def test_a_firing_alert_with_a_cause_label_is_a_cause_of_its_gpus_verdict() -> None:
    judge = HealthJudge(AckStore(None))
    crc = alert("GpuNvlinkErrors", "warning", "nvlink-crc", action="watch the link")
    storm = alert("GpuNvlinkErrors", "critical", "nvlink-crc", action="drain")
    gpus, node = judge.judge(0.0, UP, [GPU], [], raised=[crc])
    assert [(c.key, c.state, c.reason, c.action) for c in gpus[3].causes] == [
        ("nvlink-crc", Health.DEGRADED, "GpuNvlinkErrors on GPU 3", "watch the link")
    ]
    assert node.state == Health.DEGRADED
    # Two alerts for one cause (two links, or a warning and a storm): one cause, the worst.
    gpus, _ = judge.judge(1.0, UP, [GPU], [], raised=[crc, storm])
    assert [(c.key, c.state, c.action) for c in gpus[3].causes] == [
        ("nvlink-crc", Health.UNHEALTHY, "drain")
    ]
    assert judge.judge(2.0, UP, [GPU], [])[0][3].state == Health.HEALTHY  # resolved: cleared


def test_only_alerts_with_a_cause_and_a_severity_that_counts_raise_one() -> None:
    firing = [
        ({"alertname": "GpuTooHot", "severity": "critical", "uuid": "GPU-3"}, {}),  # no cause
        ({"alertname": "Note", "severity": "info", "cause": "note", "uuid": "GPU-3"}, {}),
        ({"alertname": "Mine", "cause": "mine", "uuid": "GPU-3"}, {}),  # no severity: degraded
    ]
    [raised] = raised_causes(firing)
    assert (raised.uuid, raised.cause.key, raised.cause.state, raised.cause.reason) == (
        "GPU-3",
        "mine",
        Health.DEGRADED,
        "Mine",
    )


def test_an_alert_naming_no_gpu_of_the_node_is_the_nodes_cause() -> None:
    judge = HealthJudge(AckStore(None))
    gone = alert("FabricDown", "critical", "fabric", uuid="")
    gpus, node = judge.judge(0.0, UP, [GPU], [], raised=[gone])
    assert gpus[3].state == Health.HEALTHY
    assert [(c.key, c.state) for c in node.causes] == [("fabric", Health.UNHEALTHY)]


def test_an_unresponsive_gpu_is_degraded_until_its_alert_fires_and_keeps_its_reason() -> None:
    judge = HealthJudge(AckStore(None))
    stalled = GpuState(INFO, GpuStatus.UNRESPONSIVE, "nvmlDeviceGetTemperature took longer than 2s")
    brief = judge.judge(0.0, UP, [stalled], [])[0][3]  # a stall of a few seconds pages nobody
    assert brief.state == Health.DEGRADED
    assert brief.reasons == ["GPU 3 is unresponsive: nvmlDeviceGetTemperature took longer than 2s"]
    lasting = alert("GpuUnresponsive", "critical", "gpu-unresponsive", action="reset it")
    crc = alert("GpuNvlinkErrors", "warning", "nvlink-crc")
    v = judge.judge(10.0, UP, [stalled], [], raised=[lasting, crc])[0][3]
    # What alerts say of its readings adds nothing to a GPU that cannot be read.
    assert [(c.key, c.state, c.action) for c in v.causes] == [
        ("gpu-unresponsive", Health.UNHEALTHY, "reset it")
    ]
    assert v.reasons == brief.reasons


def test_an_acknowledged_alert_cause_is_news_again_when_its_fingerprint_changes(
    tmp_path: Path,
) -> None:
    judge = HealthJudge(AckStore(tmp_path))
    pages = alert("GpuRetiredPagesHigh", "critical", "retired-pages", cause_fingerprint="63")
    v = judge.judge(0.0, UP, [GPU], [], raised=[pages])[0][3]
    judge.acks.add("GPU-3", v.causes[0], 0.0, "RMA filed")
    assert judge.judge(1.0, UP, [GPU], [], raised=[pages])[0][3].state == Health.HEALTHY
    more = alert("GpuRetiredPagesHigh", "critical", "retired-pages", cause_fingerprint="64")
    assert judge.judge(2.0, UP, [GPU], [], raised=[more])[0][3].state == Health.UNHEALTHY


def test_an_acknowledgement_does_not_hide_a_worse_state_of_its_cause(tmp_path: Path) -> None:
    judge = HealthJudge(AckStore(tmp_path))
    crc = alert("GpuNvlinkErrors", "warning", "nvlink-crc")
    v = judge.judge(0.0, UP, [GPU], [], raised=[crc])[0][3]
    judge.acks.add("GPU-3", v.causes[0], 0.0, "watching it")
    assert judge.judge(1.0, UP, [GPU], [], raised=[crc])[0][3].state == Health.HEALTHY
    storm = alert("GpuNvlinkErrors", "critical", "nvlink-crc")
    assert judge.judge(2.0, UP, [GPU], [], raised=[storm])[0][3].state == Health.UNHEALTHY
    # Kept across a restart, state and all.
    again = HealthJudge(AckStore(tmp_path))
    assert again.judge(3.0, UP, [GPU], [], raised=[crc])[0][3].state == Health.HEALTHY
    assert again.judge(4.0, UP, [GPU], [], raised=[storm])[0][3].state == Health.UNHEALTHY


def test_an_acknowledged_alert_cause_outlives_a_flap_of_its_alert_but_not_its_end() -> None:
    judge = HealthJudge(AckStore(None))
    pages = alert("GpuRetiredPagesHigh", "critical", "retired-pages", cause_fingerprint="63")
    v = judge.judge(0.0, UP, [GPU], [], raised=[pages])[0][3]
    judge.acks.add("GPU-3", v.causes[0], 0.0, "RMA filed")
    judge.judge(5.0, UP, [GPU], [])  # the GPU stalled: its series went stale, the alert resolved
    assert judge.judge(8.0, UP, [GPU], [], raised=[pages])[0][3].state == Health.HEALTHY
    judge.judge(8.0 + RAISED_ACK_GRACE_S + 1, UP, [GPU], [])  # quiet for longer: it is over
    assert judge.judge(1000.0, UP, [GPU], [], raised=[pages])[0][3].state == Health.UNHEALTHY


def test_an_alert_cause_the_node_has_is_listed_for_acknowledgement() -> None:
    judge = HealthJudge(AckStore(None))
    elsewhere = alert("FabricDown", "critical", "fabric", uuid="GPU-gone")  # not listed here
    _, node = judge.judge(0.0, UP, [GPU], [], raised=[elsewhere])
    assert [c.key for c in judge.node_causes] == ["fabric"] == [c.key for c in node.causes]
    judge.acks.add("", judge.node_causes[0], 0.0, "facilities know")
    assert judge.judge(1.0, UP, [GPU], [], raised=[elsewhere])[1].state == Health.HEALTHY


def test_any_severity_but_info_raises_a_cause_and_critical_ones_are_unhealthy() -> None:
    def state(severity: str) -> Health | None:
        labels = {"alertname": "A", "cause": "a", "severity": severity}
        found = raised_causes([(labels, {})])
        return found[0].cause.state if found else None

    assert state("critical") == state("page") == state("Error") == Health.UNHEALTHY
    assert state("warning") == state("major") == state("") == Health.DEGRADED
    assert state("info") is None and state("none") is None


def test_an_alert_summary_without_its_gpu_gets_the_gpu_named() -> None:
    judge = HealthJudge(AckStore(None))
    labels = {"alertname": "TooHot", "cause": "hot", "severity": "warning", "uuid": "GPU-3"}
    raised = raised_causes([(labels, {"summary": "Too hot"})])
    assert judge.judge(0.0, UP, [GPU], [], raised=raised)[0][3].reasons == ["GPU 3: Too hot"]


def test_a_storm_of_one_xid_is_one_cause_counted_from_its_first() -> None:
    judge = HealthJudge(AckStore(None))
    for i in range(100_000):  # restored from the journal newest first, or live
        judge.record_xid("GPU-3", 2000.0 - i / 100, 48)
    [cause] = judge_at(judge, 2001.0).causes
    assert cause.key == "xid-48"
    assert cause.reason == (
        "GPU 3: XID 48 (Double-bit ECC error) 100000 times since 1970-01-01T00:16:40.010000Z"
    )


def test_xids_counted_as_other_are_one_cause_that_says_what_they_are() -> None:
    judge = HealthJudge(AckStore(None))
    judge.record_xid("GPU-3", 10.0, OTHER)
    judge.record_xid("GPU-3", 11.0, OTHER)
    [cause] = judge_at(judge, 12.0).causes
    assert (cause.key, cause.state) == ("xid-other", Health.DEGRADED)
    assert cause.reason == (
        "GPU 3: XIDs of codes above 255 that NVIDIA has not numbered (after the first 16 such"
        " codes): 2 times since 1970-01-01T00:00:10.000000Z"
    )


def test_an_acknowledgement_of_a_gpu_that_does_not_answer_covers_nothing(tmp_path: Path) -> None:
    # As an older gpuwatch kept it in acks.json, or as a hand-edited file would.
    acks = AckStore(tmp_path)
    judge = HealthJudge(acks)
    lost = GpuState(INFO, GpuStatus.LOST, "NVML: GPU is lost")
    [cause] = judge_at(judge, 0.0, gpu=lost).causes
    acks.add("GPU-3", cause, 0.0, "")
    again = judge_at(judge, 1.0, gpu=lost)
    assert again.state == Health.UNHEALTHY and [c.key for c in again.causes] == ["gpu-lost"]


def test_the_health_line_says_nothing_wrong_only_when_nothing_is_acknowledged_or_down() -> None:
    gpus = [{"index": i, "status": "ok"} for i in range(8)]
    healthy = {"verdict": "healthy", "gpus": gpus}
    assert health_line(healthy) == "healthy: 8 GPUs, nothing wrong"
    acked = {**healthy, "acknowledged": [{"reason": "GPU 1: XID 48"}, {"reason": "x"}]}
    assert health_line(acked) == "healthy: 8 GPUs, acknowledged: GPU 1: XID 48 (+1 more)"
    down = [*gpus[:1], {"index": 1, "status": "lost"}, *gpus[2:]]
    assert health_line({**healthy, "gpus": down}) == "healthy: 8 GPUs, GPU 1 is lost"
    unhealthy = {"verdict": "unhealthy", "reasons": ["GPU 1 is lost", "b"], "actions": ["drain"]}
    assert health_line(unhealthy) == "unhealthy: GPU 1 is lost; drain (+1 more)"
    assert health_line({}, "http://n:10040") == "unknown: http://n:10040: no verdict yet"
