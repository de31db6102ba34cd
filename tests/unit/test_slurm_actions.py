"""The parts of the Slurm actions that need no Slurm: reading sinfo's answer (a capture from
Slurm 22.05.8), the circuit breaker's arithmetic, the drain reason, running a command with a
deadline, and the config's checks."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from gpuwatch.actions.breaker import Hold, hold, raced
from gpuwatch.actions.drainer import drain_reason, reason_causes
from gpuwatch.actions.slurm import (
    MAX_REASON_CHARS,
    SlurmNode,
    own_reason,
    parse_sinfo,
)
from gpuwatch.config import load_config
from gpuwatch.health.verdict import Cause, Health
from gpuwatch.text.yamlfile import FileError

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "sinfo-22.05.8.txt"
SET_AT = datetime.fromisoformat("2026-11-27T01:49:00").timestamp()  # the capture's reasons


def test_sinfo_capture_reads_states_reasons_and_their_time() -> None:
    nodes = {n.name: n for n in parse_sinfo(CAPTURE.read_text())}
    assert sorted(nodes) == ["gw1", "gw2", "gw3", "gw4"]
    gw1, gw2, gw3, gw4 = (nodes[n] for n in sorted(nodes))
    assert (gw1.states, gw1.reason, gw1.reason_time, gw1.out_of_service) == (
        {"idle"},
        "",
        None,
        False,
    )
    assert gw1.partitions == ("gpu",)  # the default partition's star dropped
    assert gw2.drained and gw2.ours and gw2.reason_time == SET_AT
    assert gw3.drained and not gw3.ours and gw3.reason == "admin: bad fan | OPS-7"
    assert gw4.states == {"down"} and gw4.out_of_service and not gw4.drained and gw4.ours


def test_a_node_in_two_partitions_is_one_node_in_both() -> None:
    line = "\x1f".join
    out = "\n".join([line(["n1", "gpu*", "mixed+drain", "Unknown", "none"]),
                     line(["n1", "debug", "mixed+drain", "Unknown", "none"]),
                     "a line sinfo never prints"])  # fmt: skip
    [node] = parse_sinfo(out)
    assert node.partitions == ("gpu", "debug") and node.states == {"mixed", "drain"}


def node(
    name: str,
    states: set[str],
    reason: str = "",
    at: float | None = None,
    partitions: tuple[str, ...] = ("gpu",),
) -> SlurmNode:
    return SlurmNode(name, partitions, frozenset(states), reason, at)


OURS = "gpuwatch: xid-79 GPU 1: drain the node and reboot it"
NOW = 1_800_000_000.0


def test_the_first_drain_of_a_small_partition_is_allowed() -> None:
    nodes = [node(f"n{i}", {"idle"}) for i in range(8)]
    assert hold(nodes, ["gpu"], NOW, 0.1, 10) is None


def test_the_breaker_counts_only_gpuwatch_reasons_and_only_the_partition() -> None:
    nodes = [
        node("n0", {"idle", "drain"}, OURS, NOW - 7200),
        node("n1", {"idle", "drain"}, "admin: cabling"),  # not ours: not counted
        node("n2", {"down"}, "Not responding"),
        node("n3", {"idle"}),
        node("x0", {"idle", "drain"}, OURS, NOW, partitions=("other",)),
    ]
    found = hold(nodes, ["gpu"], NOW, 0.25, 10)
    assert found is not None and (found.why, found.partition) == ("fraction", "gpu")
    assert "1 of 4 nodes of partition gpu" in found.message
    assert hold(nodes, ["gpu"], NOW, 0.26, 10) is None
    assert hold(nodes, ["other"], NOW, 0.5, 10) is not None  # 1 of 1
    assert hold(nodes, ["nothing"], NOW, 0.1, 10) is None  # an unknown partition holds nothing


def test_the_rate_counts_drains_of_the_last_hour() -> None:
    nodes = [node(f"n{i}", {"idle"}) for i in range(100)] + [
        node("d0", {"idle", "drain"}, OURS, NOW - 60),
        node("d1", {"down", "drain"}, OURS, NOW - 3000),
        node("d2", {"idle", "drain"}, OURS, NOW - 4000),  # over an hour ago
    ]
    found = hold(nodes, ["gpu"], NOW, 0.5, 2)
    assert found is not None and found.why == "rate"
    assert "2 nodes of partition gpu out in the last hour" in found.message
    assert hold(nodes, ["gpu"], NOW, 0.5, 3) is None
    assert hold(nodes, ["gpu"], NOW, 0.5, None) is None


def cause(key: str, reason: str, action: str) -> Cause:
    return Cause(key, Health.UNHEALTHY, reason, action)


def test_the_drain_reason_names_gpuwatch_the_causes_the_gpu_and_the_action() -> None:
    causes = (
        cause("gpu-lost", "GPU 1 is lost: NVML: GPU is lost", "drain the node and reboot it"),
        cause("xid-79", "GPU 1: XID 79 (GPU has fallen off the bus)", "reboot"),
    )
    reason = drain_reason(causes)
    assert reason == "gpuwatch: gpu-lost,xid-79 GPU 1: drain the node and reboot it"
    assert reason_causes(reason) == "gpu-lost,xid-79"
    node_cause = cause("gpu-missing-GPU-1", "a GPU is missing", "reboot")
    assert drain_reason((node_cause,)) == "gpuwatch: gpu-missing-GPU-1: reboot"
    assert reason_causes(drain_reason((node_cause,))) == "gpu-missing-GPU-1"


def test_a_reason_is_one_line_and_bounded() -> None:
    reason = own_reason("a\nlong\treason " + "x" * 500)
    assert reason.startswith("gpuwatch: a long reason xx") and "\n" not in reason
    assert len(reason) == MAX_REASON_CHARS and reason.endswith("...")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpuwatch.yaml"
    path.write_text(text)
    return path


def test_the_config_refuses_an_action_that_could_never_act(tmp_path: Path) -> None:
    with pytest.raises(FileError) as caught:
        load_config(write(tmp_path, "actions:\n  slurm:\n    enabled: true\n"))
    assert "gpuwatch.yaml:2: actions.slurm: enabled, but" in str(caught.value)
    assert "drain_on names no cause" in str(caught.value)
    bad = "actions:\n  slurm:\n    max_drained_fraction: 1.5\n    scontrol: bin/scontrol\n"
    with pytest.raises(FileError) as caught:
        load_config(write(tmp_path, bad))
    text = str(caught.value)
    assert "max_drained_fraction: expected a fraction above 0 and at most 1, got 1.5" in text
    assert "scontrol: expected a program name or an absolute path" in text


def test_the_config_takes_no_rate_limit_and_defaults_the_rest(tmp_path: Path) -> None:
    text = (
        "actions:\n  slurm:\n    enabled: true\n    drain_on: [gpu-lost, 'xid-*']\n"
        "    max_drains_per_hour: null\n    resume_after: 5m\n"
    )
    slurm = load_config(write(tmp_path, text)).actions.slurm
    assert slurm.drain_on == ("gpu-lost", "xid-*") and slurm.max_drains_per_hour is None
    assert (slurm.resume_after, slurm.max_drained_fraction, slurm.dry_run) == (300.0, 0.1, False)


def test_drains_that_raced_stay_in_the_order_they_went_out() -> None:
    def check(nodes: list[SlurmNode], me: str, fraction: float, per_hour: int) -> Hold | None:
        return raced(nodes, ["gpu"], me, NOW, max_fraction=fraction, max_per_hour=per_hour)

    # Five nodes of eight drained in the same second: with 0.25, two may stay out.
    out = [node(f"n{i}", {"idle", "drain"}, OURS, NOW) for i in range(5)]
    fleet = out + [node(f"n{i}", {"idle"}) for i in range(5, 8)]
    assert check(fleet, "n0", 0.25, 10) is None
    assert check(fleet, "n1", 0.25, 10) is None
    undone = check(fleet, "n2", 0.25, 10)
    assert undone is not None and undone.why == "fraction"
    assert "5 of 8 nodes of partition gpu went out at once; 2 may" in undone.message
    # One out since half an hour comes first: nine nodes, room for three (n9, n0, n1).
    older = [node("n9", {"down", "drain"}, OURS, NOW - 1800), *fleet]
    assert check(older, "n1", 0.25, 10) is None
    assert check(older, "n2", 0.25, 10) is not None
    # The rate: three may go out an hour, whatever the fraction.
    assert check(fleet, "n2", 1.0, 3) is None
    rate = check(fleet, "n3", 1.0, 3)
    assert rate is not None and rate.why == "rate"
    assert check(fleet, "n7", 0.25, 10) is None  # not out: nothing to undo
