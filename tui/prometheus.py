"""The fleet from a Prometheus server that scrapes the daemons: a handful of queries per refresh
for the whole fleet, instead of a request per node. A node is a scrape target (`instance`);
opening it in the node view talks to the daemon itself at http://INSTANCE."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
from gpuwatch.tui.data import NODE_TIMEOUT_S, NodeSnapshot

QUERIES = {
    # Targets that are gpuwatch daemons, including one that went down within the hour.
    "up": "up and on(instance, job) group by (instance, job) (last_over_time(gpuwatch_up[1h]))",
    "verdict": "gpuwatch_node_health == 1",
    "gpu_health": "gpuwatch_gpu_health == 1",
    "temperature": "gpuwatch_gpu_temperature_celsius",
    "utilization": "gpuwatch_gpu_utilization_ratio",
    "firing": 'gpuwatch_alerts{alertstate="firing"}',
}


class PrometheusSource:
    def __init__(self, url: str, timeout: float = NODE_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def _query(self, promql: str) -> list[dict[str, Any]]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        async with self._session.get(f"{self.url}/api/v1/query", params={"query": promql}) as r:
            r.raise_for_status()
            return (await r.json())["data"]["result"]  # type: ignore[no-any-return]

    async def fetch(self, url: str, detail: bool) -> NodeSnapshot:
        """One node, from the fleet's answer (the node view goes to the daemon instead)."""
        for snap in await self.fetch_fleet([url]):
            if snap.url == url:
                return snap
        return NodeSnapshot(url, error="not among Prometheus's targets")

    async def fetch_fleet(self, urls: list[str]) -> list[NodeSnapshot]:
        now = time.time()
        try:
            answers = dict(
                zip(
                    QUERIES,
                    await asyncio.gather(*(self._query(q) for q in QUERIES.values())),
                    strict=True,
                )
            )
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError) as exc:
            return [
                NodeSnapshot(
                    u, error=f"Prometheus {self.url}: {exc or type(exc).__name__}", fetched_at=now
                )
                for u in urls
            ]
        nodes: dict[str, dict[str, Any]] = {}
        down: dict[str, str] = {}

        def node(instance: str) -> dict[str, Any]:
            return nodes.setdefault(
                instance, {"node": instance, "verdict": "unknown", "gpus": {}, "firing_alerts": []}
            )

        def gpu(instance: str, index: str) -> dict[str, Any]:
            gpus: dict[str, dict[str, Any]] = node(instance)["gpus"]
            return gpus.setdefault(
                index, {"index": int(index), "health": "unknown", "status": "ok", "metrics": {}}
            )

        for r in answers["up"]:
            instance = r["metric"].get("instance", "")
            node(instance)
            if float(r["value"][1]) != 1.0:
                down[instance] = "Prometheus cannot scrape it (up == 0)"
        for r in answers["verdict"]:
            node(r["metric"]["instance"])["verdict"] = r["metric"].get("state", "unknown")
        for r in answers["gpu_health"]:
            gpu(r["metric"]["instance"], r["metric"]["gpu"])["health"] = r["metric"].get("state")
        for key, metric in (
            ("temperature", "temperature_celsius"),
            ("utilization", "utilization_ratio"),
        ):
            for r in answers[key]:
                gpu(r["metric"]["instance"], r["metric"]["gpu"])["metrics"][metric] = float(
                    r["value"][1]
                )
        for r in answers["firing"]:
            firing = node(r["metric"]["instance"])["firing_alerts"]
            if r["metric"].get("alertname") not in firing:
                firing.append(r["metric"].get("alertname"))
        out = []
        for instance, data in sorted(nodes.items()):
            data["gpus"] = [data["gpus"][k] for k in sorted(data["gpus"], key=int)]
            data["firing_alerts"].sort()
            out.append(
                NodeSnapshot(
                    f"http://{instance}", node=data, error=down.get(instance, ""), fetched_at=now
                )
            )
        return out

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
