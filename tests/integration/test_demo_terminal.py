"""`gpuwatch demo` in a terminal that goes away (an SSH session dropped, tmux killed): it ends,
as a program in a terminal does, frees its port and leaves nothing in the temporary
directory. Before, the dashboard's output thread wedged the event loop on the dead terminal
and the demo held its port for good, answering nothing, deaf to SIGTERM."""

from __future__ import annotations

import contextlib
import os
import pty
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import wait_for
from tests.prometheus_server import free_port


def test_a_demo_whose_terminal_hangs_up_ends_and_cleans_up(tmp_path: Path) -> None:
    port = free_port()
    temporary = Path(tempfile.mkdtemp(prefix="gpuwatch-demo-test-"))
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "demo", "--listen", f"127.0.0.1:{port}"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        preexec_fn=lambda: os.login_tty(slave),  # noqa: PLW1509
        env={
            **os.environ,
            "TMPDIR": str(temporary),
            "TERM": "xterm-256color",
            "COLUMNS": "120",
            "LINES": "40",
        },
    )
    os.close(slave)
    os.set_blocking(master, False)
    try:

        def drawn() -> bool:
            # Keep the terminal's output read, as a terminal does, until the dashboard runs.
            with contextlib.suppress(OSError):  # BlockingIOError: nothing new yet
                os.read(master, 65536)
            return len(list(temporary.glob("gpuwatch-*"))) == 2  # state dir and sim host

        wait_for(drawn, timeout=60)
        time.sleep(3)  # the dashboard drawing, the daemon serving
        os.close(master)  # the terminal goes away: the kernel hangs its session up
        assert proc.wait(timeout=20) == 128 + 1  # ended by SIGHUP, on purpose
        assert list(temporary.iterdir()) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for leftover in temporary.glob("*"):
            subprocess.run(["rm", "-rf", str(leftover)], check=False)
        temporary.rmdir()
