"""A command whose reader leaves early (`| head -0`) ends as a pipe's writer should."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest


@pytest.mark.parametrize("args", [["xid", "48"], ["config", "check"]])
def test_a_reader_that_leaves_early_gets_the_sigpipe_status_and_no_traceback(
    args: list[str],
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes: as `| head -0` would
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=30) == 128 + signal.SIGPIPE
    assert err == ""
