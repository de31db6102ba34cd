"""Provenance: which rules speak for the hardware, and that what a job pushes can neither
judge a GPU nor speak for one."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from gpuwatch.health.acks import AckStore
from gpuwatch.health.judge import RAISED_ACK_GRACE_S, HealthJudge
from gpuwatch.health.raised import raised_causes
from gpuwatch.health.verdict import Health, Verdict
from gpuwatch.host.processes import job_from_cgroup
from gpuwatch.model import (
    BackendState,
    GpuInfo,
    GpuProcess,
    GpuState,
    GpuStatus,
    Provenance,
    Sample,
)
from gpuwatch.push.attribution import Attribution, job_cgroup
from gpuwatch.push.parse import PushError, parse_json, parse_text
from gpuwatch.rules.engine import RuleEngine
from gpuwatch.rules.files import load_rule_files, shipped_packs
from gpuwatch.rules.outgoing import alerts_to_send, cause_labels, firing_alerts
from gpuwatch.rules.provenance import rule_provenance
from gpuwatch.rules.views import alerts_payload
from gpuwatch.store.tsdb import Store

T0 = 1_700_000_000.0
UP = BackendState(up=True, name="nvml")


def provenance_of(tmp_path: Path, rules: str) -> dict[str, Provenance]:
    path = tmp_path / "rules.yaml"
    path.write_text(rules)
    groups = load_rule_files([str(path)])
    found = rule_provenance(groups)
    return {r.name: found[g.key, i] for g in groups for i, r in enumerate(g.rules)}


RULES = """\
groups:
  - name: a
    rules:
      - alert: Hot
        expr: gpuwatch_gpu_temperature_celsius > 85
      - alert: Nan
        expr: train_loss != train_loss
      - alert: Mixed
        expr: gpuwatch_gpu_utilization_ratio > 0.5 and on(gpu) train_step
      - alert: Unnamed
        expr: '{__name__=~"gpuwatch_.+"} > 1'
      - alert: NamedByMatcher
        expr: '{__name__="gpuwatch_gpu_up"} == 0'
      - alert: OnAlerts
        expr: gpuwatch_alerts{alertname="Nan"}
      - alert: QueriesInALabel
        expr: gpuwatch_gpu_up == 0
        labels:
          cause: '{{ with query "train_loss" }}{{ . | first | label "cause" }}{{ end }}'
      - record: gpuwatch:laundered
        expr: max by (gpu) (train_loss)
      - record: gpuwatch:twice_laundered
        expr: gpuwatch:laundered * 2
      - record: gpuwatch:clean
        expr: max by (gpu) (gpuwatch_gpu_temperature_celsius)
      - record: job:clean_but_pushable
        expr: max by (gpu) (gpuwatch_gpu_temperature_celsius)
      - alert: DeclaredAJobs
        expr: gpuwatch_gpu_memory_used_bytes > 0
        labels: {provenance: job}
      - alert: ClaimsTheHardwares
        expr: train_loss > 0
        labels: {provenance: hardware}
  - name: b
    rules:
      - alert: OnLaundered
        expr: gpuwatch:twice_laundered > 0
      - alert: OnClean
        expr: gpuwatch:clean > 85
      - alert: OnUnprefixedRecord
        expr: job:clean_but_pushable > 85
"""


def test_a_rule_is_the_hardwares_only_when_everything_it_reads_is(tmp_path: Path) -> None:
    found = provenance_of(tmp_path, RULES)
    hardware = {name for name, p in found.items() if p is Provenance.HARDWARE}
    # A job may push any name outside gpuwatch_, a record's too, so only records named in the
    # daemon's namespace and fed by hardware series stay the hardware's, across groups. A rule
    # may declare itself a job's; no label makes one the hardware's.
    assert hardware == {
        "Hot",
        "NamedByMatcher",
        "gpuwatch:clean",
        "job:clean_but_pushable",
        "OnClean",
    }


def test_the_shipped_packs_training_rules_are_a_jobs_and_the_rest_the_hardwares() -> None:
    groups = load_rule_files(shipped_packs())
    found = rule_provenance(groups)
    jobs = {r.name for g in groups for i, r in enumerate(g.rules) if found[g.key, i] == "job"}
    assert jobs == {
        "TrainingLossNaN",
        "TrainingStalled",
        "TrainingOutOfMemory",
        "GpuMemoryNearFull",
        "GpuStarved",
        "GpuNvlinkSaturated",
        "GpuPcieSaturated",
        "GpuPeerTrafficOverPcie",
    }


NAN_RULE = """\
groups:
  - name: training
    rules:
      - alert: TrainingLossNaN
        expr: train_loss != train_loss
        labels: {severity: critical}
        annotations: {summary: "loss {{ $value }}"}
      - alert: GpuLost
        expr: gpuwatch_gpu_up == 0
        labels: {severity: critical, cause: gpu-lost}
        annotations: {summary: "GPU {{ $labels.gpu }} lost"}
