"""How long the commands an operator and Slurm run take, against a running daemon.

Starts `gpuwatch run --simulate` (8 GPUs, a training job) and runs each command RUNS times
as a person or slurmd would: a new process each time, its wall time from fork to exit. The
shipped health check and prolog run as they are shipped, with their paths pointed at this
checkout and at stand-ins for `sinfo` and `scontrol` that print nothing. Prints the median,
the 90th percentile and the slowest, in milliseconds, and what each printed first, so a
faster command that says something else shows.

The package's bytecode is compiled first, as `pip install` does: with PYTHONDONTWRITEBYTECODE
set (as on this VM) a module never compiled would be compiled again by every run.

    python bench/commands.py [--runs 20]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from simulated_daemon import start

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = "node: {gpus: 8, model: H100, workload: training}\nfaults: []\n"
STANDIN = "#!/bin/sh\nexit 0\n"


def gpuwatch() -> str:
    """The console script of this checkout's environment (what /opt/gpuwatch/bin holds)."""
    found = Path(sys.executable).parent / "gpuwatch"
    return str(found) if found.exists() else shutil.which("gpuwatch") or "gpuwatch"


def shipped(script: str, directory: Path, state_dir: Path) -> Path:
    """A Slurm script from deploy/slurm, its paths pointed at this checkout and the bench's
    stand-ins, as an installer's sed would."""
    text = (ROOT / "deploy" / "slurm" / script).read_text()
    standin = directory / "standin"
    standin.write_text(STANDIN)
    standin.chmod(0o755)
    for old, new in (
        ("GPUWATCH=/opt/gpuwatch/bin/gpuwatch", f"GPUWATCH={gpuwatch()}"),
        ("SCONTROL=/usr/bin/scontrol", f"SCONTROL={standin}"),
        ("SINFO=/usr/bin/sinfo", f"SINFO={standin}"),
        ("STATE_DIR=\n", f"STATE_DIR={state_dir}\n"),
        ("/run/gpuwatch-healthcheck-missed-", f"{directory}/missed-"),
    ):
        text = text.replace(old, new)
    path = directory / script
    path.write_text(text)
    path.chmod(0o755)
    return path


def timed(argv: list[str], runs: int) -> tuple[list[float], str, int]:
    """Wall times in ms of `runs` runs, the first line the last one printed, its status."""
    times, said, status = [], "", 0
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        times.append((time.perf_counter() - started) * 1000)
        said = (
            (done.stdout or done.stderr).strip().splitlines()[0][:70]
            if (done.stdout or done.stderr).strip()
            else ""
        )
        status = done.returncode
    return times, said, status


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    package = importlib.util.find_spec("gpuwatch")
    assert package is not None and package.origin is not None
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(Path(package.origin).parent)], check=True
    )
    plain, _, _ = timed([sys.executable, "-c", "pass"], args.runs)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python "
        f"{platform.python_version()}; {args.runs} runs each; plain Python "
        f"{statistics.median(plain):.0f} ms (median)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        scenario = directory / "node.yaml"
        scenario.write_text(SCENARIO)
        proc, url, _ = start(directory, scenario)
        try:
            state = directory / "state"
            exe = gpuwatch()
            commands = {
                "--version": [exe, "--version"],
                "health": [exe, "health", url],
                "health --local": [exe, "health", "--local", "--state-dir", str(state)],
                "status": [exe, "status", url],
                "job-report": [exe, "job-report", "81234", url],
                "healthcheck": [str(shipped("gpuwatch-healthcheck", directory, state))],
                "prolog": [str(shipped("gpuwatch-prolog", directory, state))],
            }
            time.sleep(3)  # the simulated job's processes seen, so job-report has a job
            print(f"{'command':16} {'p50 ms':>7} {'p90 ms':>7} {'max ms':>7}  status  said")
            for name, argv in commands.items():
                times, said, status = timed(argv, args.runs)
                p90 = sorted(times)[math.ceil(0.9 * len(times)) - 1]
                print(
                    f"{name:16} {statistics.median(times):7.0f} {p90:7.0f} {max(times):7.0f}"
                    f"  {status:6}  {said}"
                )
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
