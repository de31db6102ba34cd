"""Reading exporter-toolkit web-config files: what works, and every mistake named with its line."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path
from unittest import mock

import bcrypt
import pynvml
import pytest
import trustme

from gpuwatch.clock import ManualClock
from gpuwatch.serve.webconfig import (
    AUTH_CACHE_SIZE,
    WebConfig,
    WebGuard,
    basic_credentials,
    load_web_config,
)
from gpuwatch.serve.wiring import wire
from gpuwatch.sim.scenario import load_scenario
from gpuwatch.text.yamlfile import FileError
from gpuwatch.web.message import Headers, Request
from tests.conftest import Simulate, node_config


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    ca = trustme.CA()
    cert = ca.issue_cert("gpu-node-01")
    cert.private_key_pem.write_to_path(str(tmp_path / "node.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "node.crt"))
    ca.cert_pem.write_to_path(str(tmp_path / "clients-ca.crt"))
    return tmp_path


def write(directory: Path, text: str) -> Path:
    path = directory / "web.yml"
    path.write_text(text)
    return path


def test_a_full_file_as_prometheus_documents_it(certs: Path) -> None:
    path = write(
        certs,
        "tls_server_config:\n"
        "  cert_file: node.crt\n  key_file: node.key\n"  # relative to the file
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: clients-ca.crt\n"
        "  client_allowed_sans: [prometheus.example]\n"
        "  min_version: TLS13\n"
        "  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n"
        "http_server_config:\n  http2: true\n  headers: {Strict-Transport-Security: max-age=3600}\n"
        "basic_auth_users:\n"
        "  alice: $2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze\n",
    )
    web = load_web_config(path)
    assert web.tls is not None
    assert web.tls.verify_mode == ssl.CERT_REQUIRED
    assert web.tls.minimum_version == ssl.TLSVersion.TLSv1_3
    assert web.allowed_sans == ("prometheus.example",)
    assert web.headers == {"Strict-Transport-Security": "max-age=3600"}
    assert set(web.users) == {"alice"}
    assert web.certificate == (certs / "node.crt", certs / "node.key")


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (
            "tls_server_config:\n  cert_file: node.crt\n  keyfile: node.key\n",
            3,
            "tls_server_config.keyfile: unknown key",
        ),
        (
            "tls_server_config:\n  cert_file: node.crt\n  key_file: node.key\n"
            "  curve_preferences: [X25519]\n",
            4,
            "curve_preferences: not supported",
        ),
        (
            "tls_server_config:\n  cert_file: node.crt\n  key_file: node.key\n"
            "  client_auth_type: RequestClientCert\n",
            4,
            "RequestClientCert is not supported: gpuwatch only takes client certificates it",
        ),
        (
            "tls_server_config:\n  cert_file: node.crt\n  key_file: node.key\n"
            "  client_auth_type: VerifyClientCertIfGiven\n",
            4,
            "client_auth_type: VerifyClientCertIfGiven needs client_ca_file",
        ),
        (
            "tls_server_config:\n  cert_file: missing.crt\n  key_file: node.key\n",
            2,
            "cert_file: cannot load missing.crt and node.key",
        ),
        (
            "tls_server_config:\n  cert_file: node.crt\n  key_file: node.key\n"
            "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
            4,
            "unknown cipher suites",
        ),
        (
            "tls_server_config:\n  cert_file: node.crt\n  key_file: node.key\n"
            "  min_version: TLS14\n",
            4,
            "min_version: expected one of",
        ),
        (
            "basic_auth_users:\n  alice: hunter2\n",
            2,
            "basic_auth_users.alice: must be a bcrypt hash",
        ),
        (
            "http_server_config:\n  headers: {Server: gpuwatch}\n",
            2,
            "http_server_config.headers.Server: unknown key",
        ),
    ],
)
def test_each_mistake_is_named_with_its_line(
    certs: Path, text: str, line: int, message: str
) -> None:
    path = write(certs, text)
    with pytest.raises(FileError) as caught:
        load_web_config(path)
    assert f"{path}:{line}: " in str(caught.value)
    assert message in str(caught.value)


def _request(user: str, password: str, client: str) -> Request:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    connection = mock.Mock()
    connection.transport.get_extra_info.side_effect = lambda name, default=None: (
        (client, 40000) if name == "peername" else default
    )
    headers = Headers(authorization=f"Basic {token}")
    return Request(connection, "GET", "/metrics", headers)


def test_basic_credentials_are_the_bytes_sent() -> None:
    token = base64.b64encode("zoë:pässword:with colon".encode()).decode()
    assert basic_credentials(f"Basic {token}") == ("zoë", "pässword:with colon".encode())
    assert basic_credentials(f"basic  {token} ") == ("zoë", "pässword:with colon".encode())
    for header in ("", "Bearer abc", "Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode()):
        assert basic_credentials(header) is None, header


async def test_wrong_guesses_from_many_clients_never_push_out_a_scrapers_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checks: list[bytes] = []
    real_checkpw = bcrypt.checkpw

    def counting_checkpw(password: bytes, hashed: bytes) -> bool:
        checks.append(password)
        return real_checkpw(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting_checkpw)
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(4))
    guard = WebGuard(WebConfig("web.yml", users={"prometheus": hashed}), now=lambda: 0.0)
    try:
        assert await guard._authorized(_request("prometheus", "right", "10.0.0.1")) is True
        for i in range(AUTH_CACHE_SIZE + 50):  # more refused pairs than the cache holds
            client = f"10.1.{i // 250}.{i % 250}"
            assert await guard._authorized(_request("prometheus", f"guess-{i}", client)) is False
        checks.clear()
        assert await guard._authorized(_request("prometheus", "right", "10.0.0.1")) is True
        assert checks == []  # answered from what was checked before, no bcrypt work
    finally:
        guard.close()


async def test_links_back_to_a_daemon_behind_tls_say_https(certs: Path, simulate: Simulate) -> None:
    """The notifier's and the templates' URL of the daemon itself follow the listener's TLS."""
    guard = WebGuard(
        load_web_config(
            write(certs, "tls_server_config:\n  cert_file: node.crt\n  key_file: node.key\n")
        )
    )
    config, state = node_config(certs, "rules: {files: []}\n")
    clock = ManualClock()
    simulate(load_scenario("healthy"), clock)
    try:
        wired = wire(config, pynvml, clock, state, 10443, guard=guard)
        assert wired.notifier.external_url == "https://n1:10443"
        assert wired.rules.external_url == "https://n1:10443"
        await wired.close()
    finally:
        guard.close()
