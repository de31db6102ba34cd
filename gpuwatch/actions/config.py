"""The `actions:` section of the config: what gpuwatch may do to the node on its own.

Off unless enabled. Slurm draining follows the verdict only for the causes named, never for a
degraded one, and stops when too much of the partition is already out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpuwatch.text.units import parse_duration
from gpuwatch.text.yamlfile import (
    Checker,
    PathKey,
    YamlDoc,
    boolean,
    one_of,
    positive_duration,
    text,
    whole_number,
)


@dataclass(frozen=True, slots=True)
class SlurmActions:
    enabled: bool = False
    # Log and journal what would be done; never call scontrol to change anything.
    dry_run: bool = False
    # Cause keys (shell-style patterns: xid-*, gpu-missing-*) whose unhealthy verdict drains.
    drain_on: tuple[str, ...] = ()
    # Put the node back once nothing has made it unhealthy for `resume_after`, if gpuwatch
    # drained it (an admin's drain reason is never touched).
    resume: bool = True
    resume_after: float = 60.0
    node: str | None = None  # the node's Slurm name; None: the config's node_name
    # The partitions the circuit breaker counts; empty: the node's own.
    partitions: tuple[str, ...] = ()
    # No drain while this fraction of a partition is already drained or down by gpuwatch...
    max_drained_fraction: float = 0.1
    # ...or this many of its nodes were drained by gpuwatch in the last hour (None: no limit).
    max_drains_per_hour: int | None = 10
    scontrol: str = "scontrol"
    sinfo: str = "sinfo"
    timeout: float = 10.0  # one scontrol or sinfo run


# What makes the daemon tell the node's jobs to checkpoint: the notice that the VM goes, the
# early warnings of a GPU going bad (a row remap waiting for a reset, heat at the maximum
# operating temperature, a driver asking for a reset), and whatever actions.slurm.drain_on
# would drain for, before the drain.
CHECKPOINT_ON = ("preemption", "thermal-slowdown", "GpuRowRemapPending", "GpuTemperatureHigh",
                 "GpuRecoveryActionRequired", "GpuXidCritical")  # fmt: skip


CHECKPOINT_SIGNALS = ("USR1", "USR2", "TERM", "INT")  # as Slurm's `scancel --signal` names them


@dataclass(frozen=True, slots=True)
class CheckpointActions:
    # Cause keys and alert names (shell-style patterns) that advise the jobs to checkpoint.
    # (Not `on`, which YAML 1.1 readers, PyYAML among them, take for `true`.)
    advise_on: tuple[str, ...] = CHECKPOINT_ON
    # Also send this signal (a name of CHECKPOINT_SIGNALS) to the processes on the GPUs as the
    # advice starts, for jobs that checkpoint on one (Lightning's SLURMEnvironment, ...).
    signal: str | None = None
    # A drain for an actions.slurm.drain_on cause waits this long after the advice started.
    drain_grace: float = 0.0


@dataclass(frozen=True, slots=True)
class ActionsConfig:
    slurm: SlurmActions = SlurmActions()
    checkpoint: CheckpointActions = CheckpointActions()


SLURM_KEYS = (
    "enabled",
    "dry_run",
    "drain_on",
    "resume",
    "resume_after",
    "node",
    "partitions",
    "max_drained_fraction",
    "max_drains_per_hour",
    "scontrol",
    "sinfo",
    "timeout",
)


def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"expected a list of non-empty strings, got {value!r}")
    return tuple(value)


def _names_or_none(value: Any) -> tuple[str, ...]:
    """A list of names; an empty one turns the advice off."""
    return () if value == [] else _names(value)


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"expected a fraction above 0 and at most 1, got {value!r}")
    return float(value)


def _command(value: Any) -> str:
    """A program name looked up on PATH, or an absolute path."""
    name = text(value)
    if "/" in name and not name.startswith("/"):
        raise ValueError(f"expected a program name or an absolute path, got {value!r}")
    return name


def parse_actions(r: Checker, doc: YamlDoc, raw: Any) -> ActionsConfig:
    path: PathKey = ("actions",)
    data = r.section(raw, path, ("slurm", "checkpoint"))
    sp: PathKey = (*path, "slurm")
    s = r.section(data.get("slurm"), sp, SLURM_KEYS)
    base = SlurmActions()
    slurm = SlurmActions(
        enabled=r.value(s, sp, "enabled", boolean, False),
        dry_run=r.value(s, sp, "dry_run", boolean, False),
        drain_on=r.value(s, sp, "drain_on", _names, ()),
        resume=r.value(s, sp, "resume", boolean, True),
        resume_after=r.value(s, sp, "resume_after", positive_duration, base.resume_after),
        node=r.value(s, sp, "node", text, None),
        partitions=r.value(s, sp, "partitions", _names, ()),
        max_drained_fraction=r.value(
            s, sp, "max_drained_fraction", _fraction, base.max_drained_fraction
        ),
        max_drains_per_hour=r.value(
            s, sp, "max_drains_per_hour", whole_number(1, 1_000_000), base.max_drains_per_hour
        ),
        scontrol=r.value(s, sp, "scontrol", _command, base.scontrol),
        sinfo=r.value(s, sp, "sinfo", _command, base.sinfo),
        timeout=r.value(s, sp, "timeout", positive_duration, base.timeout),
    )
    if slurm.enabled and not slurm.drain_on:
        r.problems.append(
            doc.problem(sp, "enabled, but drain_on names no cause: nothing would ever be drained")
        )
    if "max_drains_per_hour" in s and s["max_drains_per_hour"] is None:  # null: no limit
        slurm = replace(slurm, max_drains_per_hour=None)
    cp: PathKey = (*path, "checkpoint")
    c = r.section(data.get("checkpoint"), cp, ("advise_on", "signal", "drain_grace"))
    checkpoint = CheckpointActions(
        advise_on=r.value(c, cp, "advise_on", _names_or_none, CHECKPOINT_ON),
        signal=r.value(c, cp, "signal", one_of(CHECKPOINT_SIGNALS), None),
        drain_grace=r.value(c, cp, "drain_grace", parse_duration, 0.0),
    )
    return ActionsConfig(slurm, checkpoint)
