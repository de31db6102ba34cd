"""The one-shot node table (`gpuwatch status`), also drawn live by `gpuwatch demo`."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

HEALTH_STYLE = {"healthy": "green", "degraded": "yellow", "unhealthy": "bold red"}
GIB = 1024**3


def num(metrics: dict[str, Any], key: str) -> float | None:
    """A number from a GPU's `metrics` in the API's payload; None when absent or not a number."""
    value = metrics.get(key)
    return float(value) if isinstance(value, int | float) else None


def _fmt(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def render_node(node: dict[str, Any]) -> Group:
    verdict = node.get("verdict", "unknown")
    backend = node.get("backend", {})
    header = Text()
    header.append(f"{node.get('node', '?')}  ", style="bold")
    header.append(verdict.upper(), style=HEALTH_STYLE.get(verdict, ""))
    if backend.get("up"):
        gpus = node.get("gpus", [])
        models = ", ".join(sorted({g.get("model", "?") for g in gpus}))
        header.append(f"   driver {backend.get('driver_version', '?')}   {len(gpus)} x {models}")
    causes, acked = node.get("causes", []), node.get("acknowledged", [])
    lines = [f"  - {c['reason']}: {c['action']}  [{c['key']}]" for c in causes]
    lines += [f"  - acknowledged: {c['reason']}  [{c['key']}]" for c in acked]
    reasons = Text("\n".join(lines), style="dim")

    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    for column, justify in (
        ("GPU", "right"),
        ("Health", "left"),
        ("Util", "right"),
        ("Memory", "right"),
        ("Temp", "right"),
        ("Power", "right"),
        ("SM clock", "right"),
        ("Clock events", "left"),
        ("XID", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for gpu in node.get("gpus", []):
        mt = gpu.get("metrics", {})
        health = gpu.get("health", "unknown")
        status = gpu.get("status", "ok")
        util = num(mt, "utilization_ratio")
        used, total = num(mt, "memory_used_bytes"), num(mt, "memory_total_bytes")
        power, limit = num(mt, "power_watts"), num(mt, "power_limit_watts")
        clock = num(mt, "sm_clock_hertz")
        xids = ", ".join(f"{code} x{n}" for code, n in sorted(mt.get("xid_errors", {}).items()))
        table.add_row(
            str(gpu.get("index")),
            Text(
                health if status == "ok" else status,
                style=HEALTH_STYLE.get(health, ""),
            ),
            _fmt(util * 100 if util is not None else None, "{:.0f}%"),
            "-" if used is None or total is None else f"{used / GIB:.0f}/{total / GIB:.0f}G",
            _fmt(num(mt, "temperature_celsius"), "{:.0f}°C"),
            "-" if power is None else f"{power:.0f}/{_fmt(limit, '{:.0f}')}W",
            _fmt(clock / 1e6 if clock is not None else None, "{:.0f} MHz"),
            " ".join(r for r in mt.get("clock_events_active", []) if r != "gpu_idle"),
            xids,
        )
        for inst in gpu.get("mig_instances") or []:  # its MIG GPU instances, under it
            i_used, i_total = inst.get("memory_used_bytes"), inst.get("memory_total_bytes")
            pids = inst.get("pids")
            table.add_row(
                f"└ {inst.get('gpu_i_id')}",
                Text(str(inst.get("gpu_i_profile")), style="dim"),
                "",
                "-"
                if i_used is None or not i_total
                else f"{i_used / GIB:.0f}/{i_total / GIB:.0f}G",
                "",
                "",
                "",
                "" if pids is None else f"{len(pids)} proc",
                "",
            )
    parts: list[Any] = [header]
    if lines:
        parts.append(reasons)
    parts.append(table)
    return Group(*parts)
