"""A simulated training job: one process, one rank per GPU, reporting step, loss and throughput
through gpuwatch.client to the daemon's push socket, the same path a real job's reports take.

`gpuwatch run --simulate SCENARIO` starts it for a training workload with the environment a
Slurm job has (SLURM_JOB_ID and friends), and the simulated NVML lists its pid as the compute
process on every GPU, so the daemon attributes the GPUs to "Slurm job 81234". The scenario's job
faults show in its reports: nan_loss makes a rank's loss NaN, step_stall and nccl_hang freeze a
rank's step, idle_with_memory makes a rank stop reporting (its GPU idles, memory held),
input_bound slows its steps to a third (its GPU waits on the data loader), and cuda_oom makes it
catch CUDA's out-of-memory error every OOM_EVERY_S and count it (its GPU's memory at the edge).
The job follows the daemon's simulated clock and exits when the daemon does.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import time

from gpuwatch.client import JobReporter
from gpuwatch.sim.faults import JOB_FAULT_KINDS
from gpuwatch.sim.node import CHECKPOINT_EVERY_S, CHECKPOINT_LENGTH_S
from gpuwatch.sim.noise import hash01
from gpuwatch.sim.scenario import Scenario, load_scenario

SLURM_JOB_ID = "81234"
OOM_EVERY_S = 30.0  # a rank in cuda_oom hits CUDA's out-of-memory error this often
JOB_NAME = "llama"


def active_faults(scenario: Scenario, rank: int, elapsed: float) -> set[str]:
    return {
        f.kind
        for f in scenario.faults
        if f.kind in JOB_FAULT_KINDS and f.gpu == rank and f.active(elapsed)
    }


def in_checkpoint(elapsed: float) -> bool:
    return elapsed > CHECKPOINT_EVERY_S and elapsed % CHECKPOINT_EVERY_S < CHECKPOINT_LENGTH_S


class TrainingJob:
    """The job's ranks as time passes: each `at(elapsed)` gives every reporting rank's
    values then (a rank that stopped reporting is left out). Used by the job process here
    and by bench/detection.py, which plays scenarios at speed without a process."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.steps = [0.0 for _ in range(scenario.gpus)]
        self.ooms = [0 for _ in range(scenario.gpus)]
        self._oom_due = [0.0 for _ in range(scenario.gpus)]
        self._last = 0.0

    def at(self, elapsed: float) -> dict[int, dict[str, float]]:
        dt = max(0.0, elapsed - self._last)
        self._last = elapsed
        out: dict[int, dict[str, float]] = {}
        for r in range(self.scenario.gpus):
            faults = active_faults(self.scenario, r, elapsed)
            if "idle_with_memory" in faults:
                continue  # the rank stopped working and reporting; its memory stays held
            frozen = bool(faults & {"step_stall", "nccl_hang"}) or in_checkpoint(elapsed)
            # Waiting on its data loader, a rank makes a third of its steps (input_bound).
            pace = 0.35 if "input_bound" in faults else 1.0
            if not frozen:
                self.steps[r] += dt * 2.0 * pace  # two steps a second
            if "cuda_oom" in faults and elapsed >= self._oom_due[r]:
                # Caught, the batch skipped, training goes on: one more every OOM_EVERY_S.
                self.ooms[r] += 1
                self._oom_due[r] = elapsed + OOM_EVERY_S
            step = self.steps[r]
            noise = hash01(self.scenario.seed, r, int(step)) - 0.5
            loss = (
                math.nan
                if "nan_loss" in faults
                else 2.4 * math.exp(-step / 4000) + 0.6 + 0.02 * noise
            )
            out[r] = {
                "step": float(int(step)),
                "loss": loss,
                "tokens_per_second": 0.0 if frozen else 3.1e5 * pace * (1 + 0.02 * noise),
            }
            if self.ooms[r]:
                out[r]["oom_total"] = float(self.ooms[r])
        return out


def run(scenario: Scenario, socket_path: str, wall_start: float, speed: float) -> None:
    interval = min(1.0, max(0.25, 1.0 / speed))  # at most 4 reports a second per rank
    # Rank r runs on GPU r, and says so: its alerts (a NaN loss) then name their GPU.
    reporters = [
        JobReporter(
            JOB_NAME, rank=r, socket_path=socket_path, interval=interval, labels={"gpu": str(r)}
        )
        for r in range(scenario.gpus)
    ]
    job = TrainingJob(scenario)
    heeded = [False] * scenario.gpus  # each rank checkpoints once per spell of advice
    parent = os.getppid()
    while os.getppid() == parent:  # the daemon that started us is still there
        elapsed = (time.time() - wall_start) * speed  # the scenario's time, as the daemon's
        for rank, values in job.at(elapsed).items():
            reporter, ooms = reporters[rank], values.pop("oom_total", 0.0)
            while reporter.ooms < ooms:
                reporter.out_of_memory()  # as a loop that catches CUDA's error counts it
            # The loop docs/jobs.md shows: told to checkpoint, save and say so.
            advised = reporter.should_checkpoint()
            if advised and not heeded[rank]:
                reporter.checkpointed()
            heeded[rank] = advised
            reporter.report(**values)
        time.sleep(interval)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m gpuwatch.sim.job")
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--wall-start", type=float, required=True, help="wall time at time 0")
    parser.add_argument("--speed", type=float, default=1.0)
    args = parser.parse_args()
    # Ctrl-C in a terminal reaches the whole process group: the daemon stops the job itself
    # as it stops, without a KeyboardInterrupt's traceback here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    run(load_scenario(args.scenario), args.socket, args.wall_start, args.speed)


if __name__ == "__main__":
    main()
