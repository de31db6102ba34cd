"""Requests that used to answer 500 answer 4xx with a reason, and a flood of wrong passwords
costs the flooder, not the node."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bcrypt

from tests.conftest import DaemonProcess, gpuwatch, start_daemon, stop_daemon
from tests.integration.test_push import over_socket

PASSWORD = "right horse battery"


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_bad_parameters_and_bodies_get_a_4xx_with_a_reason(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--simulate", "healthy")
    state = tmp_path / "state"
    try:
        huge = "9" * 400 + "s"
        status, _, body = daemon.get(f"/api/v1/history?metric=temperature_celsius&range={huge}")
        assert status == 400 and b"under 1000y" in body, body
        status, _, body = daemon.get(f"/api/v1/history?metric=temperature_celsius&step={huge}")
        assert status == 400, body
        nested = b'{"job": "j", "metrics": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        status, reply = over_socket(state, "/api/v1/push", nested, "application/json")
        assert status == 400 and "nested too deeply" in reply["error"], reply
        code, out, err = gpuwatch(
            "silence", "add", "alertname=X", "--duration", "300000y", "--state-dir", str(state)
        )
        assert code != 0 and "under 1000y" in out + err, out + err
        code, out, err = gpuwatch("silence", "list", "--state-dir", str(state))
        assert code == 0, out + err
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def secured(tmp_path: Path) -> DaemonProcess:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    web = tmp_path / "web.yaml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    return start_daemon(tmp_path, "--simulate", "healthy", "--web-config", str(web))


def test_a_password_past_bcrypts_72_bytes_is_refused_not_a_500(tmp_path: Path) -> None:
    daemon = secured(tmp_path)
    try:
        status, _, _ = daemon.get("/healthz", basic("prometheus", "x" * 73))
        assert status == 401
        status, _, _ = daemon.get("/healthz", basic("prometheus", PASSWORD))
        assert status == 200
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def test_a_flood_of_wrong_passwords_is_cut_short_and_health_answers(tmp_path: Path) -> None:
    daemon = secured(tmp_path)
    good = basic("prometheus", PASSWORD)
    try:
        assert daemon.get("/healthz", good)[0] == 200  # a scraper's pair, checked once
        with ThreadPoolExecutor(64) as pool:
            flood = [
                pool.submit(daemon.get, "/healthz", basic("prometheus", f"guess-{i}"), 30.0)
                for i in range(300)
            ]
            for _ in range(10):  # bench/flood.py measures how fast
                status, _, body = daemon.get("/healthz", good)
                assert status == 200, body
            answers = [f.result()[0] for f in flood]
        # At most AUTH_FAILURES_LIMIT checks were made for the flooding client; the rest were
        # refused before any bcrypt work.
        assert answers.count(401) <= 10 and answers.count(429) == 300 - answers.count(401)
        status, headers, _ = daemon.get("/metrics", basic("prometheus", "guess-again"))
        assert status == 429 and headers["Retry-After"] == "10"
        assert json.loads(daemon.get("/api/v1/node", good)[2])["data"]["verdict"] == "healthy"
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
