"""Two reloads at once (SIGHUP while POST /-/reload runs, both waiting for an evaluation to
end) are taken one after the other: the second sees what the first applied, so a changed
receiver list restarts the notifier's senders once, not twice on the same outbox."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import pytest

from gpuwatch.clock import ManualClock
from gpuwatch.config import load_config
from gpuwatch.notify.notifier import Notifier
from gpuwatch.serve.wiring import wire
from gpuwatch.sim.library import SimulatedNvml
from gpuwatch.sim.scenario import load_scenario

CONFIG = """node_name: n1
state_dir: {state}
rules: {{files: []}}
notify:
  receivers:
    - {{name: hooks, type: webhook, url: "http://127.0.0.1:9/{path}"}}
"""


async def overlapping_reloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    state = tmp_path / "state"
    state.mkdir()
    path = tmp_path / "gpuwatch.yaml"
    path.write_text(CONFIG.format(state=state, path="one"))
    config = load_config(path)
    clock = ManualClock()
    nvml = SimulatedNvml(load_scenario("healthy"), clock).install()
    try:
        wired = wire(config, nvml, clock, state, 10040)
        await wired.notifier.start()
        started: list[Notifier] = []
        start = Notifier.start

        async def counted(self: Notifier) -> None:
            started.append(self)
            await asyncio.sleep(0)  # a reload that yields here lets the other one in
            await start(self)

        monkeypatch.setattr(Notifier, "start", counted)
        path.write_text(CONFIG.format(state=state, path="two"))
        reload = wired.reloader.reload
        async with wired.rules.evaluating:  # both arrive while an evaluation runs
            both = asyncio.gather(reload(), reload())
            await asyncio.sleep(0)
        errors = await both
        assert errors == ["", ""]
        assert started == [wired.notifier]
        assert wired.notifier.config.receivers[0].url.reveal().endswith("/two")
        await wired.close()
        return len(started)
    finally:
        SimulatedNvml.uninstall()


def test_overlapping_reloads_restart_the_notifier_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert asyncio.run(overlapping_reloads(tmp_path, monkeypatch)) == 1


async def test_a_reload_reports_each_step_and_its_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    path = tmp_path / "gpuwatch.yaml"
    path.write_text(CONFIG.format(state=state, path="one"))
    clock = ManualClock()
    nvml = SimulatedNvml(load_scenario("healthy"), clock).install()
    try:
        wired = wire(load_config(path), nvml, clock, state, 10040)
        path.write_text(CONFIG.format(state=state, path="two"))
        with caplog.at_level(logging.INFO, "gpuwatch.serve.reload"):
            assert await wired.reloader.reload() == ""
        [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reloaded")]
        steps = [part.partition("=")[0] for part in line.partition(": ")[2].split()]
        assert steps == ["rules", "notify", "daemon", "log"], line
        assert re.fullmatch(r"reloaded \S+: (\w+=\d+\.\dms ?)+", line), line
        # A refused reload runs no step after the rules' and says none was applied.
        refused = CONFIG.format(state=state, path="three")
        path.write_text(refused.replace("{files: []}", "{files: [/nope/x.yaml]}"))
        assert await wired.reloader.reload() != ""
        assert wired.notifier.config.receivers[0].url.reveal().endswith("/two")
        await wired.close()
    finally:
        SimulatedNvml.uninstall()
