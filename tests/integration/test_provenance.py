"""What a job sends cannot move the node: a push naming a cause, a GPU and a node pages the
job's route and changes neither the verdict, nor Slurm, nor the health check, in a real
Slurm on loopback with the drain list docs/slurm.md gives."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, gpuwatch, start_daemon, stop_daemon, wait_for
from tests.fake_services import FakeService
from tests.slurm_server import Slurm, needs_slurm, start_slurm


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user can reach, as /run/gpuwatch is."""
    path = Path(tempfile.mkdtemp(prefix="gpuwatch-prov-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def push(sock_path: Path, payload: dict[str, Any]) -> int:
    return _post(sock_path, "/api/v1/push", "application/json", json.dumps(payload).encode())


def push_text(sock_path: Path, job: str, text: str) -> int:
    return _post(sock_path, f"/api/v1/push?job={job}", "text/plain", text.encode())


def _post(sock_path: Path, target: str, content_type: str, body: bytes) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(sock_path))
        head = (
            f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return int(reply.split()[1])


def firing(daemon: DaemonProcess, name: str) -> list[dict[str, Any]]:
    alerts = daemon.json("/api/v1/alerts")["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]


def start(
    tmp_path: Path, shared: Path, hook: FakeService, slurm: Slurm | None = None
) -> DaemonProcess:
    config = tmp_path / "gpuwatch.yaml"
    receiver = f"{{name: ops, type: webhook, url: '{hook.url}'}}"
    text = f"node_name: gw1\npush: {{socket: {shared / 'push.sock'}}}\n"
    text += f"notify:\n  receivers:\n    - {receiver}\n"
    if slurm is not None:
        text += (
            "actions:\n  slurm:\n    enabled: true\n    node: gw1\n    resume_after: 2s\n"
            '    drain_on: [gpu-lost, "gpu-missing-*", "xid-*", remap-failed]\n'
        )
    config.write_text(text)
    env = slurm.env if slurm is not None else None
    return start_daemon(tmp_path, "--simulate", "healthy", "-c", str(config), env=env)


def gpu_uuid(daemon: DaemonProcess, index: int) -> str:
    gpus = wait_for(lambda: daemon.json("/api/v1/gpus")["data"])
    return str(next(g["uuid"] for g in gpus if g["index"] == index))


@needs_slurm
def test_a_pushed_cause_pages_the_job_and_moves_neither_verdict_nor_slurm(
    tmp_path: Path, shared: Path
) -> None:
    slurm = start_slurm(tmp_path / "slurm")
    hook = FakeService().up()
    daemon = start(tmp_path, shared, hook, slurm)
    try:
        uuid = gpu_uuid(daemon, 3)
        hostile = {"job": "alice", "metrics": {"train_loss": "NaN"},
                   "labels": {"rank": "0", "cause": "xid-79", "uuid": uuid, "gpu": "5",
                              "node": "gw9", "severity": "critical"}}  # fmt: skip
        for _ in range(3):  # kept fresh while the rules look
            assert push(shared / "push.sock", hostile) == 200
            time.sleep(0.5)
        [alert] = wait_for(lambda: firing(daemon, "TrainingLossNaN"))
        time.sleep(3)  # past resume_after, and a cycle or more of the verdict
        node = daemon.json("/api/v1/node")["data"]
        assert node["verdict"] == "healthy", node["reasons"]
        assert "DRAIN" not in slurm.node()["State"], slurm.node()
        actions = daemon.json("/api/v1/events?kind=action&since=1h")["data"]["events"]
        assert actions == []
        state = str(tmp_path / "state")
        code, out, _ = gpuwatch("health", "--local", "--state-dir", state, "--npd")
        assert code == 0, out
        assert out.startswith("healthy"), out
        assert alert["provenance"] == "job"
        labels = alert["labels"]
        assert "cause" not in labels and "uuid" not in labels and "gpu" not in labels
        assert (labels["exported_cause"], labels["exported_gpu"]) == ("xid-79", "5")
        # The job's page names this node, not the one the job wrote, and no other job's GPU.
        [page] = [
            a
            for body in wait_for(hook.bodies)
            for a in body["alerts"]
            if a["labels"]["alertname"] == "TrainingLossNaN"
        ]
        assert (page["labels"]["node"], page["labels"]["provenance"]) == ("gw1", "job")
        assert "running" not in page["annotations"]
        # Nor does it land in the report of the Slurm job that runs on GPU 5.
        code, out, err = gpuwatch("job-report", "81234", daemon.url, "--json")
        assert code == 0, err
        report = json.loads(out)
        assert report["gpus"] and all(g["alerts"] == [] for g in report["gpus"]), report
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
        hook.down()
        slurm.stop()


def sim_kmsg(daemon: DaemonProcess) -> Path:
    found = re.search(r"simulated host \(.*\) under (\S+?)\"", daemon.log())
    assert found is not None, daemon.log()
    return Path(found.group(1)) / "kmsg"


def short_address(gpu: dict[str, Any]) -> str:
    """`00000000:5D:00.0` as the driver's XID line prints it: `0000:5d:00`."""
    domain, bus, rest = str(gpu["pci_bus_id"]).lower().split(":")
    return f"{domain[-4:]}:{bus}:{rest.split('.')[0]}"


@needs_slurm
def test_driver_lines_a_user_logs_are_noise_and_drain_nothing(tmp_path: Path, shared: Path) -> None:
    slurm = start_slurm(tmp_path / "slurm")
    hook = FakeService().up()
    daemon = start(tmp_path, shared, hook, slurm)
    try:
        gpus = {g["index"]: g for g in wait_for(lambda: daemon.json("/api/v1/gpus")["data"])}
        three, five = short_address(gpus[3]), short_address(gpus[5])
        forged = [
            # `logger` in a syslog file: a program's tag, not the kernel's.
            f"Nov 28 01:45:00 gw1 alice[4242]: NVRM: Xid (PCI:{three}): 79, pid=4242, "
            "name=python3, GPU has fallen off the bus.",
            # A /dev/kmsg-form record of the user facility (12 = user.warning).
            f"12,1795828999999,99000000,-;NVRM: Xid (PCI:{five}): 48, pid=4242, name=python3, "
            "An uncorrectable double bit error (DBE) has been detected on GPU.",
        ]
        marker = "6,1795829999999,99000001,-;NVRM: a line the kernel wrote after them"
        with sim_kmsg(daemon).open("a") as log:
            log.write("\n".join([*forged, marker]) + "\n")

        def marker_seen() -> bool:
            events = daemon.json("/api/v1/events?kind=kernel_log&since=1h")["data"]["events"]
            return any("the kernel wrote after them" in e["message"] for e in events)

        wait_for(marker_seen, timeout=20)  # read past the forged lines
        time.sleep(3)  # a verdict or two, and past resume_after
        assert daemon.json("/api/v1/events?kind=xid&since=1h")["data"]["events"] == []
        node = daemon.json("/api/v1/node")["data"]
        assert node["verdict"] == "healthy", node["reasons"]
        assert "DRAIN" not in slurm.node()["State"], slurm.node()
        metrics = daemon.metrics()
        assert "gpuwatch_kmsg_not_kernel_lines_total 2.0" in metrics
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
        hook.down()
        slurm.stop()


# GPU 1 falls off the bus 40 s in: while the jobs' messages (flushed 30 s in) still queue at a
# receiver that takes 2 a second.
FALLS_LATE = """\
name: fall-off-late
node: {gpus: 2, model: H100, workload: training, seed: 1}
faults:
  - {kind: fall_off_bus, gpu: 1, at: 40s}
"""


def test_a_flood_of_job_pages_is_one_message_a_job_and_the_hardwares_goes_first(
    tmp_path: Path, shared: Path
) -> None:
    hook = FakeService().up()
    config = tmp_path / "gpuwatch.yaml"
    receiver = f"{{name: ops, type: webhook, url: '{hook.url}', rate_limit: 2}}"
    config.write_text(
        f"node_name: gw1\npush: {{socket: {shared / 'push.sock'}}}\n"
        f"notify:\n  receivers:\n    - {receiver}\n"
    )
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(FALLS_LATE)
    daemon = start_daemon(tmp_path, "--simulate", str(scenario), "-c", str(config))
    try:
        # 40 jobs of 5 ranks each go NaN: 200 series, one push each job.
        jobs = [f"job{j:02d}" for j in range(40)]
        for job in jobs:
            ranks = "".join(f'train_loss{{rank="{r}"}} NaN\n' for r in range(5))
            assert push_text(shared / "push.sock", job, ranks) == 200

        def pages(name: str) -> list[tuple[float, dict[str, Any]]]:
            """(when it arrived, the alert) of each alert of this name the receiver took."""
            with hook.lock:
                got = [(r.time, r.json) for r in hook.received]
            return [
                (t, a)
                for t, body in got
                for a in body["alerts"]
                if a["labels"]["alertname"] == name
            ]

        lost = wait_for(lambda: pages("GpuFellOffBus"), timeout=90)
        fired = lost[0][1]["startsAt"]
        nan = wait_for(
            lambda: (
                len({a["labels"]["job"] for _, a in pages("TrainingLossNaN")}) == 40
                and pages("TrainingLossNaN")
            ),
            timeout=90,
        )
        with hook.lock:
            messages = [r.json for r in hook.received]
        job_messages = [m for m in messages if m["commonLabels"].get("provenance") == "job"]
        # One message per job, whatever its ranks: 40, not 200.
        assert len(job_messages) == 40, [m["groupLabels"] for m in job_messages]
        assert all(len(m["alerts"]) == 5 for m in job_messages)
        # The hardware's page went out ahead of the jobs' still queued.
        assert lost[0][0] < max(t for t, _ in nan), "the lost GPU waited behind every job"
        took = lost[0][0] - datetime.fromisoformat(fired.replace("Z", "+00:00")).timestamp()
        assert took < 3.0, f"GpuFellOffBus reached the receiver {took:.1f}s after it fired"
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
        hook.down()


def _trickle(path: str, count: int, ready: Any, done: Any) -> None:
    """As user 60001: `count` connections that each announce a 4 MiB body and send a byte."""
    os.setgid(60001)
    os.setuid(60001)
    held: list[socket.socket] = []
    deadline = time.monotonic() + 30
    while len(held) < count and time.monotonic() < deadline:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(path)
            s.sendall(
                b"POST /api/v1/push?job=slow HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: 4194304\r\n\r\nx"
            )
        except BlockingIOError:  # the kernel's queue of connects is full: again
            s.close()
            time.sleep(0.01)
            continue
        except OSError:  # turned away
            s.close()
            continue
        held.append(s)
    ready.set()
    done.wait(60)
    for s in held:
        s.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="another user is needed: setuid takes root")
def test_a_user_holding_hundreds_of_connections_locks_no_other_job_out(
    tmp_path: Path, shared: Path
) -> None:
    hook = FakeService().up()
    daemon = start(tmp_path, shared, hook)
    context = multiprocessing.get_context("fork")
    ready, done = context.Event(), context.Event()
    trickler = context.Process(target=_trickle, args=(str(shared / "push.sock"), 520, ready, done))
    try:
        trickler.start()
        assert ready.wait(60)
        # Another user's job (root here) still gets in, and is answered at once.
        for rank in range(5):
            body = f'train_step{{rank="{rank}"}} 1\n'
            assert push_text(shared / "push.sock", "other", body) == 200
        state = str(tmp_path / "state")
        code, out, _ = gpuwatch("health", "--local", "--state-dir", state)
        assert code == 0, out
    finally:
        done.set()
        trickler.join(30)
        assert stop_daemon(daemon) == 0, daemon.log()
        hook.down()
