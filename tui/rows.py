"""Snapshots into table cells: bars with threshold colours, fixed-scale sparklines, verdicts.
Pure functions, so the views and their tests share them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text

from gpuwatch.clients.status import GIB, HEALTH_STYLE, num
from gpuwatch.text.units import ascii_int
from gpuwatch.xid.known import lookup

SPARKS = " ▁▂▃▄▅▆▇█"


LOAD_STYLE = "cyan"  # how busy or full a GPU is: a training GPU at 99% is doing its job


def bar(fraction: float | None, width: int = 10) -> Text:
    """A bar for 0..1 in one calm colour. Load is not a fault: a busy GPU, full memory or power
    near its limit are what a training node looks like, so red and yellow are kept for the
    verdict, lost GPUs, heat and XIDs, which then stand out."""
    if fraction is None:
        return Text("-" * width, style="dim")
    f = max(0.0, min(1.0, fraction))
    filled = round(f * width)
    return Text("█" * filled, style=LOAD_STYLE) + Text("░" * (width - filled), style="dim")


XID_STYLE = {"critical": "bold red", "driver": "bold red", "warning": "yellow", "unknown": "yellow"}


def xid_text(counts: dict[str, int]) -> Text:
    """A GPU's XIDs, each in its class's colour: a fatal one red, a warning (or one the catalog
    does not know) yellow, an application's own fault (13, 31, 43) or cleanup (45) plain."""
    out = Text()
    numbered = {code: ascii_int(code) for code in counts}  # a label: text, whatever it says
    for i, code in enumerate(sorted(counts, key=lambda c: (numbered[c] is None, numbered[c] or 0))):
        number = numbered[code]
        xid_class = lookup(number).xid_class if number is not None else "unknown"
        out.append(", " if i else "")
        out.append(f"{code} x{counts[code]}", style=XID_STYLE.get(xid_class, ""))
    return out


def sparkline(values: list[float], width: int = 20) -> str:
    """Utilization history on a fixed 0..1 scale: a GPU pinned at 95% draws high, not flat."""
    tail = values[-width:]
    return "".join(SPARKS[round(max(0.0, min(1.0, v)) * (len(SPARKS) - 1))] for v in tail).rjust(
        width
    )


def health(state: str) -> Text:
    return Text(
        state.upper() if state == "unhealthy" else state, style=HEALTH_STYLE.get(state, "dim")
    )


GPU_COLUMNS = (
    "GPU",
    "Model",
    "Health",
    "Util",
    "Util 10m",
    "Memory",
    "Temp",
    "Power",
    "Clock events",
    "ECC/XID",
)


# The shipped thermal pack's alerts on a GPU's own temperature, and the cause its slowdown alert
# raises: the dashboard colours a temperature only when they say so, at their thresholds.
HEAT_ALERT_PREFIX = "GpuTemperature"
HEAT_CAUSE = "thermal-slowdown"


def heat_style(gpu: dict[str, Any], alerts: Sequence[dict[str, Any]]) -> str:
    """Red when the verdict holds the GPU in thermal slowdown or a critical temperature alert
    fires for it, yellow for a warning one; plain otherwise, however hot the number reads."""
    if any(c.get("key") == HEAT_CAUSE for c in gpu.get("health_causes", [])):
        return "red"
    severities = {
        a["labels"].get("severity", "")
        for a in alerts
        if a.get("state") == "firing"
        and a["labels"].get("uuid") == gpu.get("uuid")
        and a["labels"].get("alertname", "").startswith(HEAT_ALERT_PREFIX)
    }
    if "critical" in severities:
        return "red"
    return "yellow" if severities else ""


def gpu_cells(
    gpu: dict[str, Any], history: list[float], alerts: Sequence[dict[str, Any]] = ()
) -> tuple[Text | str, ...]:
    """A GPU's row; `alerts` are its node's (firing and pending), which colour its heat."""
    mt = gpu.get("metrics", {})
    status = gpu.get("status", "ok")
    model = str(gpu.get("model", "")).replace("NVIDIA ", "")
    if status != "ok":  # lost or unresponsive: unmistakable, whatever its last numbers were
        loud = Text(f" {status.upper()} ", style="bold white on red")
        why = Text(str(gpu.get("reason", "")), style="bold red")
        return (str(gpu.get("index")), model, health("unhealthy"), loud, "", "", "", "", why, "")
    util = num(mt, "utilization_ratio")
    used, total = num(mt, "memory_used_bytes"), num(mt, "memory_total_bytes")
    power, limit = num(mt, "power_watts"), num(mt, "power_limit_watts")
    temp = num(mt, "temperature_celsius")
    memory = bar(used / total if used is not None and total else None, 8) + Text(
        f" {used / GIB:.0f}/{total / GIB:.0f}G" if used is not None and total else ""
    )
    if power is not None and limit:
        watts = bar(power / limit, 8) + Text(f" {power:.0f}/{limit:.0f}W")
    else:  # no limit known (dcgm-exporter's default fields have none): the watts alone
        watts = Text("-" if power is None else f"{power:.0f}W")
    temp_text = Text("-" if temp is None else f"{temp:.0f}°C", style=heat_style(gpu, alerts))
    xids = mt.get("xid_errors", {})
    dbe = mt.get("ecc_errors", {}).get("uncorrected_volatile", 0)
    faults = Text(f"DBE {dbe}", style="bold red") if dbe else Text()
    if xids:
        faults += Text(" XID " if dbe else "XID ") + xid_text(xids)
    events = " ".join(r for r in mt.get("clock_events_active", []) if r != "gpu_idle")
    return (
        str(gpu.get("index")),
        model,
        health(gpu.get("health", "unknown")),
        bar(util, 8) + Text("" if util is None else f" {util * 100:3.0f}%"),
        sparkline(history, 16),
        memory,
        temp_text,
        watts,
        events,
        faults,
    )


