"""`gpuwatch run --simulate` for a bench, started and waited for until it serves."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

SERVING = re.compile(r"gpuwatch serving on ([\d.]+):(\d+)")
START_WITHIN_S = 30.0


def start(directory: Path, scenario: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    """The daemon on `scenario`, its state and log (`daemon.log`) in `directory`: the
    process, its base URL (`http://HOST:PORT`) and the log. RuntimeError with the log when it
    exits or does not serve within START_WITHIN_S; the caller stops the process."""
    log = directory / "daemon.log"
    with open(log, "wb") as out:  # the daemon keeps its own descriptor
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuwatch",
                "run",
                "--simulate",
                str(scenario),
                "--listen",
                "127.0.0.1:0",
                "--state-dir",
                str(directory / "state"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + START_WITHIN_S
    while (found := SERVING.search(log.read_text())) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"daemon did not start:\n{log.read_text()}")
        time.sleep(0.1)
    return proc, f"http://{found.group(1)}:{found.group(2)}", log
