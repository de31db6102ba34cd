"""Draining the node in Slurm when its verdict is unhealthy for a cause the operator opted in,
and resuming it when nothing has made it unhealthy for a while.

It follows the verdict, never leads it: it sees each cycle's verdict (`observe`), and acts in a
task of its own, so a slow or hung `scontrol` delays nothing else. It undoes only its own drain
(the reason carries gpuwatch's prefix; an admin's drain is never resumed), asks the circuit
breaker before every drain, and tells of every step: an `action` event in the journal, a log
line, and metrics that the packed rules turn into alerts for the receivers.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from gpuwatch import metrics as m
from gpuwatch.actions.breaker import Hold, hold, raced
from gpuwatch.actions.config import SlurmActions
from gpuwatch.actions.slurm import OWN_REASON_PREFIX, SlurmCli, SlurmError, SlurmNode, own_reason
from gpuwatch.clock import Clock, wait_event
from gpuwatch.health.verdict import Cause, Health, Verdict
from gpuwatch.health.view import NodeView
from gpuwatch.model import Event, Sample
from gpuwatch.text.timefmt import rfc3339

log = logging.getLogger(__name__)

RECHECK_S = 60.0  # while there is something to do: look at Slurm again this often
MAX_BACKOFF_S = 300.0  # after failures: at most this long between tries
GPU_NAMED = re.compile(r"^GPU \d+")


@dataclass(frozen=True, slots=True)
class _Drained:
    causes: str  # the cause keys, as the reason names them
    dry_run: bool


def drain_reason(causes: tuple[Cause, ...]) -> str:
    """`gpuwatch: xid-79,gpu-lost GPU 1: drain the node and reboot it`: the keys, the GPU the
    first names, and what to do, within what `sinfo -R` shows whole."""
    first = causes[0]
    where = GPU_NAMED.match(first.reason)
    keys = ",".join(dict.fromkeys(c.key for c in causes))
    return own_reason(f"{keys}{' ' + where.group(0) if where else ''}: {first.action}")


def reason_causes(reason: str) -> str:
    """The cause keys of a reason gpuwatch set (the first word after its prefix)."""
    return reason[len(OWN_REASON_PREFIX) :].split(" ", 1)[0].rstrip(":")


class SlurmDrainer:
    """A watcher of the daemon: started and stopped with it, read each cycle for its metrics."""

    name = "slurm"

    def __init__(
        self,
        config: SlurmActions,
        node: str,
        clock: Clock,
        publish: Callable[[Event], None],
        cli: SlurmCli | None = None,
        *,
        advised_since: Callable[[], float | None] = lambda: None,
        grace: float = 0.0,
    ) -> None:
        self.config = config
        # When the jobs were told to checkpoint (None: not told), and how long a drain waits
        # after that: the jobs' time to save their work before the node leaves service.
        self._advised_since = advised_since
        self._grace = grace
        self._waiting_until: float | None = None  # a drain waiting for that, logged once
        self.node = config.node or node
        self.clock = clock
        self.publish = publish
        self.cli = cli or SlurmCli(config.scontrol, config.sinfo, config.timeout)
        self._wanted: tuple[Cause, ...] = ()  # the opted-in causes making the node unhealthy
        self._clear_since: float | None = None  # since when nothing makes it unhealthy
        # Whether a drain of ours may be in place: at start it may be, from before a restart.
        self._maybe_ours = True
        self._drained: _Drained | None = None  # ours, as last seen (or done, in a dry run)
        self._held: Hold | None = None
        self._told_other = ""  # an admin's reason already logged
        self._failures = 0
        self._failed_in_a_row = 0
        self._next_check: float | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- the daemon's side ---------------------------------------------------------------
    def after_cycle(self, now: float, view: NodeView) -> None:
        self.observe(now, view.node_verdict)

    def observe(self, now: float, verdict: Verdict | None) -> None:
        """The cycle's verdict. Cheap: it only wakes the task when there is something to do."""
        if verdict is None:
            return
        wanted = tuple(
            c for c in verdict.causes if c.state is Health.UNHEALTHY and self._opted_in(c.key)
        )
        if verdict.state is Health.UNHEALTHY:
            self._clear_since = None
        elif self._clear_since is None:
            self._clear_since = now
        new = {c.key for c in wanted} - {c.key for c in self._wanted}
        self._wanted = wanted
        if not wanted:
            self._held = None  # nothing left to drain for: nothing held
        # A resume that failed is retried on the backoff's schedule, not every cycle.
        if new or (self._resume_due(now) and not self._failed_in_a_row):
            self._wake.set()

    def _opted_in(self, key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, pattern) for pattern in self.config.drain_on)

    def _resume_due(self, now: float) -> bool:
        return (
            self.config.resume
            and self._maybe_ours
            and not self._wanted
            and self._clear_since is not None
            and now - self._clear_since >= self.config.resume_after
        )

    async def start(self) -> None:
        mode = "dry run: nothing is changed" if self.config.dry_run else "enforcing"
        log.info(
            "slurm actions for node %s (%s): drain on %s",
            self.node,
            mode,
            ", ".join(self.config.drain_on),
        )
        self._task = asyncio.create_task(self._loop(), name="slurm-actions")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def read(self) -> list[Sample]:
        return self.samples()

    def samples(self) -> list[Sample]:
        base = (("scheduler", "slurm"),)
        out = [Sample(m.ACTION_FAILURES, base, float(self._failures))]
        if self._drained is not None:
            labels = (*base, ("cause", self._drained.causes),
                      ("dry_run", str(self._drained.dry_run).lower()))  # fmt: skip
            out.append(Sample(m.ACTION_NODE_DRAINED, labels, 1.0))
        if self._held is not None:
            labels = (*base, ("why", self._held.why), ("partition", self._held.partition))
            out.append(Sample(m.ACTIONS_HELD, labels, 1.0))
        return out

    # -- the task ------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            wait = None if self._next_check is None else self._next_check - self.clock.now()
            await wait_event(self.clock, self._wake, wait)
            self._wake.clear()
            self._next_check = None
            try:
                await self._step()
            except SlurmError as exc:
                self._failures += 1
                self._failed_in_a_row += 1
                backoff = min(MAX_BACKOFF_S, 5.0 * 2 ** (self._failed_in_a_row - 1))
                log.error(
                    "slurm action on node %s failed: %s; trying again in %.0fs",
                    self.node,
                    exc,
                    backoff,
                )
                self._next_check = self.clock.now() + backoff
            except Exception:  # a bug here must not end the actions for good
                log.exception("slurm actions: step failed")
                self._next_check = self.clock.now() + RECHECK_S
            else:
                self._failed_in_a_row = 0

    async def _step(self) -> None:
        now = self.clock.now()
        if self._wanted:
            if (wait_until := self._checkpoint_time(now)) is not None:
                self._next_check = wait_until
                return
            await self._drain(now, self._wanted)
            self._next_check = now + RECHECK_S  # an admin may resume it while still unhealthy
        elif self._resume_due(now):
            await self._resume()
        elif self._drained is not None and not self.config.resume and not self.config.dry_run:
            await self._follow(now)

    def _checkpoint_time(self, now: float) -> float | None:
        """Until when a drain waits for the jobs told to checkpoint; None: it need not."""
        since = self._advised_since()
        if self._grace <= 0 or since is None or now >= since + self._grace:
            self._waiting_until = None
            return None
        until = since + self._grace
        if self._waiting_until != until:
            log.warning(
                "drain of node %s waits until %s for its jobs to checkpoint",
                self.node,
                rfc3339(until),
            )
            self._waiting_until = until
        return until

    async def _follow(self, now: float) -> None:
        """With `resume: false` an admin resumes the node: see when, so that the drained
        metric (and GpuwatchNodeDrained) ends with our drain, not with the daemon."""
        node = await self.cli.node(self.node)
        if node.drained and node.ours:
            self._next_check = now + RECHECK_S
        else:
            self._drained = None

    async def _drain(self, now: float, causes: tuple[Cause, ...]) -> None:
        if self.config.dry_run and self._drained is not None:
            return
        node = await self.cli.node(self.node)
        self._maybe_ours = True
        if node.out_of_service:
            self._saw(node)
            return
        partitions = self.config.partitions or node.partitions
        fleet = await self.cli.nodes(partitions=partitions)
        held = hold(
            fleet,
            partitions,
            now,
            self.config.max_drained_fraction,
            self.config.max_drains_per_hour,
        )
        if held is not None:
            if held != self._held:
                log.warning(
                    "not draining node %s for %s: %s",
                    self.node,
                    ",".join(c.key for c in causes),
                    held.message,
                )
                self._event("held", causes, f"drain of node {self.node} held: {held.message}")
            self._held = held
            return
        self._held = None
        reason = drain_reason(causes)
        if self.config.dry_run:
            log.warning("dry run: would drain node %s: %s", self.node, reason)
            self._event("would_drain", causes, f"would drain node {self.node}: {reason}", reason)
        else:
            await self.cli.drain(self.node, reason)
            if await self._undone_after_race(now, partitions, causes):
                return
            log.warning("drained node %s in Slurm: %s", self.node, reason)
            self._event("drain", causes, f"drained node {self.node} in Slurm: {reason}", reason)
        self._drained = _Drained(reason_causes(reason), self.config.dry_run)

    async def _undone_after_race(
        self, now: float, partitions: tuple[str, ...], causes: tuple[Cause, ...]
    ) -> bool:
        """Look again after the drain: when drains elsewhere raced this one past the limits,
        undo it and hold, as the breaker would have had it seen them."""
        fleet = await self.cli.nodes(partitions=partitions)
        held = raced(
            fleet,
            partitions,
            self.node,
            now,
            max_fraction=self.config.max_drained_fraction,
            max_per_hour=self.config.max_drains_per_hour,
        )
        if held is None:
            return False
        await self.cli.resume(self.node)
        log.warning("drained node %s, then undid it: %s", self.node, held.message)
        self._event("held", causes, f"drain of node {self.node} undone: {held.message}")
        self._held = held
        return True

    def _saw(self, node: SlurmNode) -> None:
        """The node is out already: ours to keep track of, or someone else's to leave be."""
        if node.ours:
            self._drained = _Drained(reason_causes(node.reason), False)
        elif node.reason != self._told_other:
            log.info(
                "node %s is out of service already (%s, reason %r): not draining it",
                self.node,
                "+".join(sorted(node.states)),
                node.reason,
            )
            self._told_other = node.reason

    async def _resume(self) -> None:
        self._held = None
        if self.config.dry_run:
            if self._drained is not None:
                log.warning("dry run: would resume node %s", self.node)
                self._event("would_resume", (), f"would resume node {self.node}")
            self._drained, self._maybe_ours = None, False
            return
        node = await self.cli.node(self.node)
        if not self._resume_due(self.clock.now()):  # a cause came while sinfo answered
            return
        if node.drained and node.ours:
            await self.cli.resume(self.node)
            log.warning("resumed node %s in Slurm (was: %s)", self.node, node.reason)
            self._event(
                "resume", (), f"resumed node {self.node} in Slurm (was: {node.reason})", node.reason
            )
        elif node.drained:
            log.info(
                "node %s stays drained: its reason %r is not gpuwatch's", self.node, node.reason
            )
        self._drained, self._maybe_ours = None, False

    def _event(
        self, action: str, causes: tuple[Cause, ...], message: str, reason: str = ""
    ) -> None:
        data: dict[str, int | float | str] = {"action": action, "scheduler": "slurm",
                                               "node": self.node}  # fmt: skip
        if causes:
            data["cause"] = ",".join(c.key for c in causes)
        if reason:
            data["reason"] = reason
        self.publish(Event(self.clock.now(), "action", None, None, message, data))
