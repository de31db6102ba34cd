"""What a job is called, by the kind of thing that runs it (its cgroup says which)."""

from __future__ import annotations

JOB_NOUNS = {
    "slurm": "Slurm job",
    "kubernetes": "Kubernetes pod",
    "docker": "Docker container",
    "containerd": "containerd container",
}
