"""A threshold is written once, in the rule pack: the alert and the node's verdict both follow
it, so an operator who changes the rule changes both."""

from __future__ import annotations

import logging
from pathlib import Path

import pynvml
import pytest

from gpuwatch.clock import ManualClock
from gpuwatch.health.verdict import Health
from gpuwatch.serve.wiring import Wired, wire
from gpuwatch.sim.scenario import load_scenario
from tests.conftest import Simulate, node_config, sampled

PACK = Path(__file__).resolve().parents[2] / "rules" / "hardware.yaml"
LIMIT = "sum without (cause) (gpuwatch_gpu_retired_pages) >= 63"


def firing(wired: Wired) -> set[tuple[str, str]]:
    return {
        (a.name, dict(a.labels).get("gpu", ""))
        for r in wired.rules.alerting_rules()
        for a in r.active.values()
        if a.state.value == "firing"
    }


async def run_retired_pages(
    tmp_path: Path, simulate: Simulate, limit: int
) -> tuple[set[tuple[str, str]], Wired]:
    """GPU 1 retires its 63rd page at 10 s; the pack's limit is `limit` pages."""
    text = PACK.read_text()
    assert LIMIT in text
    pack = tmp_path / "hardware.yaml"
    pack.write_text(text.replace(LIMIT, LIMIT.replace("63", str(limit))))
    config, state = node_config(tmp_path, f"rules: {{files: [{pack}]}}\n")
    wired = await sampled(simulate, "retired_pages", config, state, 16)
    alerts = firing(wired)
    await wired.daemon.source.stop()
    await wired.close()
    return alerts, wired


@pytest.mark.parametrize(("limit", "fires"), [(63, True), (64, False), (40, True)])
async def test_the_pack_limit_decides_the_alert_and_the_verdict(
    tmp_path: Path, simulate: Simulate, limit: int, fires: bool
) -> None:
    alerts, wired = await run_retired_pages(tmp_path, simulate, limit)
    verdict = wired.daemon.view.gpu_verdicts[1]
    keys = {c.key for c in verdict.causes}
    assert (("GpuRetiredPagesHigh", "1") in alerts) == fires
    assert ("retired-pages" in keys) == fires
    if fires:
        [cause] = [c for c in verdict.causes if c.key == "retired-pages"]
        assert cause.state == Health.UNHEALTHY
        assert cause.reason == "GPU 1 has retired 63 memory pages"
        assert cause.action == "take the GPU out of service and RMA it"  # the verdict's style
        assert cause.fingerprint == "63"  # one more page is news after an acknowledgement


async def test_the_verdict_of_a_cycle_judges_that_cycles_alerts(
    tmp_path: Path, simulate: Simulate
) -> None:
    """Every cycle, the cause is in the verdict exactly while its alert fires: the verdict is
    judged after the rules, never on the evaluation before."""
    config, state = node_config(tmp_path)
    clock = ManualClock()
    simulate(load_scenario("retired_pages"), clock)
    wired = wire(config, pynvml, clock, state, 10040)
    await wired.daemon.source.start()
    seen = []
    for cycle in range(16):
        clock.advance(1.0 if cycle else 0.0)
        await wired.daemon.sample_once()
        fires = ("GpuRetiredPagesHigh", "1") in firing(wired)
        judged = "retired-pages" in {c.key for c in wired.daemon.view.gpu_verdicts[1].causes}
        assert fires == judged, cycle
        seen.append(fires)
    assert seen[0] is False and seen[-1] is True  # it began to fire within the run
    await wired.daemon.source.stop()
    await wired.close()


async def test_an_acknowledged_alert_cause_holds_across_a_restart(
    tmp_path: Path, simulate: Simulate
) -> None:
    """The rules' saved alert state raises its causes in the first cycle after a restart, so
    the acknowledgement is not dropped as if its cause had cleared."""
    config, state = node_config(tmp_path)
    clock = ManualClock()
    simulate(load_scenario("retired_pages"), clock)
    for run in range(2):
        wired = wire(config, pynvml, clock, state, 10040)
        daemon = wired.daemon
        await daemon.start(ticks=False)
        for _ in range(3 if run else 15):
            clock.advance(1.0)
            await daemon.sample_once()
        verdict = daemon.view.gpu_verdicts[1]
        if run == 0:
            assert "retired-pages" in {c.key for c in verdict.causes}
            daemon.acknowledge("1", "retired-pages", "RMA filed")
        else:
            assert "retired-pages" in {c.key for c in verdict.acknowledged}
            assert "retired-pages" not in {c.key for c in verdict.causes}
        await daemon.stop()
        await wired.close()


async def test_an_alert_cause_naming_no_gpu_is_the_nodes_and_can_be_acknowledged(
    tmp_path: Path, simulate: Simulate
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(
        "groups:\n  - name: site\n    rules:\n      - alert: FacilityPower\n"
        "        expr: vector(1)\n        labels: {severity: critical, cause: facility-power}\n"
        "        annotations: {summary: 'The rack has lost a feed', action: 'Call facilities.'}\n"
    )
    config, state = node_config(tmp_path, f"rules: {{files: [{site}]}}\n")
    wired = await sampled(simulate, "healthy", config, state, 2)
    daemon = wired.daemon
    node = daemon.view.node_verdict
    assert node is not None and node.state == Health.UNHEALTHY
    assert node.reasons == ["The rack has lost a feed"]
    daemon.acknowledge("node", "facility-power", "feed B is being fixed")
    await daemon.sample_once()
    node = daemon.view.node_verdict
    assert node is not None and node.state == Health.HEALTHY
    await daemon.source.stop()
    await wired.close()


@pytest.mark.parametrize("files", ["[]", None])
async def test_rules_without_the_hardware_pack_are_said_to_leave_causes_unjudged(
    tmp_path: Path, simulate: Simulate, caplog: pytest.LogCaptureFixture, files: str | None
) -> None:
    config, state = node_config(tmp_path, f"rules: {{files: {files}}}\n" if files else "")
    clock = ManualClock()
    simulate(load_scenario("healthy"), clock)
    with caplog.at_level(logging.WARNING, "gpuwatch.serve.runner"):
        wired = wire(config, pynvml, clock, state, 10040)
    await wired.close()
    warned = [r.getMessage() for r in caplog.records if "verdict's causes" in r.getMessage()]
    if files:
        assert warned == [
            "no loaded rule raises the verdict's causes driver-unresponsive, fabric-degraded, "
            "fabric-manager-down, fabric-not-registered, fabric-registration-failed, "
            "fabric-unhealthy, gpu-unresponsive, nvlink-crc, nvlink-replay, pcie-downtrained, "
            "pcie-replays, preemption, remapped-rows, retired-pages, straggler, "
            "thermal-slowdown (a `cause` label), so the verdict does not judge them: list the "
            "shipped hardware and thermal packs in rules.files (docs/rules.md)"
        ]
    else:
        assert warned == []  # the shipped packs raise every one
