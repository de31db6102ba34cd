"""The job tracker on hand-made cycles: a job seen on two GPUs, counters that move, clocks
held down, events on its GPUs and beside them, the report written once its processes leave."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpuwatch import metrics as m
from gpuwatch.clock import ManualClock
from gpuwatch.model import (
    BackendState,
    Batch,
    Event,
    GpuInfo,
    GpuProcess,
    GpuState,
    GpuStatus,
    Sample,
)
from gpuwatch.reports.reporter import JobReports
from gpuwatch.reports.text import text
from gpuwatch.reports.tracker import ENDED_AFTER_S

T0 = 1_800_000_000.0


def gpu(index: int, job: str | None) -> GpuState:
    info = GpuInfo(index, f"GPU-{index}", "H100", f"0000:{index:02x}:00.0", "s", "v", 18)
    procs = (GpuProcess(100 + index, "python3", "alice", 1e9, "slurm", job),) if job else ()
    return GpuState(info, GpuStatus.OK, processes=procs)


def batch(
    t: float,
    jobs: dict[int, str | None],
    dbe: float = 0.0,
    slowdown: bool = False,
    slow_reads: dict[tuple[int, float], list[Sample]] | None = None,
) -> Batch:
    """A cycle; with `slow_reads`, the ECC counters come as NVML's slow tier has them: a list
    per GPU, the same list (kept in `slow_reads`) until it is read with another value."""
    gpus = [gpu(i, j) for i, j in jobs.items()]
    samples, slow = [], []
    for g in gpus:
        labels = (("gpu", str(g.info.index)), ("uuid", g.info.uuid))
        ecc = (*labels, ("type", "uncorrected"), ("scope", "volatile"))
        value = dbe if g.info.index == 1 else 0.0
        if slow_reads is not None:
            read = (g.info.index, value)
            slow.append(slow_reads.setdefault(read, [Sample(m.ECC_ERRORS, ecc, value)]))
        else:
            samples.append(Sample(m.ECC_ERRORS, ecc, value))
        samples.append(
            Sample(
                m.CLOCK_EVENT,
                (*labels, ("reason", "hw_slowdown")),
                1.0 if slowdown and g.info.index == 1 else 0.0,
            )
        )
    return Batch("nvml", t, samples, BackendState(True, "nvml"), gpus, slow)


@pytest.mark.parametrize("slow_tier", [False, True])
def test_a_job_gets_its_gpus_counters_throttling_and_events_and_a_report_at_its_end(
    tmp_path: Path, slow_tier: bool
) -> None:
    clock = ManualClock(T0)
    published: list[Event] = []
    reports = JobReports(tmp_path, clock, published.append)
    on = {0: "7", 1: "7", 2: "8"}
    slow_reads: dict[tuple[int, float], list[Sample]] | None = {} if slow_tier else None
    reports.observe(T0, batch(T0, on, slow_reads=slow_reads))
    reports.observe(T0 + 1, batch(T0 + 1, on, slowdown=True, slow_reads=slow_reads))
    reports.observe(T0 + 2, batch(T0 + 2, on, dbe=2.0, slowdown=True, slow_reads=slow_reads))
    reports.on_event(Event(T0 + 2, "xid", 1, "GPU-1", "XID 79 on GPU 1", {"xid": 79}))
    reports.on_event(Event(T0 + 2, "xid", 2, "GPU-2", "XID 13 on GPU 2", {"xid": 13}))
    reports.on_event(
        Event(
            T0 + 2,
            "alert",
            1,
            None,
            "TrainingLossNaN firing",
            {"alertname": "TrainingLossNaN", "state": "firing"},
        )
    )
    reports.on_event(
        Event(
            T0 + 2,
            "alert",
            1,
            None,
            "TrainingLossNaN resolved",
            {"alertname": "TrainingLossNaN", "state": "resolved"},
        )
    )
    running = reports.report("7")
    assert running is not None and running["running"] and running["end"] is None
    gone = {0: None, 1: None, 2: "8"}
    reports.observe(T0 + 3, batch(T0 + 3, gone, dbe=2.0, slow_reads=slow_reads))
    assert not published  # not over yet: a rank restarting leaves its GPU for a moment
    clock.advance(ENDED_AFTER_S)
    ended = T0 + 2 + ENDED_AFTER_S
    reports.observe(ended, batch(ended, gone, dbe=2.0, slow_reads=slow_reads))
    [announced] = published
    assert announced.kind == "job_report" and announced.data["job"] == "7"
    [written] = (tmp_path / "reports").glob("slurm-7-*.json")
    report = json.loads(written.read_text())
    assert report["running"] is False and report["user"] == "alice"
    gpu0, gpu1 = report["gpus"]
    assert (gpu0["xids"], gpu0["alerts"], gpu0["throttled_seconds"]) == ([], [], {})
    assert gpu0["counter_changes"] == {}
    assert [x["xid"] for x in gpu1["xids"]] == [79]  # GPU 2's XID 13 is job 8's
    assert [a["alertname"] for a in gpu1["alerts"]] == ["TrainingLossNaN"]  # firing only
    key = "gpuwatch_gpu_ecc_errors_total{type=uncorrected,scope=volatile}"
    assert gpu1["counter_changes"] == {key: 2.0}
    assert gpu1["throttled_seconds"] == {"hw_slowdown": 2.0}
    lines = text(report).splitlines()
    span = f"{report['start']} to {report['end']}"
    assert lines[0] == f"gpuwatch: Slurm job 7 of alice, {span}, on 2 GPUs"
    assert lines[1] == "  GPU 0: nothing wrong"
    assert lines[2].startswith("  GPU 1: XID 79 at ") and "TrainingLossNaN at" in lines[2]
    assert f"{key} +2" in lines[2] and "clocks held by hw_slowdown 2s" in lines[2]
    assert reports.report("7") is not None  # ended, still there for the Epilog's late ask
    assert reports.report("nope") is None
    # The job comes back (its next step): the same record goes on, its XID kept.
    reports.observe(T0 + 20, batch(T0 + 20, on))
    back = reports.report("7")
    assert back is not None and back["running"] and back["gpus"][1]["xids"]


def test_an_unwritable_reports_directory_costs_the_file_only(tmp_path: Path) -> None:
    blocked = tmp_path / "state"
    blocked.mkdir()
    (blocked / "reports").write_text("a file where the directory would be")
    clock = ManualClock(T0)
    published: list[Event] = []
    reports = JobReports(blocked, clock, published.append)
    reports.observe(T0, batch(T0, {0: "9"}))
    reports.observe(T0 + ENDED_AFTER_S, batch(T0 + ENDED_AFTER_S, {0: None}))
    [announced] = published  # the job's end is still told, without a file to name
    assert announced.data == {"job": "9", "file": ""}
    made = reports.report("9")
    assert made is not None and made["job_id"] == "9" and made["running"] is False


def test_the_report_has_each_gpus_peak_memory_and_how_busy_it_was(tmp_path: Path) -> None:
    """GPU 0 at 30% and then 60% busy (a job waiting on its input half the run), its memory
    peaking at 78 of 80 GiB; GPU 1 busy throughout."""
    gib = 1024**3
    reports = JobReports(tmp_path, ManualClock(T0), lambda _: None)
    on = {0: "7", 1: "7"}
    for i, (util0, used0) in enumerate([(0.3, 60), (0.3, 78), (0.6, 70), (0.6, 70), (0.6, 70)]):
        t = T0 + i
        cycle = batch(t, on)
        for index, util, used in ((0, util0, used0), (1, 0.97, 40)):
            labels = (("gpu", str(index)), ("uuid", f"GPU-{index}"))
            cycle.samples.extend(
                [
                    Sample(m.UTILIZATION, labels, util),
                    Sample(m.MEMORY_USED, labels, used * gib),
                    Sample(m.MEMORY_TOTAL, labels, 80 * gib),
                ]
            )
        reports.observe(t, cycle)
    report = reports.report("7")
    assert report is not None
    gpu0, gpu1 = report["gpus"]
    assert gpu0["memory_peak_bytes"] == 78 * gib and gpu0["memory_total_bytes"] == 80 * gib
    # Four seconds counted between five cycles: one at 30% and three at 60%.
    assert gpu0["utilization_mean"] == pytest.approx(0.525)
    assert gpu0["starved_share"] == pytest.approx(0.25)
    assert (gpu1["utilization_mean"], gpu1["starved_share"]) == (pytest.approx(0.97), 0.0)
    lines = text(report).splitlines()
    assert lines[1] == (
        "  GPU 0: nothing wrong (memory peak 78.0 of 80.0 GiB (98%), busy 52% on average, "
        "under half the time for 25% of the run)"
    )
    assert (
        lines[2]
        == "  GPU 1: nothing wrong (memory peak 40.0 of 80.0 GiB (50%), busy 97% on average)"
    )


def test_the_report_has_each_gpus_link_traffic_over_the_jobs_time(tmp_path: Path) -> None:
    """GPU 0's two NVLinks each send 10 GB/s and receive 9, its PCIe link receives 2 GB/s on
    average; the report gives the mean over the job's time, summed over links. GPU 1's NVLink
    counters read once give no rate; its one PCIe throughput read is its mean."""
    reports = JobReports(tmp_path, ManualClock(T0), lambda _: None)
    for i in range(6):
        t = T0 + 10 * i
        cycle = batch(t, {0: "7"} if i == 0 else {0: "7", 1: "7"})
        labels = (("gpu", "0"), ("uuid", "GPU-0"))
        for link in ("0", "1"):
            for direction, rate in (("tx", 10e9), ("rx", 9e9)):
                series = (*labels, ("link", link), ("direction", direction))
                cycle.slow.append([Sample(m.NVLINK_BYTES, series, rate * 10 * i)])
        # PCIe throughput, 20 ms windows: 1 and 3 GB/s in turn, then 2.
        window = 2e9 if i in (0, 5) else (1e9, 3e9)[i % 2]
        cycle.slow.append([Sample(m.PCIE_THROUGHPUT, (*labels, ("direction", "rx")), window)])
        if i == 5:
            one = (("gpu", "1"), ("uuid", "GPU-1"), ("direction", "rx"))
            cycle.slow.append([Sample(m.PCIE_THROUGHPUT, one, 5e9)])
            cycle.slow.append([Sample(m.NVLINK_BYTES, (*one[:2], ("link", "0"), one[2]), 5e9)])
        reports.observe(t, cycle)
    report = reports.report("7")
    assert report is not None
    gpu0, gpu1 = report["gpus"]
    assert gpu0["nvlink_bytes_per_second"] == {"rx": 18e9, "tx": 20e9}
    assert gpu0["pcie_bytes_per_second"] == {"rx": 2e9}
    assert gpu1["nvlink_bytes_per_second"] == {}
    assert gpu1["pcie_bytes_per_second"] == {"rx": 5e9}
    assert text(report).splitlines()[1] == (
        "  GPU 0: nothing wrong (NVLink GB/s 20.0 out, 18.0 in, PCIe GB/s 2.0 in)"
    )


def checkpoints(gpu: int, count: float, rank: str = "0") -> Sample:
    """A rank's checkpoint count as the push path has it: attributed to its GPU."""
    labels = (("gpu", str(gpu)), ("job", "llama"), ("rank", rank), ("uuid", f"GPU-{gpu}"))
    return Sample("train_checkpoints_total", labels, count)


