"""A job's report: per GPU, its XIDs, ECC and row-remap changes, throttled seconds by reason, its
peak memory, utilization and link traffic, and the alerts of its time on the GPU; when the job
was told to checkpoint and whether it said it did; as JSON (into `state_dir/reports/`, and from
the API) and as a few lines for the job's output."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from gpuwatch.model import Event
from gpuwatch.reports.tracker import GpuRecord, JobRecord
from gpuwatch.state.atomicfile import write_json
from gpuwatch.text.timefmt import rfc3339

log = logging.getLogger(__name__)

REPORTS_DIR = "reports"
MAX_REPORT_FILES = 1000  # the oldest go first
UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _gpu(entry: GpuRecord) -> dict[str, Any]:
    changes = {
        k: entry.last[k] - v for k, v in sorted(entry.first.items()) if entry.last.get(k, v) != v
    }
    xids, alerts, other = [], [], []
    for e in entry.events:
        at = rfc3339(e.time)
        if e.kind == "xid":
            xids.append({"time": at, "xid": e.data.get("xid"), "message": e.message})
        elif e.kind == "alert":
            name, severity = e.data.get("alertname", ""), e.data.get("severity", "")
            alerts.append(
                {"time": at, "alertname": name, "severity": severity, "message": e.message}
            )
        else:
            other.append({"time": at, "kind": e.kind, "message": e.message})
    return {
        "index": entry.index,
        "uuid": entry.uuid,
        "memory_peak_bytes": entry.memory_peak,
        "memory_total_bytes": entry.memory_total,
        # Means over the time the job was on the GPU; None before a second cycle counted it.
        "utilization_mean": _share(entry.busy_seconds, entry.seconds),
        "starved_share": _share(entry.starved_seconds, entry.seconds),
        "nvlink_bytes_per_second": _rates(entry, "nvlink"),
        "pcie_bytes_per_second": {
            direction: round(entry.pcie_bytes[direction] / seconds)
            for direction, seconds in sorted(entry.pcie_seconds.items())
            if seconds > 0
        },
        "xids": xids,
        "alerts": alerts,
        "events": other,
        "counter_changes": changes,
        "throttled_seconds": {k: round(v, 1) for k, v in sorted(entry.throttled.items())},
        "events_dropped": entry.dropped,
    }


def _share(part: float, whole: float) -> float | None:
    return round(part / whole, 3) if whole > 0 else None


def _rates(entry: GpuRecord, link: str) -> dict[str, float]:
    """Mean bytes a second by direction over the job's time on the GPU, summed over links; a
    counter is left out before it was read twice, or where it went back (a driver reload)."""
    out: dict[str, float] = {}
    for key, (start, first) in entry.traffic_first.items():
        kind, direction, _ = key
        end, last = entry.traffic_last[key]
        if kind == link and end > start and last >= first:
            out[direction] = out.get(direction, 0.0) + (last - first) / (end - start)
    return {direction: round(rate) for direction, rate in sorted(out.items())}


def _advice(event: Event, after: float | None) -> dict[str, Any]:
    """When the job was told, and the first checkpoint it said it wrote after (None: none)."""
    return {
        "time": rfc3339(event.time),
        "message": event.message,
        "checkpoint_after": rfc3339(after) if after is not None else None,
    }


def build(record: JobRecord, now: float) -> dict[str, Any]:
    return {
        "job_kind": record.kind,
        "job_id": record.job_id,
        "user": record.user,
        "start": rfc3339(record.start),
        "end": rfc3339(record.last_seen) if record.ended else None,
        "running": not record.ended,
        "reported_at": rfc3339(now),
        "checkpoint_advice": [
            _advice(event, after)
            for event, after in zip(record.advised, record.checkpoint_after, strict=True)
        ],
        "gpus": [_gpu(g) for g in sorted(record.gpus.values(), key=lambda g: g.index)],
    }


def write(state_dir: Path, report: dict[str, Any]) -> Path | None:
    """The report as `reports/<kind>-<id>-<start>.json`; None when it could not be written
    (logged: a full disk must not cost the daemon more than the report)."""
    directory = state_dir / REPORTS_DIR
    name = UNSAFE.sub("_", f"{report['job_kind']}-{report['job_id']}-{report['start']}") + ".json"
    try:
        directory.mkdir(mode=0o750, exist_ok=True)
        path = directory / name
        write_json(path, report)
        for old in sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime)[
            :-MAX_REPORT_FILES
        ]:
            old.unlink(missing_ok=True)
    except OSError as exc:
        log.error("job report %s: cannot write it: %s", name, exc)
        return None
    return path
