"""The shipped rule packs load in Prometheus (promtool check rules), pass their
own promtool tests in promtool and in gpuwatch, and carry the alert names routing relies on."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import promql_parser as pp
import pytest
import yaml

from gpuwatch.rules.files import shipped_packs
from gpuwatch.rules.outgoing import shipped_causes
from gpuwatch.xid.known import lookup

ROOT = Path(__file__).resolve().parents[2]
PACKS = ROOT / "rules"
EXPECTED = {
    "hardware.yaml": {
        "GpuFellOffBus", "GpuUnresponsive", "GpuDriverUnresponsive", "GpuMissing",
        "GpuXidCritical", "GpuXidApplication",
        "GpuEccUncorrectable", "GpuRowRemapFailed", "GpuRowRemapPending", "GpuRemappedRowsHigh",
        "GpuRetiredPagesHigh",
        "GpuNvlinkErrors", "GpuNvlinkDown", "GpuPcieReplayRate", "GpuRecoveryActionRequired",
        "GpuXidWarning", "GpuXidUnknown", "GpuFabricNotRegistered", "GpuFabricRegistrationFailed",
        "GpuFabricUnhealthy", "GpuFabricDegraded", "GpuStraggler", "GpuPcieLinkDowntrained",
    },
    "thermal-power.yaml": {
        "GpuTemperatureHigh",
        "GpuTemperatureAtSlowdown",
        "GpuThermalThrottling",
        "GpuPowerBrake",
    },
    "training.yaml": {"TrainingLossNaN", "TrainingStalled", "CollectiveHang", "GpuIdleWithMemory",
                      "TrainingOutOfMemory", "GpuMemoryNearFull", "GpuStarved",
                      "GpuNvlinkSaturated", "GpuPcieSaturated", "GpuPeerTrafficOverPcie"},
    "gpuwatch.yaml": {
        "GpuwatchBackendDown", "GpuwatchSamplingStale", "GpuwatchNvmlTimeouts",
        "GpuwatchRuleFailures", "GpuwatchRulesReloadFailed", "GpuwatchKernelLogUnreadable",
        "GpuwatchNodeDrained", "GpuwatchActionsHeld", "GpuwatchActionFailures",
    },
    "host.yaml": {
        "IbPortDown", "IbPortFlapping", "IbPortSymbolErrors", "IbPortReceiveErrors",
        "IbPortRateDegraded", "GpuNotListedByDriver", "PciDeviceLost", "PcieAerFatal",
        "NvswitchSxidFatal", "NvswitchSxidNonFatal", "FabricManagerDown", "NodePreemptionNotice",
    },
}  # fmt: skip

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None and not os.environ.get("GPUWATCH_REQUIRE_TOOLS"),
    reason="promtool not installed (Debian package 'prometheus')",
)


def alerting_rules(pack: str) -> list[dict[str, object]]:
    data = yaml.safe_load((PACKS / pack).read_text())
    return [r for g in data["groups"] for r in g["rules"] if "alert" in r]


def lost_target_labels(expr: str) -> list[str]:
    """The aggregations and one-to-one matchings of `expr` that would drop or ignore the
    target's `instance` in a fleet Prometheus."""
    problems: list[str] = []

    def visit(node: pp.Expr) -> None:
        if isinstance(node, pp.AggregateExpr):
            modifier = node.modifier
            if modifier is None or (
                modifier.type == pp.AggModifierType.By and "instance" not in modifier.labels
            ):
                problems.append(f"{node.op} {modifier or ''}")
            elif modifier.type == pp.AggModifierType.Without and "instance" in modifier.labels:
                problems.append(f"{node.op} {modifier}")
        binary = node.modifier if isinstance(node, pp.BinaryExpr) else None
        matching = binary.matching if binary is not None else None
        if matching is not None:
            on = matching.type == pp.LabelModifierType.Include  # on(...), not ignoring(...)
            if on != ("instance" in matching.labels):
                problems.append(str(matching))

    pp.walk(pp.parse(expr), lambda node: visit(node) or None)
    return problems


@pytest.mark.parametrize("pack", sorted(EXPECTED))
def test_every_rule_keeps_the_node_in_a_fleet_prometheus(pack: str) -> None:
    """The same file runs on the node (no `instance` label) and in a fleet Prometheus, where an
    alert that aggregated `instance` away would not say which node, and a matching on GPU
    labels alone would pair one node's series with another's."""
    groups = yaml.safe_load((PACKS / pack).read_text())["groups"]
    lost = {
        rule.get("alert") or rule["record"]: found
        for group in groups
        for rule in group["rules"]
        if (found := lost_target_labels(rule["expr"]))
    }
    assert lost == {}


def test_the_shipped_packs_are_exactly_these() -> None:
    assert sorted(Path(p).name for p in shipped_packs()) == sorted(EXPECTED)


@pytest.mark.parametrize("pack", sorted(EXPECTED))
def test_every_alert_name_exists_and_tells_the_operator_what_to_do(pack: str) -> None:
    rules = alerting_rules(pack)
    assert {r["alert"] for r in rules} == EXPECTED[pack]
    for rule in rules:
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert {"summary", "description", "action"} <= set(annotations), rule["alert"]
        labels = rule["labels"]
        assert isinstance(labels, dict)
        assert labels["severity"] in ("critical", "warning", "info"), rule["alert"]


