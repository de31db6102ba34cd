"""Fixed data for the dashboard's tests: a real capture of a daemon on `--simulate
fall_off_bus`, and a NodeFeed that serves it (and variations) without any network."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from gpuwatch.tui.data import NodeSnapshot

CAPTURE = Path(__file__).parent / "fixtures" / "tui" / "fall_off_bus.json"


def captured() -> dict[str, Any]:
    return json.loads(CAPTURE.read_text())  # type: ignore[no-any-return]


def snapshot(url: str, name: str | None = None, **changes: Any) -> NodeSnapshot:
    data = copy.deepcopy(captured())
    if name is not None:
        data["node"]["node"] = name
    history = {k: list(v) for k, v in data["history"].items()}
    snap = NodeSnapshot(url, data["node"], data["alerts"], data["events"], history, fetched_at=0.0)
    for key, value in changes.items():
        object.__setattr__(snap, key, value)
    return snap


def healthy(url: str, name: str, hottest: float = 66.0) -> NodeSnapshot:
    """The captured node with GPU 1 back and nothing wrong."""
    data = copy.deepcopy(captured())
    node = data["node"]
    node["node"], node["verdict"], node["reasons"], node["causes"] = name, "healthy", [], []
    lost = node["gpus"][1]
    lost.update(status="ok", reason="", health="healthy", metrics=dict(node["gpus"][0]["metrics"]))
    for gpu in node["gpus"]:
        gpu["health"] = "healthy"
        gpu["metrics"]["temperature_celsius"] = hottest - gpu["index"]
    return NodeSnapshot(url, node, [], [], {}, fetched_at=0.0)


class FixedFeed:
    """Snapshots by URL; a URL set to an error string answers as an unreachable daemon."""

    def __init__(self, snapshots: dict[str, NodeSnapshot]) -> None:
        self.snapshots = snapshots
        self.down: dict[str, str] = {}

    async def fetch_fleet(self, urls: list[str]) -> list[NodeSnapshot]:
        return [await self.fetch(u, detail=False) for u in urls]

    async def fetch(self, url: str, detail: bool) -> NodeSnapshot:
        if url in self.down:
            return NodeSnapshot(url, error=self.down[url])
        return self.snapshots[url]