"""


def test_a_pushed_cause_raises_nothing_and_the_daemon_names_node_and_provenance(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(NAN_RULE)
    engine = RuleEngine(Store(3600), [str(path)], 1.0, None)
    engine.load()
    job, pushed = parse_json(
        json.dumps(
            {
                "job": "alice",
                "labels": {
                    "rank": "0",
                    "cause": "xid-79",
                    "uuid": "GPU-3",
                    "node": "other",
                    "gpu": "3",
                },
                "metrics": {"train_loss": "NaN"},
            }
        ).encode()
    )
    assert job == "alice"
    engine.store.ingest("push", T0, pushed)
    engine.store.ingest(
        "nvml", T0, [Sample("gpuwatch_gpu_up", (("gpu", "1"), ("uuid", "GPU-1")), 0.0)]
    )
    engine.evaluate(T0)
    rules = list(engine.alerting_rules())
    # Only the hardware's alert raises a cause; the pushed cause, GPU and node are the job's
    # words, kept under exported_ names.
    [raised] = raised_causes(firing_alerts(rules))
    assert (raised.uuid, raised.cause.key) == ("GPU-1", "gpu-lost")
    assert cause_labels(rules) == {"gpu-lost"}
    sent = {dict(a.labels)["alertname"]: dict(a.labels) for a in alerts_to_send(rules, "gw1")}
    nan = sent["TrainingLossNaN"]
    assert (nan["node"], nan["provenance"]) == ("gw1", "job")
    assert "cause" not in nan and "uuid" not in nan and "gpu" not in nan
    assert (nan["exported_cause"], nan["exported_uuid"], nan["exported_node"]) == (
        "xid-79",
        "GPU-3",
        "other",
    )
    # The hardware's keep the labels (and fingerprints) receivers already know.
    assert "provenance" not in sent["GpuLost"]
    shown = {a["labels"]["alertname"]: a["provenance"] for a in alerts_payload(engine)["alerts"]}
    assert shown == {"TrainingLossNaN": "job", "GpuLost": "hardware"}


def test_reserved_labels_are_renamed_as_prometheus_renames_a_clash() -> None:
    body = b'train_loss{gpu="3",exported_gpu="x",severity="critical",rank="0"} 1\n'
    [sample] = parse_text(body, "bert")
    assert dict(sample.labels) == {
        "exported_exported_gpu": "3",
        "exported_gpu": "x",
        "exported_severity": "critical",
        "rank": "0",
        "job": "bert",
    }
    assert math.isclose(sample.value, 1.0)


def test_the_daemons_namespace_stays_closed_to_pushes() -> None:
    with pytest.raises(PushError, match="daemon's own"):
        parse_text(b'gpuwatch_gpu_up{gpu="0"} 0\n', "bert")


def gpu(index: int, *processes: GpuProcess) -> GpuState:
    info = GpuInfo(index, f"GPU-{index}", "H100", f"0000:{index:02x}:00.0", "S", "V", 18)
    return GpuState(info, GpuStatus.OK, processes=processes)


def test_a_push_speaks_for_the_gpus_its_sender_or_its_job_holds_and_no_other() -> None:
    alice_rank = GpuProcess(1001, "python3", "alice", 1e9, "slurm", "81234")
    bob = GpuProcess(2002, "python3", "bob", 1e9, "slurm", "99")
    gpus = [gpu(0, alice_rank), gpu(1, replace(alice_rank, pid=1002)), gpu(5, bob)]
    slurm = "/system.slice/slurmstepd.scope/job_"
    jobs = {  # pid -> its job's cgroup path, as /proc/PID/cgroup names it
        1001: f"{slurm}81234", 1002: f"{slurm}81234", 2002: f"{slurm}99",
        3003: f"{slurm}81234",  # alice's launcher, on no GPU itself
        # A user's own cgroup of the same name, under what systemd delegates to them: the
        # environment's SLURM_JOB_ID is not asked at all.
        4004: "/user.slice/user-1000.slice/user@1000.service/job_99",
    }  # fmt: skip
    stamp = Attribution(lambda: gpus, lambda pid: jobs.get(pid, "")).stamp
    [claim_5] = parse_text(b'train_loss{gpu="5",rank="0"} NaN\n', "alice")
    [claim_1] = parse_text(b'train_loss{gpu="1",rank="0"} NaN\n', "alice")

    def gpu_of(samples: list[Sample]) -> tuple[str | None, str | None]:
        labels = dict(samples[0].labels)
        return labels.get("gpu"), labels.get("uuid")

    # A rank's own process holds one GPU: that is the one, whatever it wrote.
    assert gpu_of(stamp([claim_5], 1001)) == ("0", "GPU-0")
    # A launcher of the job holds none itself: its job holds two, and its word picks one of
    # them, never bob's GPU 5.
    assert gpu_of(stamp([claim_1], 3003)) == ("1", "GPU-1")
    assert gpu_of(stamp([claim_5], 3003)) == (None, None)
    # A cgroup that only looks like bob's job, a process of no job, and a push over TCP (no
    # pid) speak for no GPU.
    assert gpu_of(stamp([claim_5], 4004)) == (None, None)
    assert gpu_of(stamp([claim_5], 5005)) == (None, None)
    assert gpu_of(stamp([claim_5], None)) == (None, None)
    assert dict(stamp([claim_5], 3003)[0].labels)["exported_gpu"] == "5"


def test_a_job_is_its_cgroups_path_down_to_the_jobs_directory() -> None:
    v2 = "0::/system.slice/slurmstepd.scope/job_81234/step_0/user/task_0\n"
    assert job_cgroup(v2) == "/system.slice/slurmstepd.scope/job_81234"
    v1 = "12:pids:/slurm/uid_1000/job_81234/step_0\n11:cpu:/slurm/uid_1000/job_81234/step_0\n"
    assert job_cgroup(v1) == "/slurm/uid_1000/job_81234"
    mine = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/job_81234\n"
    assert job_cgroup(mine) != job_cgroup(v2)
    assert job_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") == ""


def test_a_job_directory_a_user_made_names_no_job_of_the_gpus() -> None:
    """Which job holds a GPU (gpuwatch_gpu_job_info, which the straggler rules compare GPUs
    by) is never one a user made in the cgroup subtree systemd delegates to them."""
    v2 = "0::/system.slice/slurmstepd.scope/job_81234/step_0/user/task_0\n"
    assert job_from_cgroup(v2) == ("slurm", "81234")
    mine = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/job_81234\n"
    assert job_from_cgroup(mine) == ("", "")


CRC_RULES = """\
groups:
  - name: g
    rules:
      - alert: GpuNvlinkErrors
        expr: gpuwatch_gpu_nvlink_errors_total > 0
        labels: {severity: critical, cause: nvlink-crc}
        annotations: {summary: "NVLink failing on GPU {{ $labels.gpu }}"}
      - alert: TrainingLossNaN
        expr: train_loss != train_loss
        labels: {severity: critical}
        annotations: {summary: "NaN"}