def test_the_report_says_whether_the_job_checkpointed_after_it_was_told(tmp_path: Path) -> None:
    """Told at 20 s and at 50 s. Rank 0 (GPU 0) checkpoints at 30 s: its count appears at 1,
    as gpuwatch.client sends it from the first checkpoint; rank 1 (GPU 1) beside it, first
    seen at 10 s with 12 checkpoints already written (it pushed late), never checkpoints
    again: a first value other than 1 is where a count starts, and two ranks' counts are
    two counts. A count with no GPU (a push over TCP) moves nothing."""
    reports = JobReports(tmp_path, ManualClock(T0), lambda _: None)
    for i, count in enumerate([None, None, None, 1, 1, 1, 1, 1]):
        t = T0 + 10 * i
        if i in (2, 5):
            reports.on_event(Event(t, "checkpoint_advice", None, None, "preemption in 120 s"))
        pushed = [Sample("train_checkpoints_total", (), float(10 * i))]
        if count is not None:
            pushed.append(checkpoints(0, count))
        if i:
            pushed.append(checkpoints(1, 12.0, rank="1"))
        reports.observe(t, batch(t, {0: "7", 1: "7"}), pushed)
    report = reports.report("7")
    assert report is not None
    assert [a["checkpoint_after"] for a in report["checkpoint_advice"]] == [
        "2027-01-15T08:00:30.000000Z",
        None,
    ]
    lines = text(report).splitlines()
    assert lines[1] == (
        "  at 2027-01-15T08:00:20.000000Z: preemption in 120 s "
        "(checkpointed at 2027-01-15T08:00:30.000000Z)"
    )
    assert (
        lines[2] == "  at 2027-01-15T08:00:50.000000Z: preemption in 120 s "
        "(no checkpoint reported after)"
    )


