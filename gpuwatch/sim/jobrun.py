"""Starting the simulated training job next to a simulated daemon, and stopping it with it."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import signal
import sys
import time

from gpuwatch.clock import within
from gpuwatch.serve.runner import Running
from gpuwatch.sim.job import JOB_NAME, SLURM_JOB_ID
from gpuwatch.sim.library import SimulatedNvml

log = logging.getLogger(__name__)


async def run_simulated_job(running: Running, nvml: SimulatedNvml, scenario: str) -> None:
    """Runs until cancelled (when the daemon stops); never returns on its own. Only a training
    workload has a job; for any other this just waits."""
    node = nvml.node
    if node.scenario.workload != "training":
        await asyncio.Event().wait()
    speed = getattr(nvml.clock, "speed", 1.0)
    wall_start = time.time() - (nvml.clock.now() - node.start) / speed
    env = {
        **os.environ,
        "SLURM_JOB_ID": SLURM_JOB_ID,
        "SLURM_JOB_NAME": JOB_NAME,
        "SLURM_JOB_USER": getpass.getuser(),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuwatch.sim.job",
        "--scenario",
        scenario,
        "--socket",
        str(running.push_path),
        "--wall-start",
        repr(wall_start),
        "--speed",
        repr(speed),
        env=env,
    )
    node.pids.append(proc.pid)
    log.info(
        "simulated training job %s (Slurm job %s) started, pid %d", JOB_NAME, SLURM_JOB_ID, proc.pid
    )
    try:
        code = await proc.wait()
        if code == -signal.SIGTERM:  # sent to the whole group (timeout(1), systemd) as to us
            log.info("simulated training job stopped by SIGTERM")
        else:
            log.warning("simulated training job exited with %d", code)
        await asyncio.Event().wait()
    finally:
        node.pids.remove(proc.pid)
        if proc.returncode is None:
            proc.terminate()
            with contextlib.suppress(TimeoutError):
                await within(proc.wait(), 5.0)