"""


def test_what_a_job_pushes_keeps_no_acknowledgement_alive(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(CRC_RULES)
    engine = RuleEngine(Store(3600), [str(path)], 1.0, None)
    engine.load()
    judge = HealthJudge(AckStore(None))
    three = gpu(3)
    hardware = (("gpu", "3"), ("uuid", "GPU-3"), ("link", "0"))
    pushed = {"job": "alice", "metrics": {"train_loss": "NaN"},
              "labels": {"cause": "nvlink-crc", "uuid": "GPU-3"}}  # fmt: skip
    _, nan = parse_json(json.dumps(pushed).encode())

    def cycle(t: float, crc: float) -> Verdict:
        engine.store.ingest("nvml", t, [Sample("gpuwatch_gpu_nvlink_errors_total", hardware, crc)])
        engine.store.ingest("push", t, nan)  # the job keeps pushing all along
        engine.evaluate(t)
        raised = raised_causes(firing_alerts(engine.alerting_rules()))
        return judge.judge(t, UP, [three], [], raised=raised)[0][3]

    first = cycle(T0, 5.0)
    [cause] = first.causes
    judge.acks.add("GPU-3", cause, T0, "link reseated")
    assert cycle(T0 + 1, 5.0).state == Health.HEALTHY  # acknowledged
    t = T0 + 2
    while t < T0 + RAISED_ACK_GRACE_S + 30:  # the link's errors are over; the job pushes on
        assert cycle(t, 0.0).state == Health.HEALTHY
        t += 10
    # The acknowledgement ended with the fault it saw: the next fault is news.
    assert cycle(t, 7.0).state == Health.UNHEALTHY
