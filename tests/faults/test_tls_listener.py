"""The TLS listener sorts each connection by its first byte: connections that never send
one, by the thousand, neither keep a client that speaks TLS out nor stay open for good."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import trustme

from tests.conftest import stop_daemon
from tests.faults.test_connections import (
    FD_LIMIT,
    open_idle,
    probe,
    room_for_floods,
    start_with_fd_limit,
)


def _tls_node(tmp_path: Path) -> tuple[ssl.SSLContext, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "node.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "node.crt"))
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config: {cert_file: node.crt, key_file: node.key}\n")
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context, web


@room_for_floods()
def test_1100_silent_connections_keep_no_tls_client_out(tmp_path: Path) -> None:
    context, web = _tls_node(tmp_path)
    daemon = start_with_fd_limit(tmp_path, FD_LIMIT, "--web-config", str(web))
    silent = []
    try:
        assert daemon.url.startswith("https://")
        silent = open_idle(daemon.url, 1100)
        answers = [probe(daemon.url + path, context) for path in ("/metrics", "/healthz") * 6]
        assert answers == [200] * 12, answers
    finally:
        for s in silent:
            s.close()
        assert stop_daemon(daemon) == 0, daemon.log()


def test_a_connection_that_never_says_a_first_byte_is_closed(tmp_path: Path) -> None:
    _, web = _tls_node(tmp_path)
    daemon = start_with_fd_limit(tmp_path, FD_LIMIT, "--web-config", str(web))
    try:
        (silent,) = open_idle(daemon.url, 1)
        silent.settimeout(30)
        started = time.monotonic()
        assert silent.recv(1024) == b""  # closed by the daemon
        assert time.monotonic() - started < 30
        silent.close()
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
