"""The fleet circuit breaker: no drain while too much of the partition is already out.

The scheduler's own state is the fleet-wide view, so there is no database of our own to keep
in step: each node's gpuwatch asks Slurm, before it drains, how many nodes of its partitions
gpuwatch has taken out (drained or down, with a reason gpuwatch set) and how many of those
it took out in the last hour (the reason's time). A bad rule or a driver update that makes
every node look broken then takes out a few nodes, not the fleet.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuwatch.actions.slurm import SlurmNode

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class Hold:
    """Why a drain is held: `why` is "fraction" or "rate"; `message` says it with numbers."""

    why: str
    partition: str
    message: str


def hold(
    nodes: Iterable[SlurmNode],
    partitions: Iterable[str],
    now: float,
    max_fraction: float,
    max_per_hour: int | None,
) -> Hold | None:
    """The first partition where draining one more node would break a limit, or None.

    A partition holds drains once gpuwatch has `max_fraction` of its nodes out already (so
    the first drain of a small partition is allowed: 0 of 8 out is under 10 %), or once
    `max_per_hour` of its nodes were taken out by gpuwatch in the last hour.
    """
    listed = list(nodes)
    for partition in partitions:
        members = [n for n in listed if partition in n.partitions]
        if not members:
            continue
        out = [n for n in members if n.by_gpuwatch and n.out_of_service]
        if len(out) / len(members) >= max_fraction:
            return Hold(
                "fraction",
                partition,
                f"gpuwatch has {len(out)} of {len(members)} nodes of partition {partition} "
                f"out already (max_drained_fraction {max_fraction:g})",
            )
        recent = [n for n in out if n.reason_time is not None and n.reason_time > now - HOUR_S]
        if max_per_hour is not None and len(recent) >= max_per_hour:
            return Hold(
                "rate",
                partition,
                f"gpuwatch took {len(recent)} nodes of partition {partition} out in the last "
                f"hour (max_drains_per_hour {max_per_hour})",
            )
    return None
