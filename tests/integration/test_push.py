"""Job metrics in: pushes over the socket and TCP, a textfile directory, and every way a push
can be wrong refused with a clear 4xx while the daemon keeps sampling."""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.conftest import DaemonProcess, start_daemon, stop_daemon, wait_for

TOKEN = "s3cr3t-push-token"


def over_socket(
    daemon_state: Path, path: str, body: bytes, content_type: str = "text/plain"
) -> tuple[int, dict[str, Any]]:
    """POST to the control socket with a plain socket: nothing in between."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(daemon_state / "gpuwatch.sock"))
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()  # fmt: skip
        sock.sendall(head)
        # Refused before the whole body was read, the answer is still there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head_bytes, _, reply = data.partition(b"\r\n\r\n")
    return int(head_bytes.split()[1]), json.loads(reply)


def over_tcp(daemon: DaemonProcess, body: bytes, token: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "text/plain"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
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
            "no token over TCP": over_tcp(daemon, b"train_step 1\n", None),
            "wrong token over TCP": over_tcp(daemon, b"train_step 1\n", "guess"),
        }  # fmt: skip
        reasons = {name: (status, reply["error"]) for name, (status, reply) in cases.items()}
        assert reasons["10 MB body"][0] == 413 and "limit is 4194304" in reasons["10 MB body"][1]
        assert reasons["100,000 series"] == (
            422, "too many series: 100000 sample lines for job 'many', the limit per job is "
            "1000 (push.max_series_per_job)",
        )  # fmt: skip
        assert reasons["gpuwatch_up"] == (
            400, "metric name 'gpuwatch_up': names starting with gpuwatch_ are the daemon's own"
        )  # fmt: skip
        assert reasons["NaN label, JSON"] == (
            400, "labels: label 'rank' must have a string value, got nan"
        )  # fmt: skip
        assert reasons["NaN label, text"][0] == 400
        assert "not valid Prometheus text format" in reasons["NaN label, text"][1]
        assert reasons["no token over TCP"] == (
            401, "missing or wrong bearer token (Authorization: Bearer ...)"
        )  # fmt: skip
        assert reasons["wrong token over TCP"][0] == 401
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
        wait_for(lambda: last_sample(daemon) > before + 1)
        status, _, _ = daemon.get("/healthz")
        assert status == 200
        assert TOKEN not in daemon.log()
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def test_a_push_over_tcp_is_off_without_a_token(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--simulate", "healthy")
    try:
        status, reply = over_tcp(daemon, b"train_step 1\n", None)
        assert status == 403 and "set push.token" in reply["error"]
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


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