def test_a_checkpoint_seen_with_the_advice_came_before_it(tmp_path: Path) -> None:
    """A count that grew in the push collected with the cycle that gave the advice was sent
    before the job could have heard it: the next growth is the answer."""
    reports = JobReports(tmp_path, ManualClock(T0), lambda _: None)
    for i, count in enumerate([3, 3, 4, 4, 5]):
        t = T0 + 10 * i
        reports.observe(t, batch(t, {0: "7"}), [checkpoints(0, count)])
        if i == 2:
            reports.on_event(Event(t, "checkpoint_advice", None, None, "row remap pending"))
    record = reports.tracker.find("7")
    assert record is not None and record.checkpoint_after == [T0 + 40]


def test_a_gpu_two_jobs_share_credits_neither_with_its_checkpoints(tmp_path: Path) -> None:
    """Job 8 shares GPU 0 with job 7 (time-slicing, MPS): a count attributed to that GPU
    could be either's, and so is neither's."""
    reports = JobReports(tmp_path, ManualClock(T0), lambda _: None)
    for i in range(4):
        t = T0 + 10 * i
        cycle = batch(t, {0: "7"})
        shared = GpuProcess(200, "python3", "bob", 1e9, "slurm", "8")
        cycle.gpus[0] = replace(cycle.gpus[0], processes=(*cycle.gpus[0].processes, shared))
        if i == 1:
            reports.on_event(Event(t, "checkpoint_advice", None, None, "preemption"))
        reports.observe(t, cycle, [checkpoints(0, float(i))])
    for job in ("7", "8"):
        record = reports.tracker.find(job)
        assert record is not None and record.checkpoint_after == [None]


