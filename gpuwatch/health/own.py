"""The daemon's own troubles as causes of the node's verdict: state files it cannot write, and
damaged ones it set aside."""

from __future__ import annotations

from gpuwatch.health.verdict import Cause, Health
from gpuwatch.state.statedir import DAMAGED, StateProblems


def state_causes(problems: StateProblems) -> list[Cause]:
    out = [
        Cause(
            f"state-write-{name}",
            Health.DEGRADED,
            f"state file {name} cannot be written ({error}): events or notifications "
            "wait in memory",
            "free space on the state directory's file system, or fix its permissions",
        )
        for name, error in problems.failing()
    ]
    for path in problems.damaged():
        original = path.name.rpartition(DAMAGED)[0]
        out.append(
            Cause(
                f"state-damaged-{path.name}",
                Health.DEGRADED,
                f"state file {original} was damaged and set aside as {path}; a fresh one "
                "was started, and what the damaged one held is not in it",
                f"look at it if the history matters, then delete it: rm {path}*",
            )
        )
    return out
