"""Job metrics in: pushes over the socket and TCP, a textfile directory, and every way a push
can be wrong refused with a clear 4xx while the daemon keeps sampling."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import gpuwatch
from gpuwatch.client import JobReporter
from tests.conftest import DaemonProcess, start_daemon, stop_daemon, wait_for

TOKEN = "s3cr3t-push-token"


def over_socket(
    daemon_state: Path, path: str, body: bytes, content_type: str = "text/plain"
) -> tuple[int, dict[str, Any]]:
    """POST to the control socket with a plain socket: nothing in between."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(daemon_state / "gpuwatch.sock"))
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        sock.sendall(head)
        # Refused before the whole body was read, the answer is still there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head_bytes, _, reply = data.partition(b"\r\n\r\n")
    return int(head_bytes.split()[1]), json.loads(reply)


def over_tcp(
    daemon: DaemonProcess, body: bytes, token: str | None, scheme: str = "Bearer"
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "text/plain"}
    if token is not None:
        headers["Authorization"] = f"{scheme} {token}"
    request = urllib.request.Request(f"{daemon.url}/api/v1/push?job=tcp", body, headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def last_sample(daemon: DaemonProcess) -> float:
    return float(daemon.json("/api/v1/node")["data"]["sampling"]["last_sample_time"])


def test_bad_pushes_are_refused_with_a_reason_and_the_daemon_keeps_sampling(tmp_path: Path) -> None:
    config = tmp_path / "gpuwatch.yaml"
    config.write_text(f"push: {{token: {TOKEN}}}\n")
    daemon = start_daemon(tmp_path, "--simulate", "healthy", "-c", str(config))
    state = tmp_path / "state"
    try:
        before = last_sample(daemon)
        cases = {
            "10 MB body": over_socket(state, "/api/v1/push?job=big", b"a" * 10_000_000),
            "100,000 series": over_socket(
                state, "/api/v1/push?job=many",
                "".join(f'm{{i="{i}"}} 1\n' for i in range(100_000)).encode(),
            ),
            "gpuwatch_up": over_socket(state, "/api/v1/push?job=evil", b"gpuwatch_up 0\n"),
            "NaN label, JSON": over_socket(
                state, "/api/v1/push",
                b'{"job": "llama", "labels": {"rank": NaN}, "metrics": {"train_step": 1}}',
                "application/json",
            ),
            "NaN label, text": over_socket(
                state, "/api/v1/push?job=llama", b"train_step{rank=NaN} 1\n"
            ),
            "newline in a metric name": over_socket(
                state, "/api/v1/push",
                b'{"job": "llama", "metrics": {"train_step\\n": 1}}', "application/json",
            ),
            "lone surrogate in a label": over_socket(
                state, "/api/v1/push",
                b'{"job": "llama", "labels": {"a": "\\ud800"}, "metrics": {"m1": 1}}',
                "application/json",
            ),
            "newline in a job": over_socket(
                state, "/api/v1/push",
                b'{"job": "llama\\n", "metrics": {"train_step": 1}}', "application/json",
            ),
            "no token over TCP": over_tcp(daemon, b"train_step 1\n", None),
            "wrong token over TCP": over_tcp(daemon, b"train_step 1\n", "guess"),
        }  # fmt: skip
        reasons = {name: (status, reply["error"]) for name, (status, reply) in cases.items()}
        assert reasons["10 MB body"][0] == 413 and "limit is 4194304" in reasons["10 MB body"][1]
        assert reasons["100,000 series"] == (
            422,
            "too many series: 100000 sample lines for job 'many', the limit per job is "
            "1000 (push.max_series_per_job)",
        )
        assert reasons["gpuwatch_up"] == (
            400,
            "metric name 'gpuwatch_up': names starting with gpuwatch_ or gpuwatch: are "
            "the daemon's own",
        )
        assert reasons["NaN label, JSON"] == (
            400,
            "labels: label 'rank' must have a string value, got nan",
        )
        assert reasons["NaN label, text"][0] == 400
        assert "not valid Prometheus text format" in reasons["NaN label, text"][1]
        assert reasons["no token over TCP"] == (
            401,
            "missing or wrong bearer token (Authorization: Bearer ...)",
        )
        assert reasons["wrong token over TCP"][0] == 401
        assert reasons["newline in a metric name"] == (
            400,
            "metric name 'train_step\\n' is not a valid Prometheus name",
        )
        assert reasons["newline in a job"][0] == 400
        assert reasons["lone surrogate in a label"] == (
            400,
            "labels: label 'a' is not valid UTF-8 text",
        )
        assert "job: expected a name" in reasons["newline in a job"][1]
        status, _ = over_tcp(daemon, b'train_step{rank="1"} 8\n', TOKEN, scheme="bearer")
        assert status == 200  # the scheme's case does not matter
        # Good pushes still work, on both paths, and the daemon kept sampling all along.
        status, reply = over_tcp(daemon, b'train_step{rank="0"} 7\n', TOKEN)
        assert (status, reply["data"]) == (200, {"job": "tcp", "series": 1})
        # Not job llama: the simulated training job pushes as llama every second and would
        # overwrite this series before a slow scrape sees it.
        status, _ = over_socket(state, "/api/v1/push?job=bert", b'train_loss{rank="0"} NaN\n')
        assert status == 200
        wait_for(lambda: 'train_loss{job="bert",rank="0"} NaN' in daemon.metrics())
        assert 'train_step{job="tcp",rank="0"} 7.0' in daemon.metrics()
        assert "# HELP train_step Pushed by a job" in daemon.metrics()
        assert "# TYPE train_step gauge" in daemon.metrics()
        assert "gpuwatch_up 1.0" in daemon.metrics()
        # A job's own histogram and counter: the page stays one promtool passes.
        histogram = (
            b"# TYPE step_seconds histogram\n"
            b'step_seconds_bucket{le="1"} 3\nstep_seconds_bucket{le="+Inf"} 4\n'
            b"step_seconds_sum 5.5\nstep_seconds_count 4\n"
            b"# TYPE tokens_total counter\ntokens_total 1e6\n"
        )
        status, _ = over_socket(state, "/api/v1/push?job=hist", histogram)
        assert status == 200
        wait_for(lambda: 'step_seconds_count{job="hist"} 4.0' in daemon.metrics())
        assert "# TYPE tokens_total counter" in daemon.metrics()
        checked = subprocess.run(
            ["promtool", "check", "metrics"],
            input=daemon.metrics(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")
        wait_for(lambda: last_sample(daemon) > before + 1)
        status, _, _ = daemon.get("/healthz")
        assert status == 200
        assert TOKEN not in daemon.log()
        refused = [line for line in daemon.log().splitlines() if "push refused" in line]
        local = f'peer="uid {os.getuid()} pid {os.getpid()}"'  # the kernel's word for the sender
        assert any("(413) for job 'big'" in line and local in line for line in refused)
        # A JSON body's job, read before its labels were refused.
        assert any("(400) for job 'llama': labels: label 'rank'" in line for line in refused)
        assert any("(401)" in line and "peer=127.0.0.1" in line for line in refused)
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def test_a_push_over_tcp_is_off_without_a_token(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--simulate", "healthy")
    try:
        status, reply = over_tcp(daemon, b"train_step 1\n", None)
        assert status == 403 and "set push.token" in reply["error"]
        assert {p.name for p in (tmp_path / "state").glob("*.sock")} == {
            "gpuwatch.sock",
            "push.sock",
        }
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
    # A stopped daemon leaves no socket for a client to find and fail on.
    assert list((tmp_path / "state").glob("*.sock")) == []


def test_a_push_socket_on_the_control_socket_is_refused_at_start(tmp_path: Path) -> None:
    config = tmp_path / "gpuwatch.yaml"
    # Through "..": the same file by another name.
    other_name = tmp_path / "state" / ".." / "state" / "gpuwatch.sock"
    config.write_text(f"push: {{socket: {other_name}}}\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwatch",
            "run",
            "--listen",
            "127.0.0.1:0",
            "--simulate",
            "healthy",
            "--state-dir",
            str(tmp_path / "state"),
            "-c",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "is the control socket: give it its own path" in done.stderr, done.stderr


def test_textfiles_are_read_as_jobs_and_their_series_go_stale_when_the_file_goes(
    tmp_path: Path,
) -> None:
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    config = tmp_path / "gpuwatch.yaml"
    config.write_text(f"push: {{textfile_dir: {textfiles}}}\n")
    daemon = start_daemon(tmp_path, "--simulate", "healthy", "-c", str(config))
    try:
        tmp = textfiles / ".eval.prom.tmp"
        tmp.write_text('# HELP eval_accuracy Top-1 accuracy\neval_accuracy{split="val"} 0.71\n')
        tmp.rename(textfiles / "eval.prom")  # node_exporter's convention: rename into place
        (textfiles / "broken.prom").write_text("gpuwatch_fake 1\n")
        wait_for(lambda: 'eval_accuracy{job="eval",split="val"} 0.71' in daemon.metrics())
        assert "gpuwatch_fake" not in daemon.metrics()
        assert "textfile" in daemon.log() and "broken.prom left out" in daemon.log()
        (textfiles / "eval.prom").unlink()
        time.sleep(1.0)
        # Still there until push.stale_after (5 min) has passed without the file.
        assert "eval_accuracy" in daemon.metrics()
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


REPORT_AS_ANOTHER_USER = """
import logging, sys
from gpuwatch.client import JobReporter
logging.basicConfig(level=logging.WARNING)
reporter = JobReporter(job="bert", rank=3, socket_path=sys.argv[1])
reporter.report(step=42)
print("delivered" if reporter.flush(timeout=10) else f"failed {reporter.failed}")
"""


def as_nobody(command: list[str], lib: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        user=65534,
        group=65534,
        cwd="/",
        env={"PYTHONPATH": str(lib)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def python_for_nobody(lib: Path) -> str | None:
    """A Python that user nobody can run the client library with (stdlib only, copied to
    `lib`, where nobody can read it), or None where there is none or this is not root."""
    if os.geteuid() != 0:
        return None
    (lib / "gpuwatch").mkdir(parents=True)
    (lib / "gpuwatch" / "__init__.py").write_text("")
    shutil.copy(Path(gpuwatch.__file__).parent / "client.py", lib / "gpuwatch" / "client.py")
    for python in dict.fromkeys([sys.executable, shutil.which("python3"), "/usr/bin/python3"]):
        try:
            if python and as_nobody([python, "-c", "import gpuwatch.client"], lib).returncode == 0:
                return python
        except OSError:  # this one nobody may not run (under root's home, say)
            continue
    return None


def test_any_users_job_reports_on_the_push_socket_and_only_pushes_there(tmp_path: Path) -> None:
    # A directory every user can reach, as /run/gpuwatch is (pytest's own are root's alone).
    shared = Path(tempfile.mkdtemp(prefix="gpuwatch-push-"))
    shared.chmod(0o755)
    config = tmp_path / "gpuwatch.yaml"
    config.write_text(f"push: {{socket: {shared / 'push.sock'}}}\n")
    daemon = start_daemon(tmp_path, "--simulate", "healthy", "-c", str(config))
    try:
        push_sock = shared / "push.sock"
        assert stat.S_IMODE(push_sock.stat().st_mode) == 0o666
        assert stat.S_IMODE((tmp_path / "state" / "gpuwatch.sock").stat().st_mode) == 0o660
        # A job, through the client library, on the push socket.
        reporter = JobReporter(job="llama", rank=0, socket_path=str(push_sock))
        reporter.report(step=7)
        assert reporter.flush(timeout=10) and reporter.failed == 0
        reporter.close()
        wait_for(lambda: 'train_step{job="llama",rank="0"} 7.0' in daemon.metrics())
        # Nothing but pushes there: an acknowledgement is not found.
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(10)
            sock.connect(str(push_sock))
            sock.sendall(
                b"POST /api/v1/ack HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                b"Connection: close\r\n\r\n{}"
            )
            assert sock.recv(100).startswith(b"HTTP/1.1 404")
        lib = shared / "lib"
        python = python_for_nobody(lib)
        if python is not None:  # as an ordinary user (nobody), which a job usually runs as
            done = as_nobody([python, "-c", REPORT_AS_ANOTHER_USER, str(push_sock)], lib)
            assert done.stdout.strip() == "delivered", done.stderr
            wait_for(lambda: 'train_step{job="bert",rank="3"} 42.0' in daemon.metrics())
            # The control socket keeps that user out, and the client says so once.
            control = str(tmp_path / "state" / "gpuwatch.sock")
            done = as_nobody([python, "-c", REPORT_AS_ANOTHER_USER, control], lib)
            assert done.stdout.strip().startswith("failed"), done.stderr
            assert done.stderr.count("did not take a report of job bert") == 1, done.stderr
        assert "other users cannot reach it" not in daemon.log()
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
        shutil.rmtree(shared, ignore_errors=True)


def test_a_push_socket_other_users_cannot_reach_is_said_at_start(tmp_path: Path) -> None:
    """Outside systemd the push socket sits in the state directory, which is its owner's
    alone: the daemon says so at start, and it is true (nobody's push does not get there)."""
    # Every directory above the state directory searchable, as /var/lib is.
    shared = Path(tempfile.mkdtemp(prefix="gpuwatch-push-"))
    shared.chmod(0o755)
    daemon = start_daemon(shared, "--simulate", "healthy")
    try:
        state = shared / "state"
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        said = (
            f"push socket {state / 'push.sock'}: other users cannot reach it ({state} is "
            "mode 0700), so their jobs cannot push"
        )
        wait_for(lambda: said in daemon.log())
        python = python_for_nobody(shared / "lib")
        if python is not None:
            done = as_nobody(
                [python, "-c", REPORT_AS_ANOTHER_USER, str(state / "push.sock")], shared / "lib"
            )
            assert done.stdout.strip().startswith("failed"), done.stderr
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
        shutil.rmtree(shared, ignore_errors=True)


def test_a_job_reports_over_tcp_with_the_push_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "gpuwatch.yaml"
    config.write_text(f"push: {{token: {TOKEN}}}\n")
    daemon = start_daemon(tmp_path, "--simulate", "healthy", "-c", str(config))
    try:
        reporter = JobReporter(job="gpt", rank=1, url=daemon.url, token=TOKEN, interval=0.2)
        reporter.report(step=3, loss=float("nan"))
        assert reporter.flush(timeout=10)
        wait_for(lambda: 'train_loss{job="gpt",rank="1"} NaN' in daemon.metrics())
        reporter.close()
        caplog.set_level(logging.WARNING, "gpuwatch.client")
        wrong = JobReporter(job="gpt", rank=1, url=daemon.url, token="guess", interval=0.2)
        wrong.report(step=4)
        wait_for(lambda: wrong.failed >= 3, timeout=20)
        wrong.close()
        [warning] = [r.getMessage() for r in caplog.records if r.name == "gpuwatch.client"]
        assert "HTTP 401" in warning and "guess" not in warning
        assert 'train_step{job="gpt",rank="1"} 3.0' in daemon.metrics()  # not 4
        assert TOKEN not in daemon.log()
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
