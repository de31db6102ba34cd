"""What readers see of the node after a cycle: its batch, the verdicts judged from it, and
what the jobs pushed."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwatch.health.verdict import Verdict
from gpuwatch.model import Batch, Sample


@dataclass
class NodeView:
    """The last cycle's batch and verdicts, replaced whole each cycle (readers keep a
    reference to one and never see it half-written)."""

    batch: Batch | None = None
    gpu_verdicts: dict[int, Verdict] = field(default_factory=dict)
    node_verdict: Verdict | None = None
    pushed: list[Sample] = field(default_factory=list)  # the jobs' series, for job reports