def mig_rows(gpu: dict[str, Any]) -> dict[str, tuple[Text | str, ...]]:
    """A row under a GPU in MIG mode for each GPU instance: its profile, memory and
    processes, keyed `GPU/gi<id>`. Utilization, temperature and power are the parent's."""
    rows: dict[str, tuple[Text | str, ...]] = {}
    for inst in gpu.get("mig_instances") or []:
        used, total = inst.get("memory_used_bytes"), inst.get("memory_total_bytes")
        memory = Text("-", style="dim")
        if isinstance(used, int | float) and isinstance(total, int | float) and total:
            memory = bar(used / total, 8) + Text(f" {used / GIB:.0f}/{total / GIB:.0f}G")
        pids = inst.get("pids")
        procs = "-" if pids is None else f"{len(pids)} proc" + ("" if len(pids) == 1 else "s")
        key = f"{gpu.get('index')}/gi{inst.get('gpu_i_id')}"
        rows[key] = (f"  └ {inst.get('gpu_i_id')}", Text(f"MIG {inst.get('gpu_i_profile')}",
                     style="dim"), "", "", "", memory, "", "", procs, "")  # fmt: skip
    return rows


FLEET_COLUMNS = ("Node", "Verdict", "GPUs ok", "Hottest", "Busiest", "Firing", "Why")


def fleet_cells(
    node: dict[str, Any], alerts: list[dict[str, Any]], error: str
) -> tuple[Text | str, ...]:
    gpus = node.get("gpus", [])
    # One pass, no intermediate lists: this runs for every node on every fleet refresh.
    healthy = 0
    hot: tuple[float, Any] | None = None  # (°C, GPU index); on a tie, the higher index
    busy: tuple[float, Any] | None = None
    for g in gpus:
        if g.get("health") == "healthy":
            healthy += 1
        metrics = g.get("metrics") or {}
        temp, util = metrics.get("temperature_celsius"), metrics.get("utilization_ratio")
        if isinstance(temp, int | float) and (hot is None or temp >= hot[0]):
            hot = (temp, g.get("index"))
        if isinstance(util, int | float) and (busy is None or util >= busy[0]):
            busy = (util, g.get("index"))
    firing = node.get("firing_alerts") or sorted(
        {a["labels"].get("alertname", "") for a in alerts if a.get("state") == "firing"}
    )
    reasons = node.get("reasons", [])
    cells: tuple[Text | str, ...] = (
        str(node.get("node", "")),
        health(str(node.get("verdict", "unknown"))),
        f"{healthy}/{len(gpus)}",
        "-" if hot is None else f"{hot[0]:.0f}°C (GPU {hot[1]})",
        "-" if busy is None else f"{busy[0] * 100:.0f}% (GPU {busy[1]})",
        Text(", ".join(firing), style="red" if firing else ""),
        reasons[0] if reasons else "",
    )
    if not error:
        return cells
    dimmed = tuple(Text(c.plain if isinstance(c, Text) else c, style="dim") for c in cells)
    return (
        dimmed[0],
        Text("UNREACHABLE", style="bold white on red"),
        *dimmed[2:6],
        Text(error, style="red"),
    )


PROCESS_COLUMNS = ("GPU", "PID", "Process", "User", "GPU mem", "Job")
ALERT_COLUMNS = ("Severity", "Alert", "GPU", "Since", "Action")
EVENT_COLUMNS = ("Time", "Kind", "GPU", "What")


def process_cells(p: dict[str, Any], gpu: str) -> tuple[str, ...]:
    """A process of `gpu` (its index, or `index/instance` for a MIG instance's)."""
    memory = p.get("gpu_memory_bytes")
    return (
        gpu,
        str(p["pid"]) if p["pid"] else "-",  # 0: a pod named by dcgm-exporter, no process
        p["name"],
        p["user"],
        "-" if memory is None else f"{memory / GIB:.1f}G",
        p.get("job", ""),
    )


SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def by_severity(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Critical first, then warning, info and the rest; firing before pending; oldest first."""
    return sorted(
        alerts,
        key=lambda a: (
            SEVERITY_ORDER.get(a["labels"].get("severity", ""), len(SEVERITY_ORDER)),
            a.get("state") != "firing",
            str(a.get("activeAt", "")),
        ),
    )


def alert_text(a: dict[str, Any]) -> Text:
    """An alert whole, for the pane that opens on Enter: the table cuts the action short."""
    labels, annotations = a["labels"], a.get("annotations", {})
    out = Text()
    out.append(f"{labels.get('alertname', '')}", style="bold")
    out.append(f"  {a.get('state', '')} since {a.get('activeAt', '')}\n\n")
    for key in ("summary", "description", "action"):
        if annotations.get(key):
            out.append(f"{key}: ", style="bold")
            out.append(f"{annotations[key]}\n\n")
    out.append("labels: ", style="bold")
    out.append(", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
    return out


def alert_cells(a: dict[str, Any]) -> tuple[Text | str, ...]:
    labels = a["labels"]
    severity = labels.get("severity", "")
    pending = "" if a.get("state") == "firing" else " (pending)"
    return (
        Text(severity, style="red" if severity == "critical" else "yellow"),
        labels.get("alertname", "") + pending,
        labels.get("gpu", ""),
        str(a.get("activeAt", ""))[11:19],
        a.get("annotations", {}).get("action", ""),
    )


def event_cells(e: dict[str, Any]) -> tuple[str, ...]:
    return (
        e["time"][11:23],
        e["kind"],
        "" if e.get("gpu") is None else str(e["gpu"]),
        e["message"],
    )