def test_advice_late_in_a_long_job_still_finds_its_checkpoint(tmp_path: Path) -> None:
    """A job that checkpoints every cycle for a long run, told late: no count of past
    checkpoints caps what the report can say."""
    reports = JobReports(tmp_path, ManualClock(T0), lambda _: None)
    for i in range(300):
        t = T0 + 10 * i
        if i == 290:
            reports.on_event(Event(t, "checkpoint_advice", None, None, "preemption"))
        reports.observe(t, batch(t, {0: "7"}), [checkpoints(0, float(i))])
    record = reports.tracker.find("7")
    assert record is not None and record.checkpoint_after == [T0 + 2910]


def test_a_daemon_started_mid_job_credits_no_checkpoint_it_did_not_see(tmp_path: Path) -> None:
    """A count that appears at 1 for a job already seen is its first checkpoint; the same
    count seen with the job at the daemon's first cycle was written before the daemon was up."""
    for seen_before, expected in ((True, [T0 + 20]), (False, [None])):
        reports = JobReports(tmp_path, ManualClock(T0), lambda _: None)
        if seen_before:
            reports.observe(T0, batch(T0, {0: "7"}), [])
        t = T0 + 10
        reports.observe(t, batch(t, {0: "7"}), [] if seen_before else [checkpoints(0, 1.0)])
        reports.on_event(Event(t, "checkpoint_advice", None, None, "preemption"))
        t = T0 + 20
        reports.observe(t, batch(t, {0: "7"}), [checkpoints(0, 1.0)])
        record = reports.tracker.find("7")
        assert record is not None and record.checkpoint_after == expected
