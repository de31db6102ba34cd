"""Two reloads at once (SIGHUP while POST /-/reload runs, both waiting for an evaluation to
end) are taken one after the other: the second sees what the first applied, so a changed
receiver list starts one new notifier, not two on the same outbox."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpuwatch.clock import ManualClock
from gpuwatch.config import load_config
from gpuwatch.notify.notifier import Notifier
from gpuwatch.reload import reload_daemon
from gpuwatch.runner import build_daemon, load_rules
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
        daemon = build_daemon(config, nvml, clock, state, load_rules(config, state))
        first = Notifier(config.notify, state, clock, node="n1", external_url="", interval=1.0)
        await first.start()
        daemon.notifier = first
        started: list[Notifier] = []
        start = Notifier.start

        async def counted(self: Notifier) -> None:
            started.append(self)
            await asyncio.sleep(0)  # a reload that yields here lets the other one in
            await start(self)

        monkeypatch.setattr(Notifier, "start", counted)
        path.write_text(CONFIG.format(state=state, path="two"))
        assert daemon.rules is not None
        async with daemon.rules.evaluating:  # both arrive while an evaluation runs
            both = asyncio.gather(reload_daemon(daemon), reload_daemon(daemon))
            await asyncio.sleep(0)
        errors = await both
        assert errors == ["", ""]
        assert daemon.notifier is not None and daemon.notifier in started
        for notifier in started:
            await notifier.stop()
        return len(started)
    finally:
        SimulatedNvml.uninstall()


def test_overlapping_reloads_start_one_notifier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert asyncio.run(overlapping_reloads(tmp_path, monkeypatch)) == 1