@pytest.mark.parametrize("pack", sorted(EXPECTED))
def test_every_alert_is_exercised_by_the_pack_tests(pack: str) -> None:
    tests = yaml.safe_load((PACKS / "tests" / pack.replace(".yaml", ".test.yaml")).read_text())
    fired = {
        case["alertname"]
        for group in tests["tests"]
        for case in group.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert fired == EXPECTED[pack]


FLEET_TESTS = {"fleet/recording.yaml": "tests/fleet.test.yaml",
               "fleet/boards.yaml": "tests/boards.test.yaml",
               "fleet/stragglers.yaml": "tests/stragglers.test.yaml"}  # fmt: skip


@needs_promtool
@pytest.mark.parametrize("pack", [*sorted(EXPECTED), *FLEET_TESTS])
def test_promtool_and_gpuwatch_accept_the_pack(pack: str) -> None:
    for cmd in (
        ["promtool", "check", "rules"],
        [sys.executable, "-m", "gpuwatch", "rules", "check"],
    ):
        done = subprocess.run(
            [*cmd, pack], cwd=PACKS, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCESS" in done.stdout


@needs_promtool
@pytest.mark.parametrize("pack", [*sorted(EXPECTED), *FLEET_TESTS])
def test_the_pack_tests_pass_in_promtool_and_in_gpuwatch_alike(pack: str) -> None:
    test_file = FLEET_TESTS.get(pack, f"tests/{pack.replace('.yaml', '.test.yaml')}")
    results = [
        subprocess.run(
            [*cmd, test_file], cwd=PACKS, capture_output=True, text=True, timeout=120, check=False
        )
        for cmd in (
            ["promtool", "test", "rules"],
            [sys.executable, "-m", "gpuwatch", "rules", "test"],
        )
    ]
    for done in results:
        assert done.returncode == 0, done.stdout + done.stderr
    assert results[0].stdout == results[1].stdout


def test_the_xid_alerts_cover_the_catalog_and_an_xid_it_lacks() -> None:
    """Each XID the catalog knows goes to the alert of its class (or to none, or its own), and
    any other goes to GpuXidUnknown: a list in the pack that drifts from the catalog would
    leave an XID unsaid, or say it twice."""
    rules = {
        r["alert"]: r["expr"]
        for g in yaml.safe_load((PACKS / "hardware.yaml").read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    alerts = {"critical": "GpuXidCritical", "warning": "GpuXidWarning",
              "application": "GpuXidApplication", "info": None, "driver": None}  # fmt: skip

    def matcher(alert: str) -> tuple[str, str]:
        found = re.search(r'xid(=~|!~)"([^"]+)"', rules[alert])
        assert found, alert
        return found.group(1), found.group(2)

    def raised(code: int) -> set[str]:
        out = set()
        for alert in ("GpuXidCritical", "GpuXidWarning", "GpuXidApplication", "GpuXidUnknown"):
            op, pattern = matcher(alert)
            if (re.fullmatch(pattern, str(code)) is not None) == (op == "=~"):
                out.add(alert)
        return out

    own_alert = {79: "GpuFellOffBus"}  # raised from the GPU's state, not from the XID count
    assert all(alert in rules for alert in own_alert.values())
    for code in range(1, 200):
        xid = lookup(code)
        if xid.xid_class == "unknown":
            assert raised(code) == {"GpuXidUnknown"}, code
        else:
            expected = None if code in own_alert else alerts[xid.xid_class]
            assert raised(code) == ({expected} if expected else set()), code


def test_the_pcie_replay_rate_is_dcgms_expected_rate_on_every_link() -> None:
    """DCGM's expected replays per lane per minute: 0.48 at Gen3, doubling with each
    generation."""
    [rule] = [r for r in alerting_rules("hardware.yaml") if r["alert"] == "GpuPcieReplayRate"]
    found = re.search(
        r"_link_width \* ([\d.]+) \* 2 \^ \(gpuwatch_gpu_pcie_link_generation - (\d+)\)",
        rule["expr"],
    )
    assert found, rule["expr"]
    per_lane, offset = float(found.group(1)), int(found.group(2))
    published = {3: 0.48, 4: 0.96, 5: 1.92}
    for generation, expected in published.items():
        assert per_lane * 2 ** (generation - offset) == pytest.approx(expected), generation


def test_every_cause_a_pack_raises_is_in_the_verdicts_table() -> None:
    table = (ROOT / "docs" / "health.md").read_text()
    causes = {
        r["labels"]["cause"]
        for pack in ("hardware.yaml", "thermal-power.yaml", "training.yaml", "gpuwatch.yaml")
        for r in alerting_rules(pack)
        if "cause" in r.get("labels", {})
    }
    # What the daemon warns of when they are not loaded: these, and the host pack's causes
    # that name no port or device (the node's own).
    assert set(shipped_causes()) == {*causes, "fabric-manager-down", "preemption"}
    for cause in causes:
        assert f"`{cause}`" in table, cause
    # The host pack's causes name their port or device after the colon (the node's one
    # Fabric Manager needs no name).
    for rule in alerting_rules("host.yaml"):
        cause = rule["labels"].get("cause")  # type: ignore[union-attr]
        if cause:
            key = f"`{cause.split(':')[0]}:" if ":" in cause else f"`{cause}`"
            assert key in table, cause
