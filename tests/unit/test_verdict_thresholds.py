"""A threshold is written once, in the rule pack: the alert and the node's verdict both follow
it, so an operator who changes the rule changes both."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpuwatch.clock import ManualClock
from gpuwatch.config import load_config
from gpuwatch.health.verdict import Health
from gpuwatch.serve.runner import Wired, wire
from gpuwatch.sim.library import SimulatedNvml
from gpuwatch.sim.scenario import load_scenario

PACK = Path(__file__).resolve().parents[2] / "rules" / "hardware.yaml"
LIMIT = "sum without (cause) (gpuwatch_gpu_retired_pages) >= 63"


def firing(wired: Wired) -> set[tuple[str, str]]:
    return {
        (a.name, dict(a.labels).get("gpu", ""))
        for r in wired.rules.alerting_rules()
        for a in r.active.values()
        if a.state.value == "firing"
    }


async def run_retired_pages(tmp_path: Path, limit: int) -> tuple[set[tuple[str, str]], Wired]:
    """GPU 1 retires its 63rd page at 10 s; the pack's limit is `limit` pages."""
    text = PACK.read_text()
    assert LIMIT in text
    pack = tmp_path / "hardware.yaml"
    pack.write_text(text.replace(LIMIT, LIMIT.replace("63", str(limit))))
    state = tmp_path / "state"
    state.mkdir()
    config_path = tmp_path / "gpuwatch.yaml"
    config_path.write_text(f"node_name: n1\nstate_dir: {state}\nrules: {{files: [{pack}]}}\n")
    config = load_config(config_path)
    clock = ManualClock()
    nvml = SimulatedNvml(load_scenario("retired_pages"), clock).install()
    try:
        wired = wire(config, nvml, clock, state, 10040)
        daemon = wired.daemon
        await daemon.source.start()
        for _ in range(15):
            await daemon.sample_once()
            clock.advance(1.0)
        await daemon.sample_once()  # a cause an alert raises shows in the next cycle
        alerts = firing(wired)
        await daemon.source.stop()
        wired.journal.close()
        await wired.notifier.stop()
        return alerts, wired
    finally:
        SimulatedNvml.uninstall()


@pytest.mark.parametrize(("limit", "fires"), [(63, True), (64, False), (40, True)])
async def test_the_pack_limit_decides_the_alert_and_the_verdict(
    tmp_path: Path, limit: int, fires: bool
) -> None:
    alerts, wired = await run_retired_pages(tmp_path, limit)
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


async def test_an_acknowledged_alert_cause_holds_across_a_restart(tmp_path: Path) -> None:
    """The rules' saved alert state raises its causes in the first cycle after a restart, so
    the acknowledgement is not dropped as if its cause had cleared."""
    state = tmp_path / "state"
    state.mkdir()
    config_path = tmp_path / "gpuwatch.yaml"
    config_path.write_text(f"node_name: n1\nstate_dir: {state}\n")
    config = load_config(config_path)
    clock = ManualClock()
    nvml = SimulatedNvml(load_scenario("retired_pages"), clock).install()
    try:
        for run in range(2):
            wired = wire(config, nvml, clock, state, 10040)
            daemon = wired.daemon
            await daemon.start()
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
            await wired.notifier.stop()
            wired.journal.close()
    finally:
        SimulatedNvml.uninstall()


async def test_an_alert_cause_naming_no_gpu_is_the_nodes_and_can_be_acknowledged(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(
        "groups:\n  - name: site\n    rules:\n      - alert: FacilityPower\n"
        "        expr: vector(1)\n        labels: {severity: critical, cause: facility-power}\n"
        "        annotations: {summary: 'The rack has lost a feed', action: 'Call facilities.'}\n"
    )
    state = tmp_path / "state"
    state.mkdir()
    config_path = tmp_path / "gpuwatch.yaml"
    config_path.write_text(f"node_name: n1\nstate_dir: {state}\nrules: {{files: [{site}]}}\n")
    clock = ManualClock()
    nvml = SimulatedNvml(load_scenario("healthy"), clock).install()
    try:
        wired = wire(load_config(config_path), nvml, clock, state, 10040)
        daemon = wired.daemon
        await daemon.source.start()
        for _ in range(2):
            await daemon.sample_once()
            clock.advance(1.0)
        node = daemon.view.node_verdict
        assert node is not None and node.state == Health.UNHEALTHY
        assert node.reasons == ["The rack has lost a feed"]
        daemon.acknowledge("node", "facility-power", "feed B is being fixed")
        await daemon.sample_once()
        node = daemon.view.node_verdict
        assert node is not None and node.state == Health.HEALTHY
        await daemon.source.stop()
        await wired.notifier.stop()
        wired.journal.close()
    finally:
        SimulatedNvml.uninstall()


@pytest.mark.parametrize("files", ["[]", None])
def test_rules_without_the_hardware_pack_are_said_to_leave_causes_unjudged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, files: str | None
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    config_path = tmp_path / "gpuwatch.yaml"
    rules = f"rules: {{files: {files}}}\n" if files else ""
    config_path.write_text(f"node_name: n1\nstate_dir: {state}\n{rules}")
    clock = ManualClock()
    nvml = SimulatedNvml(load_scenario("healthy"), clock).install()
    try:
        with caplog.at_level(logging.WARNING, "gpuwatch.serve.reload"):
            wired = wire(load_config(config_path), nvml, clock, state, 10040)
        wired.journal.close()
    finally:
        SimulatedNvml.uninstall()
    warned = [r.getMessage() for r in caplog.records if "verdict's causes" in r.getMessage()]
    if files:
        assert warned == [
            "no loaded rule raises the verdict's causes gpu-unresponsive, nvlink-crc, "
            "nvlink-replay, pcie-replays, remapped-rows, retired-pages (a `cause` label), so the "
            "verdict does not judge them: list the shipped hardware pack in rules.files "
            "(docs/rules.md)"
        ]
    else:
        assert warned == []  # the shipped packs raise every one
