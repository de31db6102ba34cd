"""The state directory: private to the daemon whatever the umask, and one daemon's alone."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.conftest import start_daemon, stop_daemon, wait_for


def test_state_files_are_private_and_a_second_daemon_is_refused_first(tmp_path: Path) -> None:
    old = os.umask(0o022)  # a shell's usual umask, which the daemon inherits
    try:
        daemon = start_daemon(tmp_path, "--simulate", "healthy")
    finally:
        os.umask(old)
    state = tmp_path / "state"
    try:
        wait_for(lambda: (state / "notify.db").exists() and (state / "journal.db").exists())
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        files = [p for p in state.rglob("*") if p.is_file()]
        assert files
        loose = {
            p.name: oct(stat.S_IMODE(p.stat().st_mode))
            for p in files
            if stat.S_IMODE(p.stat().st_mode) & 0o077
        }
        assert loose == {}
        before = sorted(
            (p.name, p.stat().st_mtime_ns)
            for p in state.iterdir()
            if p.is_file() and p.suffix == ".json"
        )
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpuwatch",
                "run",
                "--listen",
                "127.0.0.1:0",
                "--state-dir",
                str(state),
                "--simulate",
                "healthy",
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0
        assert f"state directory {state} is in use by another gpuwatch (pid {daemon.proc.pid})" in (
            second.stderr + second.stdout
        )
        after = sorted(
            (p.name, p.stat().st_mtime_ns)
            for p in state.iterdir()
            if p.is_file() and p.suffix == ".json"
        )
        assert after == before
        status, _, _ = daemon.get("/healthz")
        assert status == 200
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
