"""What the JSON API and the landing page say of the node: its GPUs with their latest values,
the verdict with its causes, the firing alerts' names, and history downsampled for a chart."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from gpuwatch import __version__
from gpuwatch import metrics as m
from gpuwatch.rules.alerting import AlertState
from gpuwatch.rules.engine import RuleEngine
from gpuwatch.serve.readers import ReaderOptions
from gpuwatch.text.gofmt import non_finite
from gpuwatch.text.timefmt import rfc3339

GPU_PREFIX = "gpuwatch_gpu_"
MAX_HISTORY_POINTS = 11_000  # Prometheus's own limit on points per series in a range query
MAX_EVENTS = 10_000  # per /api/v1/events answer


def _number(value: float) -> float | str:
    """JSON has no NaN or Inf; Prometheus writes them as strings."""
    text = non_finite(value)
    return value if text is None else text


def sample_text(value: float) -> str:
    """A sample value as Prometheus's API writes it: a string, with NaN and Inf spelled out."""
    number = _number(value)
    return number if isinstance(number, str) else repr(number)


def _short(name: str) -> str:
    return (
        name[len(GPU_PREFIX) :] if name.startswith(GPU_PREFIX) else name.removeprefix("gpuwatch_")
    )


def gpus_payload(options: ReaderOptions) -> list[dict[str, Any]]:
    view = options.node.view
    if view.batch is None:
        return []
    per_gpu: dict[str, dict[str, Any]] = {}
    for series in options.store.latest(options.clock.now()):
        labels = series.label_dict
        uuid = labels.get("uuid")
        if not uuid or "gpu" not in labels or series.name in (m.GPU_INFO, m.GPU_HEALTH):
            continue
        values = per_gpu.setdefault(
            uuid, {"clock_events_active": [], "xid_errors": {}, "nvlink": {"links": 0, "up": 0}}
        )
        extra = set(labels) - {"gpu", "uuid"}
        value = series.last_value
        if not extra:
            values[_short(series.name)] = _number(value)
        elif series.name == m.CLOCK_EVENT and value == 1.0:
            values["clock_events_active"].append(labels["reason"])
        elif series.name == m.XID_ERRORS:
            values["xid_errors"][labels["xid"]] = int(value)
        elif series.name == m.NVLINK_LINK_UP:
            values["nvlink"]["links"] += 1
            values["nvlink"]["up"] += int(value == 1.0)
        elif series.name == m.ECC_ERRORS:
            values.setdefault("ecc_errors", {})[f"{labels['type']}_{labels['scope']}"] = int(value)
        elif series.name == m.REMAPPED_ROWS:
            values.setdefault("remapped_rows", {})[labels["type"]] = int(value)
        elif series.name == m.RECOVERY_ACTION and value == 1.0:
            values["recovery_action"] = labels["action"]
    out = []
    for gpu in view.batch.gpus:
        info = gpu.info
        verdict = view.gpu_verdicts.get(info.index)
        out.append(
            {
                "index": info.index,
                "uuid": info.uuid,
                "model": info.model,
                "pci_bus_id": info.pci_bus_id,
                "serial": info.serial,
                "vbios_version": info.vbios_version,
                "status": gpu.status.value,
                "reason": gpu.reason,
                "health": verdict.state.value if verdict else "unknown",
                "health_reasons": verdict.reasons if verdict else [],
                "health_actions": verdict.actions if verdict else [],
                "health_causes": [c.as_json() for c in verdict.causes] if verdict else [],
                "acknowledged": [c.as_json() for c in verdict.acknowledged] if verdict else [],
                "metrics": per_gpu.get(info.uuid, {}),
                "processes": [p.as_json() for p in gpu.processes],
                "jobs": gpu.jobs,
                "mig_instances": [i.as_json() for i in gpu.instances],
            }
        )
    return out


SUMMARY_METRICS = ("temperature_celsius", "utilization_ratio")


