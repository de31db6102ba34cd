"""The series a GPU's processes make: which jobs hold the GPU (always), and each process's
memory (opt-in: a series per process is a series per pid).

Which job a process belongs to is learned from the kernel (its cgroup: a Slurm job, a
Kubernetes pod, a container; host/processes.py), never from what the job pushes. The rules that
compare the GPUs one job holds (a slow GPU among its peers) read `gpuwatch_gpu_job_info`."""

from __future__ import annotations

from gpuwatch import metrics as m
from gpuwatch.model import GpuInfo, GpuProcess, Sample

MAX_JOBS_PER_GPU = 8  # time-sliced or MPS GPUs: more jobs than this are not told apart


def process_samples(info: GpuInfo, processes: tuple[GpuProcess, ...], memory: bool) -> list[Sample]:
    labels = info.labels
    jobs = sorted({(p.job_kind, p.job_id) for p in processes if p.job_id})[:MAX_JOBS_PER_GPU]
    out = [
        Sample(m.GPU_JOB, (*labels, ("scheduler", kind or "unknown"), ("job_id", ident)), 1.0)
        for kind, ident in jobs
    ]
    for p in processes if memory else ():
        about = (("pid", str(p.pid)), ("process", p.name), ("user", p.user), ("job", p.job_id))
        out.append(Sample(m.PROCESS_GPU_MEMORY, (*labels, *about), p.gpu_memory_bytes or 0.0))
    return out
