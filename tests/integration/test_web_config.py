"""TLS and basic auth on the main listener from an exporter-toolkit web-config file, checked
with real TLS clients: Python's, and a real Prometheus scraping with a CA file and a password."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import signal
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import bcrypt
import pytest
import trustme
from gpuwatch.tui.data import HttpFeed, NodeSnapshot

from tests.conftest import DaemonProcess, gpuwatch, start_daemon, stop_daemon, wait_for
from tests.prometheus_server import needs_prometheus, start_prometheus

PASSWORD = "correct horse battery staple"


def htpasswd(password: str) -> str:
    """As `htpasswd -nBC 10` writes it (Go's bcrypt reads $2y$)."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(10)).decode().replace("$2b$", "$2y$")


def secure_node(tmp_path: Path) -> tuple[trustme.CA, Path]:
    """A CA, the node's certificate from it, and a web-config file using them."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_pem.write_to_path(str(tmp_path / "node.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "node.crt"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    web = tmp_path / "web.yml"
    web.write_text(
        "tls_server_config:\n  cert_file: node.crt\n  key_file: node.key\n"
        "http_server_config:\n  headers: {X-Frame-Options: deny}\n"
        f"basic_auth_users:\n  prometheus: '{htpasswd(PASSWORD)}'\n"
    )
    return ca, web


def get(
    url: str, ca: trustme.CA | None, user: str = "", password: str = ""
) -> tuple[int, dict[str, str], bytes]:
    context = ssl.create_default_context()
    if ca is not None:
        ca.configure_trust(context)
    headers = {}
    if user:
        headers["Authorization"] = (
            "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        )
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def https(daemon: DaemonProcess) -> str:
    return daemon.url.replace("http://", "https://")


def test_metrics_answer_only_over_tls_with_the_right_password(tmp_path: Path) -> None:
    ca, web = secure_node(tmp_path)
    config = tmp_path / "gpuwatch.yaml"
    config.write_text("push: {token: push-token}\n")
    daemon = start_daemon(
        tmp_path / "d", "--simulate", "healthy", "--web-config", str(web), "-c", str(config)
    )
    try:
        assert "(https)" in daemon.log()
        metrics = https(daemon) + "/metrics"
        status, headers, body = get(metrics, ca, "prometheus", PASSWORD)
        assert status == 200 and b"gpuwatch_up 1.0" in body
        assert headers["X-Frame-Options"] == "deny"

        status, headers, _ = get(metrics, ca)
        assert status == 401 and headers["WWW-Authenticate"] == 'Basic realm="gpuwatch"'
        assert get(metrics, ca, "prometheus", "wrong")[0] == 401
        assert get(metrics, ca, "someone", PASSWORD)[0] == 401
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            get(metrics, None, "prometheus", PASSWORD)  # a client that does not trust the CA
        status, _, body = daemon.get("/metrics")  # plain HTTP on the TLS port
        assert (status, body) == (400, b"Client sent an HTTP request to an HTTPS server.\n")
        assert "basic auth refused for user 'prometheus'" in daemon.log()
        assert PASSWORD not in daemon.log()

        # A pod's liveness probe: /healthz wants the password; the control socket does not.
        assert get(https(daemon) + "/healthz", ca)[0] == 401
        code, out, _ = gpuwatch("health", "--alive", "--state-dir", str(tmp_path / "d" / "state"))
        assert (code, out) == (0, "alive: sampling is current\n")

        # The command-line clients and the dashboard: the fleet's CA, the password in the URL.
        with_password = https(daemon).replace("://", f"://prometheus:{quote(PASSWORD)}@")
        ca_file = str(tmp_path / "ca.crt")
        assert gpuwatch("health", with_password, "--ca-file", ca_file)[:2] == (
            0,
            "healthy: 8 GPUs, nothing wrong\n",
        )
        code, out, _ = gpuwatch("health", with_password)  # the system's CAs do not know it
        assert code == 3 and "CERTIFICATE_VERIFY_FAILED" in out
        assert quote(PASSWORD) not in out and "prometheus:***@" in out
        assert gpuwatch("status", https(daemon), "--ca-file", ca_file)[0] == 3  # no password
        # Plain HTTP to the TLS listener: Go's exporters' 400, which the client explains.
        code, out, _ = gpuwatch("health", https(daemon).replace("https://", ""))
        assert code == 3 and "the daemon serves TLS: give an https:// URL" in out, out
        host, port = https(daemon).removeprefix("https://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as plain:
            plain.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b"".join(iter(lambda: plain.recv(4096), b""))
        assert answer.startswith(b"HTTP/1.0 400 Bad Request\r\n"), answer
        assert answer.endswith(b"\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
        source = HttpFeed(tls=ssl.create_default_context(cafile=ca_file))
        snapshot = asyncio.run(fetch_and_close(source, with_password))
        assert snapshot.error == "" and len(snapshot.node["gpus"]) == 8

        # The write endpoint keeps its own bearer token, not the scrape password.
        assert push_over_https(daemon, ca, "push-token") == 200
        assert push_over_https(daemon, ca, "nope") == 401

        # A new password: in effect after SIGHUP, and the old one refused.
        text = web.read_text()
        web.write_text(text[: text.index("prometheus: ")] + f"prometheus: '{htpasswd('new')}'\n")
        daemon.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reloaded" in daemon.log(), timeout=10)
        assert get(metrics, ca, "prometheus", "new")[0] == 200
        assert get(metrics, ca, "prometheus", PASSWORD)[0] == 401
    finally:
        assert stop_daemon(daemon) == 0


async def fetch_and_close(source: HttpFeed, url: str) -> NodeSnapshot:
    try:
        return await source.fetch(url, detail=True)
    finally:
        await source.close()


def push_over_https(daemon: DaemonProcess, ca: trustme.CA, token: str) -> int:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    request = urllib.request.Request(
        https(daemon) + "/api/v1/push?job=train",
        b"train_loss 0.5\n",
        {"Content-Type": "text/plain", "Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@needs_prometheus
def test_a_real_prometheus_scrapes_over_tls_with_basic_auth(tmp_path: Path) -> None:
    _, web = secure_node(tmp_path)
    (tmp_path / "password").write_text(PASSWORD)
    daemon = start_daemon(tmp_path / "d", "--simulate", "healthy", "--web-config", str(web))
    job = (
        f"    scheme: https\n    tls_config: {{ca_file: {tmp_path / 'ca.crt'}}}\n"
        f"    basic_auth: {{username: prometheus, password_file: {tmp_path / 'password'}}}\n"
    )
    prom = start_prometheus(tmp_path, [daemon.url.removeprefix("http://")], job)
    try:
        deadline = time.monotonic() + 60
        up: list[dict[str, object]] = []
        while time.monotonic() < deadline and not up:
            with contextlib.suppress(OSError):
                up = prom.query('up{job="gpuwatch"} == 1 and on() gpuwatch_up == 1')
            time.sleep(0.5)
        assert up, prom.log()
        assert len(prom.query("gpuwatch_gpu_temperature_celsius")) == 8
    finally:
        prom.stop()
        assert stop_daemon(daemon) == 0


def test_tls_alone_lets_every_reader_in_over_tls(tmp_path: Path) -> None:
    ca, web = secure_node(tmp_path)
    web.write_text("tls_server_config: {cert_file: node.crt, key_file: node.key}\n")
    daemon = start_daemon(tmp_path / "d", "--simulate", "healthy", "--web-config", str(web))
    try:
        assert get(https(daemon) + "/api/v1/node", ca)[0] == 200
        assert daemon.get("/api/v1/node")[0] == 400  # plain HTTP: told to use TLS
    finally:
        assert stop_daemon(daemon) == 0
