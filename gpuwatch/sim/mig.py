"""MIG layouts as the simulator plays them: nvidia-smi's profile names and the GPU instance
ids the driver hands the instances."""

from __future__ import annotations

import re

from gpuwatch.sim.faults import Fault

MIG_PROFILE = re.compile(r"^([1-7])g\.(\d+)gb$")
# GPU instance ids as the driver hands them out on A100/H100, by compute slices.
_GI_IDS = {7: (0,), 4: (1,), 3: (1, 2), 2: (3, 4, 5), 1: (7, 8, 9, 10, 11, 12, 13)}


def instance_ids(profiles: tuple[str, ...]) -> tuple[int, ...]:
    """The GPU instance ids the driver hands a MIG layout's instances, in order: the first
    free id of the profile's size, as on A100 and H100."""
    taken: list[int] = []
    for profile in profiles:
        match = MIG_PROFILE.match(profile)
        slices = int(match.group(1)) if match else 1
        taken.append(next(i for i in (*_GI_IDS.get(slices, ()), *range(14, 64)) if i not in taken))
    return tuple(taken)


def instance_misfit(fault: Fault, profiles: tuple[str, ...]) -> tuple[str, str] | None:
    if fault.instance is None:
        return None
    if not profiles:
        return "instance", f"GPU {fault.gpu} is not in MIG mode (node.mig)"
    ids = instance_ids(profiles)
    if fault.instance not in ids:
        return "instance", f"GPU {fault.gpu}'s GPU instances are {', '.join(map(str, ids))}"
    return None
