"""A job's report as the few lines a person reads at the end of the job's output, from the
report's JSON: apart from the daemon's side of reports, so that `gpuwatch job-report`, run as
a job ends, imports only this."""

from __future__ import annotations

from typing import Any

from gpuwatch.text.jobs import JOB_NOUNS

GIB = 1024**3


def text(report: dict[str, Any]) -> str:
    """A few lines a person reads at the end of the job's output."""
    start, end = report["start"], report["end"]
    span = f"{start} to {end}" if end else f"since {start}, still running"
    noun = JOB_NOUNS.get(report["job_kind"], f"{report['job_kind']} job")
    lines = [
        f"gpuwatch: {noun} {report['job_id']} of {report['user']}, "
        f"{span}, on {len(report['gpus'])} GPUs"
    ]
    for advice in report.get("checkpoint_advice", []):
        after = advice.get("checkpoint_after")
        told = f"checkpointed at {after}" if after else "no checkpoint reported after"
        lines.append(f"  at {advice['time']}: {advice['message']} ({told})")
    for gpu in report["gpus"]:
        said = [f"XID {x['xid']} at {x['time']}" for x in gpu["xids"]]
        said += [f"{a['alertname']} at {a['time']}" for a in gpu["alerts"]]
        said += [f"{k} +{v:g}" for k, v in gpu["counter_changes"].items()]
        said += [f"clocks held by {k} {v:g}s" for k, v in gpu["throttled_seconds"].items()]
        said += [e["message"] for e in gpu["events"]]
        figures = ", ".join(_figures(gpu))
        lines.append(
            f"  GPU {gpu['index']}: {'; '.join(said) if said else 'nothing wrong'}"
            + (f" ({figures})" if figures else "")
        )
    return "\n".join(lines)


def _figures(gpu: dict[str, Any]) -> list[str]:
    """What a GPU's memory and utilization say, in a few words for the job's output."""
    out = []
    peak, total = gpu.get("memory_peak_bytes"), gpu.get("memory_total_bytes")
    if peak is not None and total:
        out.append(f"memory peak {peak / GIB:.1f} of {total / GIB:.1f} GiB ({peak / total:.0%})")
    mean, starved = gpu.get("utilization_mean"), gpu.get("starved_share")
    if mean is not None:
        busy = f"busy {mean:.0%} on average"
        if starved:
            busy += f", under half the time for {starved:.0%} of the run"
        out.append(busy)
    for link, name in (("nvlink_bytes_per_second", "NVLink"), ("pcie_bytes_per_second", "PCIe")):
        rates = gpu.get(link) or {}
        moved = [
            f"{rates[d] / 1e9:.1f} {w}" for d, w in (("tx", "out"), ("rx", "in")) if d in rates
        ]
        if moved:
            out.append(f"{name} GB/s {', '.join(moved)}")
    return out
