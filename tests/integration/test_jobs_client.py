"""gpuwatch.client never blocks or raises into a training loop; processes map to their jobs."""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from pathlib import Path

import pytest

from gpuwatch.client import JobReporter
from gpuwatch.host.processes import job_from_cgroup
from gpuwatch.model import GpuProcess
from gpuwatch.push.parse import parse_json


def test_report_never_waits_for_the_daemon_and_never_raises(tmp_path: Path) -> None:
    """A daemon that takes the connection and never answers holds the sending thread for its
    whole timeout (TIMEOUT_S, 2 s); the training loop's reports all go through meanwhile."""
    path = str(tmp_path / "hung.sock")
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(path)
    hung.listen()  # connections wait in the backlog: never accepted, never answered
    reporter = JobReporter("llama", rank=3, socket_path=path, interval=0.01)
    reporter.report(step=0)
    time.sleep(0.1)  # the sending thread takes it and waits on the daemon
    for step in range(2000):
        reporter.report(step=step, loss=float("nan"), tokens_per_second=1e5)
    reporter.report(loss="not a number")  # type: ignore[arg-type]
    reporter.report(step=10**400)  # an int no float holds: dropped too
    # Had a report waited on the daemon, the first send would have timed out (failed) by now.
    assert (reporter.sent, reporter.failed) == (0, 0)
    hung.close()
    Path(path).unlink()  # now the daemon is away
    assert reporter.flush(timeout=5.0) is False
    assert reporter.failed > 0 and reporter.sent == 0
    reporter.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"


