"""gpuwatch.client never blocks or raises into a training loop; processes map to their jobs."""

from __future__ import annotations

import math
import socket
import threading
import time
from pathlib import Path

from gpuwatch.client import JobReporter
from gpuwatch.processes import GpuProcess, job_from_cgroup
from gpuwatch.push.parse import parse_json


def test_report_takes_well_under_a_millisecond_and_never_raises_when_the_daemon_is_away(
    tmp_path: Path,
) -> None:
    reporter = JobReporter(
        "llama", rank=3, socket_path=str(tmp_path / "nobody.sock"), interval=0.01
    )
    worst = 0.0
    for step in range(2000):
        t0 = time.perf_counter()
        reporter.report(step=step, loss=float("nan"), tokens_per_second=1e5)
        worst = max(worst, time.perf_counter() - t0)
    reporter.report(loss="not a number")  # type: ignore[arg-type]
    time.sleep(0.1)
    assert worst < 0.001, worst
    assert reporter.failed > 0 and reporter.sent == 0
    assert reporter.flush(timeout=0.2) is False
    reporter.close()


def test_reports_arrive_as_the_json_push_form(tmp_path: Path) -> None:
    path = str(tmp_path / "daemon.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    bodies: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(
            next(
                v
                for k, v in (line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
                if k.lower() == b"content-length"
            )
        )
        while len(body) < length:
            body += conn.recv(65536)
        bodies.append(body)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    reporter = JobReporter("llama", rank=0, socket_path=path, interval=10.0)
    reporter.report(step=12, loss=math.inf)
    assert reporter.flush(timeout=5.0)
    thread.join(5)
    job, samples = parse_json(bodies[0])
    assert job == "llama"
    assert {(s.name, s.value) for s in samples} == {("train_step", 12.0), ("train_loss", math.inf)}
    assert samples[0].labels == (("job", "llama"), ("rank", "0"))
    reporter.close()
    server.close()


def test_a_process_cgroup_names_its_job() -> None:
    assert job_from_cgroup("0::/system.slice/slurmstepd.scope/job_81234/step_0/user/task_0\n") == (
        "slurm", "81234",
    )  # fmt: skip
    assert job_from_cgroup("4:memory:/slurm/uid_1000/job_55/step_batch\n") == ("slurm", "55")
    pod = (
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f1c2a8e_3b4d_4e5f_8a9b_0c1d2e3f4a5b.slice/cri-containerd-"
        + "ab" * 32
        + ".scope\n"
    )
    assert job_from_cgroup(pod) == ("kubernetes", "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b")
    assert job_from_cgroup("0::/system.slice/docker-" + "cd" * 32 + ".scope\n") == (
        "docker",
        "cd" * 32,
    )
    assert job_from_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") == ("", "")
    docker = GpuProcess(7, "python", "bob", 1e9, "docker", "cd" * 32)
    assert docker.job == "Docker container cdcdcdcdcdcd of bob"
    assert GpuProcess(8, "python", "bob", None).job == ""