def summarize_gpus(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each GPU as a fleet row needs it: identity, health, temperature and utilization."""
    keep = ("index", "uuid", "model", "status", "reason", "health", "jobs")
    return [
        {
            **{k: g[k] for k in keep if k in g},
            "metrics": {k: g["metrics"][k] for k in SUMMARY_METRICS if k in g.get("metrics", {})},
        }
        for g in gpus
    ]


def firing_alert_names(rules: RuleEngine | None) -> list[str]:
    """What a fleet view shows per node, without fetching /api/v1/alerts too."""
    if rules is None:
        return []
    return sorted(
        {
            a.name
            for r in rules.alerting_rules()
            # a copy taken at once: the rules' worker thread may be changing it
            for a in list(r.active.values())
            if a.state == AlertState.FIRING
        }
    )


LANDING_LINKS = (
    "/metrics",
    "/healthz",
    "/api/v1/node",
    "/api/v1/gpus",
    "/api/v1/alerts",
    "/api/v1/rules",
    "/api/v1/events?since=1h",
    "/api/v1/history?metric=gpuwatch_gpu_temperature_celsius&range=10m",
)
VERDICT_COLOURS = {"healthy": "#1a7f37", "degraded": "#9a6700", "unhealthy": "#cf222e"}
# html.escape's table (quote=True), without the html package's 0.5 MiB of entity tables.
_HTML_ESCAPES = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#x27;"}
)


def _escape(text: str) -> str:
    return text.translate(_HTML_ESCAPES)


def landing_page(node: dict[str, Any]) -> str:
    """What a person opening the daemon's address sees first: the verdict, why, and what to
    do, then where the rest is. Every value is escaped: labels and reasons come from outside."""

    def items(values: list[Any]) -> str:
        return "".join(f"<li>{_escape(str(v))}</li>" for v in values)

    name, verdict = _escape(str(node["node"])), str(node["verdict"])
    colour = VERDICT_COLOURS.get(verdict, "#57606a")
    parts = [
        f"<!doctype html><html><head><title>gpuwatch on {name}: {_escape(verdict)}</title>"
        '<meta charset="utf-8"></head><body style="font-family: sans-serif">',
        f"<h1>gpuwatch {_escape(str(node['version']))} on {name}</h1>",
        f'<p style="font-size: 1.5em; color: {colour}"><b>{_escape(verdict.upper())}</b></p>',
    ]
    for title, values in (
        ("Why", node["reasons"]),
        ("What to do", node["actions"]),
        ("Alerts firing", node["firing_alerts"]),
    ):
        if values:
            parts.append(f"<h2>{title}</h2><ul>{items(values)}</ul>")
    links = "".join(f'<li><a href="{p}">{_escape(p)}</a></li>' for p in LANDING_LINKS)
    parts.append(f"<h2>Endpoints</h2><ul>{links}</ul></body></html>")
    return "".join(parts)


def node_payload(options: ReaderOptions) -> dict[str, Any]:
    node = options.node
    backend = node.backend
    verdict, problem = node.node_verdict_now()
    return {
        "node": node.config.node_name,
        "version": __version__,
        "started_at": rfc3339(node.started_at),
        "verdict": verdict.state.value if verdict else "unknown",
        "reasons": verdict.reasons if verdict else ["no sample taken yet"],
        "actions": verdict.actions if verdict else [],
        "causes": [c.as_json() for c in verdict.causes] if verdict else [],
        "firing_alerts": firing_alert_names(options.rules),
        "acknowledged": [c.as_json() for c in verdict.acknowledged] if verdict else [],
        "backend": {
            "name": backend.name,
            "up": backend.up,
            "reason": backend.reason,
            "driver_version": backend.driver_version,
            "library_version": backend.library_version,
            "missing_gpus": [asdict(g) for g in backend.missing],
        },
        "sampling": {
            "interval_seconds": node.config.sampling.interval,
            "last_sample_time": node.last_cycle_end,
            "last_duration_seconds": node.last_cycle_duration,
            "problem": problem,
        },
        "gpus": gpus_payload(options),
    }


def downsample(
    points: list[tuple[float, float]], start: float, step: float
) -> list[tuple[float, float]]:
    """The last sample in each step-wide bucket."""
    out: list[tuple[float, float]] = []
    bucket = -1
    for t, v in points:
        b = int((t - start) // step)
        if b == bucket and out:
            out[-1] = (t, v)
        else:
            out.append((t, v))
            bucket = b
    return out