def fake_daemon(path: str, answers: list[bytes]) -> tuple[list[bytes], threading.Thread]:
    """A unix socket that reads one request per answer and replies with it; the bodies read."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    bodies: list[bytes] = []

    def serve() -> None:
        with server:
            for answer in answers:
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
                conn.sendall(answer)
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return bodies, thread


def test_reports_arrive_as_the_json_push_form(tmp_path: Path) -> None:
    path = str(tmp_path / "daemon.sock")
    bodies, thread = fake_daemon(path, [OK])
    reporter = JobReporter("llama", rank=0, socket_path=path, interval=10.0)
    reporter.report(step=12, loss=math.inf)
    assert reporter.flush(timeout=5.0)
    thread.join(5)
    job, samples = parse_json(bodies[0])
    assert job == "llama"
    assert {(s.name, s.value) for s in samples} == {("train_step", 12.0), ("train_loss", math.inf)}
    assert samples[0].labels == (("job", "llama"), ("rank", "0"))
    reporter.close()


def test_caught_out_of_memory_errors_arrive_as_a_count(tmp_path: Path) -> None:
    path = str(tmp_path / "daemon.sock")
    bodies, thread = fake_daemon(path, [OK])
    reporter = JobReporter("llama", rank=3, socket_path=path, interval=10.0)
    reporter.report(step=7)
    reporter.out_of_memory()
    reporter.out_of_memory()
    assert reporter.ooms == 2
    assert reporter.flush(timeout=5.0)
    thread.join(5)
    _, samples = parse_json(bodies[0])
    assert {(s.name, s.value) for s in samples} == {("train_step", 7.0), ("train_oom_total", 2.0)}
    reporter.close()


def test_a_name_the_daemon_would_refuse_is_left_out_once_and_the_rest_still_arrives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(tmp_path / "daemon.sock")
    bodies, thread = fake_daemon(path, [OK, OK])
    labels = {"node": "a", "bad label": "x", "__name__": "y", "note": "x" * 1025}
    reporter = JobReporter("llama", rank=1, socket_path=path, labels=labels, interval=10.0)
    with caplog.at_level(logging.WARNING, logger="gpuwatch.client"):
        for _ in range(2):
            reporter.report(**{"loss": 1.5, "lr-scale": 2.0, "ünïcode": 3.0})
            assert reporter.flush(timeout=5.0)
    thread.join(5)
    for body in bodies:
        _, samples = parse_json(body)  # the daemon's own parser takes every push whole
        assert [(s.name, s.labels) for s in samples] == [
            ("train_loss", (("exported_node", "a"), ("job", "llama"), ("rank", "1")))
        ]
    warned = sorted(r.getMessage() for r in caplog.records)
    assert len(warned) == 5, warned  # each bad name once, though reported twice
    text = "\n".join(warned)
    assert "metric name 'train_lr-scale' is not a valid Prometheus name (job llama)" in text
    assert "label 'note' is longer than 1024 characters (job llama)" in text
    reporter.close()


def test_whatever_answers_on_the_socket_the_reporter_goes_on(tmp_path: Path) -> None:
    path = str(tmp_path / "daemon.sock")
    bad_chunk = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
    answers = [b"garbage\r\n\r\n", bad_chunk, OK]
    bodies, thread = fake_daemon(path, answers)
    reporter = JobReporter("llama", rank=0, socket_path=path, interval=10.0)
    reporter.report(step=1)
    results = [reporter.flush(timeout=5.0) for _ in answers]
    thread.join(5)
    assert results == [False, False, True]
    assert len(bodies) == 3
    assert (reporter.failed, reporter.sent) == (2, 1)
    reporter.close()


def test_a_url_that_is_not_http_fails_every_send_without_raising() -> None:
    reporter = JobReporter("llama", url="localhost:10040", token="t", interval=10.0)
    reporter.report(step=1)
    assert reporter.flush(timeout=0.5) is False
    assert reporter.failed == 1
    reporter.close()


def test_a_process_cgroup_names_its_job() -> None:
    assert job_from_cgroup("0::/system.slice/slurmstepd.scope/job_81234/step_0/user/task_0\n") == (
        "slurm",
        "81234",
    )
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


def test_sends_share_one_connection_and_survive_the_daemon_closing_it(tmp_path: Path) -> None:
    """A new connection a second per rank cost the daemon more than the push itself."""
    path = str(tmp_path / "daemon.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    accepted: list[int] = []
    requests: list[int] = []
    keep_alive = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"

    def answer(conn: socket.socket, count: int) -> None:
        for _ in range(count):
            data = b""
            while b"}" not in data:  # the JSON body's end: one request
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            requests.append(len(accepted))
            conn.sendall(keep_alive)

    def serve() -> None:
        with server:
            for count in (3, 1):  # three sends, then the daemon closes (idle, restarted)
                conn, _ = server.accept()
                accepted.append(1)
                with conn:
                    answer(conn, count)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    reporter = JobReporter("llama", rank=0, socket_path=path, interval=10.0)
    reporter.report(step=1)
    assert [reporter.flush(timeout=5.0) for _ in range(3)] == [True, True, True]
    assert len(accepted) == 1
    assert reporter.flush(timeout=5.0)  # the kept connection is gone: one more, at once
    thread.join(5)
    assert (len(accepted), requests) == (2, [1, 1, 1, 2])
    assert (reporter.sent, reporter.failed) == (4, 0)
    reporter.close()


def test_a_daemon_that_does_not_answer_is_asked_once(tmp_path: Path) -> None:
    """A timeout is not a closed connection: the push is not sent again on a new one."""
    path = str(tmp_path / "daemon.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    accepted: list[socket.socket] = []
    answered = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        accepted.append(conn)
        data = b""
        while b"}" not in data:
            data += conn.recv(65536)
        answered.set()  # before the reply, so the client cannot see it first
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        # then the daemon hangs: reads on, answers nothing

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    reporter = JobReporter("llama", rank=0, socket_path=path, interval=10.0)
    reporter.report(step=1)
    assert reporter.flush(timeout=5.0) and answered.is_set()
    assert reporter.flush(timeout=10.0) is False  # timed out on the kept connection
    server.settimeout(0.5)
    with pytest.raises(TimeoutError):
        server.accept()  # no second connection came
    assert len(accepted) == 1 and reporter.failed == 1
    reporter.close()
    accepted[0].close()
    server.close()
