"""Client commands take a daemon's address as operators type it (the `--hosts` file always
did): a host, host:port, [IPv6]:port or a URL; anything else is a usage error, exit 64, which
no caller may read as the daemon being down (3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.cli import main
from gpuwatch.clients.address import daemon_url
from gpuwatch.clients.commands import read_hosts
from gpuwatch.clients.exits import EXIT_USAGE


@pytest.mark.parametrize(
    ("typed", "url"),
    [
        ("127.0.0.1:18190", "http://127.0.0.1:18190"),
        ("node7", "http://node7:10040"),
        ("node7.example.org:9", "http://node7.example.org:9"),
        ("[::1]:10040", "http://[::1]:10040"),
        ("[::1]", "http://[::1]:10040"),
        ("http://node7:10040/", "http://node7:10040"),
        ("https://prometheus:secret@node7:10040", "https://prometheus:secret@node7:10040"),
        ("http://proxy/gpuwatch/node7", "http://proxy/gpuwatch/node7"),
    ],
)
def test_what_operators_type_is_a_daemons_url(typed: str, url: str) -> None:
    assert daemon_url(typed) == url


@pytest.mark.parametrize(
    "typed", ["node 7", "127.0.0.1:99999", "node7:port", "ftp://node7", "::1", "http://", "a/b"]
)
def test_an_address_that_is_none_is_refused_naming_it(typed: str) -> None:
    with pytest.raises(ValueError, match="is not a daemon's address: expected HOST"):
        daemon_url(typed)


def test_a_malformed_address_exits_64_before_anything_is_asked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for command in (["health", "node 7"], ["status", "node7:port"], ["events", "ftp://x"]):
        assert main(command) == EXIT_USAGE
        assert "is not a daemon's address" in capsys.readouterr().err
    hosts = tmp_path / "hosts"
    hosts.write_text("node1\nnode2:9100  # a comment\n\nnode 3\n")
    with pytest.raises(ValueError, match=rf"{hosts}:4: 'node 3' is not a daemon's address"):
        read_hosts(str(hosts))
    hosts.write_text("node1\nnode2:9100  # a comment\nhttps://node3:10040\n")
    assert read_hosts(str(hosts)) == [
        "http://node1:10040",
        "http://node2:9100",
        "https://node3:10040",
    ]
