"""Which GPU a push speaks for, learned from the kernel, never from what the job wrote.

A push on a unix socket comes with its sender's pid (SO_PEERCRED). The GPUs that process
holds (NVML's process list), or failing that the GPUs its job holds, are the ones it may speak
for. "Its job" is its cgroup's: the cgroup path down to the job's own directory
(`/system.slice/slurmstepd.scope/job_81234`), which must be the same path as a GPU process's.
Never the environment (anyone can start a process with SLURM_JOB_ID set), and never a job
directory of the same name elsewhere (a user may create `job_81234` in the cgroup subtree
systemd delegates to them, under user.slice, but not under Slurm's). When that is one GPU,
the push's series gain that GPU's `gpu` and `uuid`; when the job holds several, a `gpu` the
job wrote (kept as `exported_gpu`, see parse.py) picks one of them, and one it does not hold
picks nothing. A push over TCP, with the token, has no process to ask and speaks for no GPU.

The labels only say whose alert it is (a job report, the page's `running` line): a job's
series judge nothing whatever labels they carry (rules/provenance.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuwatch.host.processes import CGROUP_JOBS
from gpuwatch.model import GpuState, Labels, Sample

# The job's own word for its GPU, renamed on the way in; read only to choose among GPUs
# the kernel already says the job holds.
CLAIMED = "exported_gpu"

JobOf = Callable[[int], str]  # pid -> its job's cgroup path; "" for none
RECHECK_S = 5.0  # a pid's job is read again after this long (a pid reused meanwhile is rare)
MAX_PIDS = 4096


def job_cgroup(text: str) -> str:
    """The cgroup path (of /proc/PID/cgroup's `text`) down to its job's directory, or ""."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for _, pattern in CGROUP_JOBS:
            found = pattern.search(path)
            if found is not None:
                return path[: found.end(1)]
    return ""


class CgroupJobs:
    """pid -> its job's cgroup path, read from /proc, remembered for RECHECK_S."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self._seen: dict[int, tuple[float, str]] = {}

    def __call__(self, pid: int) -> str:
        now = time.monotonic()
        seen = self._seen.get(pid)
        if seen is not None and now - seen[0] < RECHECK_S:
            return seen[1]
        try:
            job = job_cgroup((self.proc / str(pid) / "cgroup").read_text())
        except OSError:
            job = ""
        if len(self._seen) >= MAX_PIDS:
            self._seen.clear()
        self._seen[pid] = (now, job)
        return job


class Attribution:
    def __init__(self, gpus: Callable[[], Sequence[GpuState]], job_of: JobOf | None = None) -> None:
        self._gpus = gpus  # the GPUs as the last cycle read them, with their processes
        self._job_of = job_of or CgroupJobs()

    def held_by(self, pid: int) -> dict[str, GpuState]:
        """The GPUs process `pid` holds, else those its job holds; by index."""
        gpus = self._gpus()
        own = {str(g.info.index): g for g in gpus if any(p.pid == pid for p in g.processes)}
        if own:
            return own
        job = self._job_of(pid)
        if not job:
            return {}
        return {
            str(g.info.index): g
            for g in gpus
            if any(self._job_of(p.pid) == job for p in g.processes)
        }

    def stamp(self, samples: list[Sample], pid: int | None) -> list[Sample]:
        """`samples` with the GPU their sender may speak for; unchanged when none."""
        if pid is None or pid <= 0:
            return samples
        held = self.held_by(pid)
        if not held:
            return samples
        only = next(iter(held.values())) if len(held) == 1 else None
        stamped: dict[Labels, Labels] = {}  # a push's series mostly share their labels
        out: list[Sample] = []
        for s in samples:
            labels = stamped.get(s.labels)
            if labels is None:
                labels = stamped[s.labels] = _with_gpu(s.labels, only, held)
            out.append(Sample(s.name, labels, s.value))
        return out


def _with_gpu(labels: Labels, only: GpuState | None, held: dict[str, GpuState]) -> Labels:
    gpu = only or held.get(next((v for k, v in labels if k == CLAIMED), ""))
    if gpu is None:
        return labels
    return tuple(sorted((*labels, ("gpu", str(gpu.info.index)), ("uuid", gpu.info.uuid))))
