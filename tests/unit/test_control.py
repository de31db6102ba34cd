"""The control socket: a stale one is replaced, a live one is never stolen."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gpuwatch.clients.control import ControlError, request
from gpuwatch.serve.control import clear_stale_socket


def test_a_stale_socket_is_removed_and_a_live_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gpuwatch.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: a daemon that was killed
    clear_stale_socket(path)
    assert not path.exists()

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(path))
        live.listen()
        with pytest.raises(OSError, match="another gpuwatch is serving"):
            clear_stale_socket(path)
        assert path.is_socket()


def test_a_path_that_is_not_a_socket_is_named_as_what_it_is(tmp_path: Path) -> None:
    (tmp_path / "dir.sock").mkdir()
    (tmp_path / "file.sock").write_text("notes")
    with pytest.raises(OSError, match=r"dir.sock is a directory, not a socket: remove it"):
        clear_stale_socket(tmp_path / "dir.sock")
    with pytest.raises(OSError, match=r"file.sock is a file, not a socket"):
        clear_stale_socket(tmp_path / "file.sock")
    assert (tmp_path / "file.sock").read_text() == "notes"  # never removed


def test_a_command_that_cannot_reach_the_daemon_says_why_in_words(tmp_path: Path) -> None:
    path = tmp_path / "gpuwatch.sock"
    with pytest.raises(ControlError, match="no socket there; is the daemon running"):
        request(path, "GET", "/api/v1/silences")
    with socket.socket(socket.AF_UNIX) as left_behind:  # bound, never listening: a dead daemon's
        left_behind.bind(str(path))
        with pytest.raises(ControlError, match="nothing listens on it; the daemon has stopped"):
            request(path, "GET", "/api/v1/silences")
