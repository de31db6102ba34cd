"""Which GPU a push speaks for, learned from the kernel, never from what the job wrote.

A push on a unix socket comes with its sender's pid (SO_PEERCRED). The GPUs that process
holds (NVML's process list), or failing that the GPUs its job holds (the job from its cgroup,
as the GPUs' own processes are named), are the ones it may speak for. When that is one GPU,
the push's series gain that GPU's `gpu` and `uuid`; when the job holds several, a `gpu` the
job wrote (kept as `exported_gpu`, see parse.py) picks one of them, and one it does not hold
picks nothing. A push over TCP, with the token, has no process to ask and speaks for no GPU.

The labels only say whose alert it is (a job report, the page's `running` line): a job's
series judge nothing whatever labels they carry (rules/provenance.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuwatch.host.processes import ProcessLookup
from gpuwatch.model import GpuState, Labels, Sample

# The job's own word for its GPU, renamed on the way in; read only to choose among GPUs
# the kernel already says the job holds.
CLAIMED = "exported_gpu"

JobOf = Callable[[int], tuple[str, str]]  # pid -> (job kind, job id); ("", "") for none


def job_of_process(lookup: ProcessLookup) -> JobOf:
    """A process's job as the GPUs' processes are named: from its cgroup, else its
    environment where readable."""

    def job_of(pid: int) -> tuple[str, str]:
        found = lookup.describe(pid, None)
        return ("", "") if found is None else (found.job_kind, found.job_id)

    return job_of


class Attribution:
    def __init__(self, gpus: Callable[[], Sequence[GpuState]], job_of: JobOf | None = None) -> None:
        self._gpus = gpus  # the GPUs as the last cycle read them, with their processes
        self._job_of = job_of or job_of_process(ProcessLookup())

    def held_by(self, pid: int) -> dict[str, GpuState]:
        """The GPUs process `pid` holds, else those its job holds; by index."""
        gpus = self._gpus()
        own = {str(g.info.index): g for g in gpus if any(p.pid == pid for p in g.processes)}
        if own:
            return own
        kind, job_id = self._job_of(pid)
        if not job_id:
            return {}
        return {
            str(g.info.index): g
            for g in gpus
            if any((p.job_kind, p.job_id) == (kind, job_id) for p in g.processes)
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
