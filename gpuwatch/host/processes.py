"""Which processes use a GPU, whose they are, and which job they belong to.

NVML gives the pids and their GPU memory; /proc gives each pid's name and user (NVML's pids are
checked against /proc: a pid that does not exist is dropped, as binding and driver mismatches
scramble them); the job comes from the process's cgroup (Slurm job, Kubernetes pod, Docker or
containerd container) or, failing that, from its environment where it is readable (SLURM_JOB_ID).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from pathlib import Path

from gpuwatch.host import procfs
from gpuwatch.model import GpuProcess, jobs_text

CGROUP_JOBS = (
    ("slurm", re.compile(r"/job_(\d+)(?:/|$)")),
    (
        "kubernetes",
        re.compile(
            r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
        ),
    ),
    ("containerd", re.compile(r"cri-containerd-([0-9a-f]{64})")),
    ("docker", re.compile(r"docker[-/]([0-9a-f]{64})")),
)
CACHE_LIMIT = 4096
RECHECK_S = 5.0  # how long a pid is trusted to be the same process


def with_jobs(
    message: str, data: dict[str, int | float | str], processes: Iterable[GpuProcess]
) -> tuple[str, dict[str, int | float | str]]:
    """An event's message and data naming whose work it hit (unchanged when no job is known)."""
    jobs = jobs_text(processes)
    if not jobs:
        return message, data
    return f"{message}, running {jobs}", {**data, "job": jobs}


# The cgroup subtree systemd delegates to each user (`systemd-run --user`, a user's services):
# a user may create a directory of any name there, `job_81234` included, so no job is read
# from it (Slurm's jobs are under slurmstepd.scope or /slurm, pods under kubepods).
USER_DELEGATED = "/user.slice/"


def job_from_cgroup(text: str) -> tuple[str, str]:
    """The job of a process (`/proc/PID/cgroup`'s `text`): its kind and id, or ("", "")."""
    paths = [line.split(":", 2)[-1] for line in text.splitlines()]
    for kind, pattern in CGROUP_JOBS:
        for path in paths:
            found = None if path.startswith(USER_DELEGATED) else pattern.search(path)
            if found:
                return kind, found.group(1).replace("_", "-")
    return "", ""


class ProcessLookup:
    """pid -> (name, user, job), cached per process (pid and start time). A pid described
    less than `recheck` seconds ago is taken as the same process without reading /proc again:
    at 64 GPUs sampled 10 times a second, checking every pid every time was half the daemon's
    CPU. A pid reused within that window is misnamed for at most that long."""

    def __init__(self, proc: Path = Path("/proc"), recheck: float = RECHECK_S) -> None:
        self.proc = proc
        self.recheck = recheck
        self._cache: dict[tuple[int, float], tuple[str, str, str, str]] = {}
        # pid -> (when it was checked, its key; None when there was no such process)
        self._checked: dict[int, tuple[float, tuple[int, float] | None]] = {}

    def describe(self, pid: int, gpu_memory: float | None) -> GpuProcess | None:
        now = time.monotonic()
        checked = self._checked.get(pid)
        if checked is not None and now - checked[0] < self.recheck:
            key = checked[1]
        else:
            try:
                key = (pid, procfs.start_time(pid, self.proc))
            except OSError:
                key = None  # gone, or a pid NVML got wrong: not looked for again at once
            self._checked[pid] = (now, key)
        if key is None:
            return None
        cached = self._cache.get(key)
        if cached is None:
            try:
                cached = self._look(pid)
            except OSError:
                return None
            if len(self._cache) > CACHE_LIMIT:
                self._cache.clear()
                self._checked.clear()
            self._cache[key] = cached
        name, user, kind, job_id = cached
        return GpuProcess(pid, name, user, gpu_memory, kind, job_id, key[1])

    def _look(self, pid: int) -> tuple[str, str, str, str]:
        try:
            name, user = procfs.name(pid, self.proc), procfs.username(pid, self.proc)
        except OSError:
            name, user = "?", "?"
        try:
            kind, job_id = job_from_cgroup((self.proc / str(pid) / "cgroup").read_text())
        except OSError:
            kind, job_id = "", ""
        if not job_id:
            try:
                env = procfs.environ(pid, self.proc)
            except OSError:
                env = {}
            if env.get("SLURM_JOB_ID"):
                kind, job_id = "slurm", env["SLURM_JOB_ID"]
                user = env.get("SLURM_JOB_USER", user)
        return name, user, kind, job_id
