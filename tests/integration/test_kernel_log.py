"""The kernel log beside NVML, in real time: an XID the driver prints while NVML hangs raises
its alert within a second, an XID both report counts once, and a restarted daemon takes no
record twice."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pynvml

from gpuwatch.clock import ManualClock
from gpuwatch.serve.wiring import wire
from gpuwatch.sim.scenario import load_scenario
from tests.conftest import DaemonProcess, Simulate, node_config, parse_metrics, wait_for

HANG_AND_XID = """\
name: hang-and-xid
node: {gpus: 4, model: H100, workload: training, seed: 1}
faults:
  - {kind: nvml_hang, gpu: 1, at: 3s, duration: 8s}
  - {kind: xid, gpu: 1, at: 6s, code: 48}
  - {kind: xid, gpu: 2, at: 5s, code: 13}
"""


def seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def xid_counts(daemon: DaemonProcess) -> dict[tuple[str, str], float]:
    found = parse_metrics(daemon.metrics()).get("gpuwatch_gpu_xid_errors_total", [])
    return {(labels["gpu"], labels["xid"]): value for labels, value in found}


def test_an_xid_printed_while_nvml_hangs_alerts_within_a_second(
    tmp_path: Path, run_daemon: Any
) -> None:
    scenario = tmp_path / "hang-and-xid.yaml"
    scenario.write_text(HANG_AND_XID)
    daemon = run_daemon("--simulate", str(scenario))

    def critical() -> list[dict[str, object]]:
        alerts = daemon.json("/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "GpuXidCritical"]

    [alert] = wait_for(critical, timeout=20)
    assert alert["labels"]["gpu"] == "1" and alert["labels"]["xid"] == "48"
    events = daemon.json("/api/v1/events?since=1h")["data"]["events"]
    [xid] = [e for e in events if e["kind"] == "xid" and e.get("xid") == 48]
    assert xid["source"] == "kernel_log" and xid["gpu"] == 1
    assert xid["driver_text"].startswith("NVRM: Xid (PCI:0000:2a:00): 48, ")
    # The simulated kernel numbers its records by the millisecond it printed them; the reader
    # numbers a file's records by line: the event's number is the XID's line in the log.
    host = re.search(r"simulated host \(.*\) under (\S+?)\"", daemon.log())
    assert host is not None
    log_lines = (Path(host.group(1)) / "kmsg").read_text().splitlines()
    printed = int(log_lines[int(xid["kmsg_seq"]) - 1].split(",")[1]) / 1000
    latency = seconds(str(alert["activeAt"])) - printed
    assert 0 <= latency < 1.0, latency
    timeouts = parse_metrics(daemon.metrics())["gpuwatch_nvml_timeouts_total"]
    assert [v for labels, v in timeouts if labels.get("gpu") == "1"] >= [1.0]  # NVML hung

    # After the hang NVML hands out the XID too, and GPU 2's came through both at once: each
    # counts once.
    wait_for(lambda: xid_counts(daemon).get(("2", "13")) == 1, timeout=10)
    time.sleep(max(0.0, printed + 6.0 - time.time()))  # the hang ends 5 s after the XID
    wait_for(lambda: daemon.json("/api/v1/gpus")["data"][1]["status"] == "ok", timeout=10)
    assert xid_counts(daemon)[("1", "48")] == 1
    assert xid_counts(daemon)[("2", "13")] == 1
    # Whichever source told first, the journal has one XID event each, and the driver's text.
    events = daemon.json("/api/v1/events?since=1h")["data"]["events"]
    for code in (13, 48):
        about = [e for e in events if e.get("xid") == code]
        assert [e["kind"] for e in about].count("xid") == 1, about
        assert {e["kind"] for e in about} <= {"xid", "kernel_log"}, about
        assert any(str(e.get("driver_text", "")).startswith("NVRM: Xid") for e in about)


FALLEN = [
    "6,501,7000000,-;NVRM: GPU at PCI:0000:2a:00: GPU-8f1c2d3e-0000-1111-2222-333344445555",
    "4,502,9000000,-;NVRM: Xid (PCI:0000:2a:00): 79, pid=0, GPU has fallen off the bus.",
    "3,503,9000100,-;NVRM: GPU 0000:2a:00.0: GPU has fallen off the bus.",
]


async def test_a_restarted_daemon_takes_no_record_twice(tmp_path: Path, simulate: Simulate) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("\n".join(FALLEN[:2]) + "\n")
    config, state = node_config(tmp_path, f"sources: {{kmsg: {{path: {kmsg}}}}}\n")
    clock = ManualClock()
    simulate(load_scenario("healthy"), clock)
    counts = []
    for run in range(2):
        if run == 1:
            # One more, printed while it was down. Appended, as the kernel's log grows: a
            # rewrite in place could be read half-done, as a truncation, from its start again.
            with kmsg.open("a") as log:
                log.write(FALLEN[2] + "\n")
        wired = wire(config, pynvml, clock, state, 10040)
        daemon = wired.daemon
        await daemon.start()
        for _ in range(200):  # the kernel log's thread takes what it reads
            if any(e.kind == "gpu_lost" for e in daemon.events.recent) or (
                run == 0 and any(e.kind == "xid" for e in daemon.events.recent)
            ):
                break
            await asyncio.sleep(0.01)
        clock.advance(1.0)
        await daemon.sample_once()
        counts.append(
            [
                s.value
                for s in daemon.xids.samples(daemon.view.batch.gpus if daemon.view.batch else [])
            ]
        )
        kinds = [e.kind for e in wired.journal.events(0.0, 100)]
        await daemon.stop()
        await wired.close()
    # The healthy scenario's GPU 1 sits at 0000:2a:00.0: one XID 79, counted once over both
    # runs; the second run took only the line printed while it was down.
    assert counts == [[1.0], [1.0]]
    assert kinds.count("xid") == 1
    assert kinds.count("gpu_lost") == 1
