"""The fleet circuit breaker: no drain while too much of the partition is already out.

The scheduler's own state is the fleet-wide view, so there is no database of our own to keep
in step: each node's gpuwatch asks Slurm, before it drains, how many nodes of its partitions
gpuwatch has taken out (drained or down, with a reason gpuwatch set) and how many of those
it took out in the last hour (the reason's time). A bad rule or a driver update that makes
every node look broken then takes out a few nodes, not the fleet.
"""

from __future__ import annotations

import math
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


def raced(
    nodes: Iterable[SlurmNode],
    partitions: Iterable[str],
    me: str,
    now: float,
    *,
    max_fraction: float,
    max_per_hour: int | None,
) -> Hold | None:
    """After draining `me`: whether drains that raced it took the room first. Nodes all over a
    fleet may check the breaker in the same second (a bad rule reloaded everywhere) and each see
    room. So each looks again after its drain: of the nodes gpuwatch has out, the breaker lets
    them stay in the order they went out (the reason's time, then the name, which every node
    sees alike) up to the limits; `me` past them is one too many and must be undone."""
    listed = list(nodes)
    for partition in partitions:
        members = [n for n in listed if partition in n.partitions]
        out = sorted(
            (n for n in members if n.by_gpuwatch and n.out_of_service),
            key=lambda n: (n.reason_time or 0.0, n.name),
        )
        names = [n.name for n in out]
        if me not in names:
            continue
        room = max(1, math.ceil(max_fraction * len(members) - 1e-9))
        if names.index(me) >= room:
            return Hold(
                "fraction",
                partition,
                f"{len(out)} of {len(members)} nodes of partition {partition} went out at once; "
                f"{room} may (max_drained_fraction {max_fraction:g})",
            )
        recent = [n.name for n in out if n.reason_time is not None and n.reason_time > now - HOUR_S]
        if max_per_hour is not None and me in recent and recent.index(me) >= max_per_hour:
            return Hold(
                "rate",
                partition,
                f"{len(recent)} nodes of partition {partition} went out in the last hour; "
                f"{max_per_hour} may (max_drains_per_hour {max_per_hour})",
            )
    return None
