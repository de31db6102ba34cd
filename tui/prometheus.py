"""The fleet from a Prometheus server that scrapes the daemons: a handful of queries per refresh
for the whole fleet, instead of a request per node. A node is a scrape target (`instance`);
opening it in the node view talks to the daemon itself at http://INSTANCE."""

from __future__ import annotations

import ssl
import time
from typing import Any
from urllib.parse import urlencode

from gpuwatch.tui.data import FAILURES, NODE_TIMEOUT_S, NodeSnapshot, api_data, failure_reason
from gpuwatch.tui.http import JsonClient

QUERIES = {
    # Targets that are gpuwatch daemons, including one that went down within the hour.
    "up": "up and on(instance, job) group by (instance, job) (last_over_time(gpuwatch_up[1h]))",
    "verdict": "gpuwatch_node_health == 1",
    "gpu_health": "gpuwatch_gpu_health == 1",
    "temperature": "gpuwatch_gpu_temperature_celsius",
    "utilization": "gpuwatch_gpu_utilization_ratio",
    "firing": 'gpuwatch_alerts{alertstate="firing"}',
}


class PrometheusFeed:
    def __init__(
        self, url: str, timeout: float = NODE_TIMEOUT_S, tls: ssl.SSLContext | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.client = JsonClient(timeout, tls)

    async def fetch(self, url: str, detail: bool) -> NodeSnapshot:
        """One node, from the fleet's answer (the node view goes to the daemon instead)."""
        for snap in await self.fetch_fleet([url]):
            if snap.url == url:
                return snap
        return NodeSnapshot(url, error="not among Prometheus's targets")

    async def fetch_fleet(self, urls: list[str]) -> list[NodeSnapshot]:
        now = time.time()
        got = await self.client.get_many(
            [f"{self.url}/api/v1/query?{urlencode({'query': q})}" for q in QUERIES.values()]
        )
        try:
            answers = {key: api_data(a)["result"] for key, a in zip(QUERIES, got, strict=True)}
        except FAILURES as exc:
            reason = f"Prometheus {self.url}: {failure_reason(exc)}"
            return [NodeSnapshot(u, error=reason, fetched_at=now) for u in urls]
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
        await self.client.close()
