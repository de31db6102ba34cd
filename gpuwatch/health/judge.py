"""The verdict over time: what one sample cannot show.

- XIDs: a critical XID keeps its GPU unhealthy until the GPU is reset, the node reboots (the
  journal restores only this boot's XIDs) or an operator acknowledges it; a warning XID keeps it
  degraded for an hour. Application and info XIDs leave the GPU healthy, as NVIDIA's device
  plugin does.
- Causes raised by alerts (raised.py): error rates, counts over a limit, a GPU that has not
  answered for long; the rule packs hold their thresholds.
- GPU resets, seen as volatile ECC counts going down or a lost GPU coming back: they clear the
  GPU's XIDs.
- Acknowledgements (acks.AckStore): an acknowledged cause is listed but no longer counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from gpuwatch.health.acks import AckStore
from gpuwatch.health.raised import RaisedCause, merged
from gpuwatch.health.verdict import (
    Cause,
    GpuFacts,
    Health,
    Verdict,
    all_facts,
    as_action,
    gpu_facts,
    node_verdict,
    sample_causes,
    status_cause,
    verdict_of,
)
from gpuwatch.model import BackendState, GpuState, GpuStatus, MissingGpu, PerPart, Sample
from gpuwatch.text.timefmt import rfc3339
from gpuwatch.xid.counter import OTHER, OWN_SERIES_BELOW, UNLISTED_PER_GPU, xid_label
from gpuwatch.xid.entry import WARNING_HOLD_S
from gpuwatch.xid.known import lookup

# An acknowledged cause an alert raises is remembered this long after the alert goes quiet:
# a GPU that stalls for a few seconds makes its series stale and its alerts resolve and fire
# again, and a restarted daemon's rate alerts need their windows back before they fire.
RAISED_ACK_GRACE_S = 300.0


@dataclass
class _Seen:
    first: float
    last: float
    count: int = 1


@dataclass
class _GpuMemory:
    # By code, since the last reset: a storm of one XID costs one entry, not one each.
    xids: dict[int, _Seen] = field(default_factory=dict)
    volatile_ecc: list[float | None] = field(default_factory=lambda: [None, None])  # last read


def missing_cause(gpu: MissingGpu) -> Cause:
    return Cause(
        f"gpu-missing-{gpu.uuid}",
        Health.UNHEALTHY,
        f"GPU {gpu.uuid} ({gpu.model}, serial {gpu.serial}, bus {gpu.pci_bus_id}, "
        f"last seen as GPU {gpu.index}) is missing: the driver no longer lists it",
        "drain the node and reboot it; reseat or RMA the GPU if it stays missing; "
        "acknowledge it if it was removed on purpose",
    )


def _reset_seen(memory: _GpuMemory, facts: GpuFacts) -> bool:
    """A GPU reset zeroes the volatile ECC counts; nothing else in NVML shows one. A cycle that
    could not read them changes nothing."""
    seen = False
    for i, now in enumerate((facts.sbe_volatile, facts.dbe_volatile)):
        if now is not None:
            before = memory.volatile_ecc[i]
            seen = seen or (before is not None and now < before)
            memory.volatile_ecc[i] = now
    return seen


class HealthJudge:
    def __init__(self, acks: AckStore) -> None:
        self.acks = acks
        self._gpus: dict[str, _GpuMemory] = {}
        # Each GPU's last (UUID, status), by index: one lost when the daemon came has no UUID
        # until it is back on the bus, and its coming back clears the XIDs the kernel log had
        # for it; another GPU at the index (after a re-enumeration) clears nothing.
        self._status: dict[int, tuple[str, GpuStatus]] = {}
        self._raised_at: dict[tuple[str, str], float] = {}  # (uuid, key) -> last raised
        self.node_causes: tuple[Cause, ...] = ()  # the node's own that count now
        self._slow_facts = PerPart(gpu_facts)

    def record_xid(self, uuid: str, time: float, code: int) -> None:
        xids = self._gpus.setdefault(uuid, _GpuMemory()).xids
        seen = xids.get(code)
        if seen is None:
            xids[code] = _Seen(time, time)
        else:  # restored from the journal, or reported late: not always in order
            seen.first, seen.last, seen.count = (
                min(seen.first, time),
                max(seen.last, time),
                seen.count + 1,
            )

    def judge(
        self,
        now: float,
        backend: BackendState,
        gpus: list[GpuState],
        samples: Iterable[Sample],
        *,
        slow: list[list[Sample]] | None = None,
        own: Iterable[Cause] = (),
        raised: Iterable[RaisedCause] = (),
    ) -> tuple[dict[int, Verdict], Verdict]:
        """Verdicts per GPU and for the node from this cycle's samples and the slow tier's
        last (Batch.slow); `own` are the node's causes that are not about a GPU (the daemon's
        state files), `raised` the causes firing alerts raise."""
        facts = all_facts(gpu_facts(samples), *self._slow_facts(slow or []))
        by_gpu: dict[str, list[Cause]] = {}
        listed = {g.info.uuid for g in gpus}
        for r in raised:
            uuid = r.uuid if r.uuid in listed else ""  # naming no GPU listed: the node's
            by_gpu.setdefault(uuid, []).append(r.cause)
            self._raised_at[(uuid, r.cause.key)] = now
        self._raised_at = {
            k: t for k, t in self._raised_at.items() if t >= now - RAISED_ACK_GRACE_S
        }
        verdicts = {
            g.info.index: self._judge_gpu(
                now, g, facts.get(g.info.uuid, GpuFacts()), by_gpu.pop(g.info.uuid, [])
            )
            for g in gpus
        }
        node = node_verdict(backend, verdicts)
        missing = [missing_cause(g) for g in backend.missing] if backend.up else []
        elsewhere = by_gpu.get("", [])
        # Only a backend that answers shows which missing GPUs have come back.
        causes, acked = self._with_acks("", merged([*missing, *own], elsewhere), prune=backend.up)
        self.node_causes = tuple(causes)
        return verdicts, verdict_of([*node.causes, *causes], [*node.acknowledged, *acked])

    def _judge_gpu(
        self, now: float, gpu: GpuState, facts: GpuFacts, raised: list[Cause]
    ) -> Verdict:
        uuid = gpu.info.uuid
        memory = self._gpus.setdefault(uuid, _GpuMemory())
        was, before = self._status.get(gpu.info.index, (uuid, GpuStatus.OK))
        came_back = before == GpuStatus.LOST and gpu.status == GpuStatus.OK and was in ("", uuid)
        self._status[gpu.info.index] = (uuid, gpu.status)
        lost = status_cause(gpu)
        if lost is not None:
            # What alerts say of its readings adds nothing to a GPU that cannot be read, but
            # an alert on its state (GpuUnresponsive) does.
            raised = [c for c in raised if c.key == lost.key]
            causes = [lost, *self._xid_causes(now, memory)]
        else:
            if _reset_seen(memory, facts) or came_back:
                memory.xids.clear()
            causes = [*sample_causes(facts), *self._xid_causes(now, memory)]
        index = gpu.info.index
        causes = [
            replace(
                c,
                reason=f"GPU {index} {c.reason}"
                if c.reason.startswith("is ")
                else f"GPU {index}: {c.reason}",
            )
            for c in causes
        ]
        # An alert's summary usually names its GPU; one that does not gets the name.
        raised = [
            c if f"GPU {index}" in c.reason else replace(c, reason=f"GPU {index}: {c.reason}")
            for c in raised
        ]
        counted, acked = self._with_acks(uuid, merged(causes, raised), prune=lost is None)
        return verdict_of(counted, acked)

    def _with_acks(
        self, uuid: str, causes: list[Cause], prune: bool
    ) -> tuple[list[Cause], list[Cause]]:
        if prune:  # only a GPU read in full shows which causes have cleared
            recent = {k for (u, k) in self._raised_at if u == uuid}
            self.acks.keep_only(uuid, {c.key for c in causes} | recent)
        counted = [c for c in causes if not self.acks.covers(uuid, c)]
        acked = [c for c in causes if self.acks.covers(uuid, c)]
        return counted, acked

    @staticmethod
    def _xid_causes(now: float, memory: _GpuMemory) -> list[Cause]:
        out: list[Cause] = []
        for code, seen in sorted(memory.xids.items()):
            xid = lookup(code)
            if xid.holds_until_reset:
                state = Health.UNHEALTHY
            elif xid.holds_for_a_while and seen.last >= now - WARNING_HOLD_S:
                state = Health.DEGRADED
            else:
                continue
            count = (
                f"{seen.count} times since {rfc3339(seen.first)}"
                if seen.count > 1
                else (f"at {rfc3339(seen.first)}")
            )
            what = f"XID {code} ({xid.meaning})"
            if code == OTHER:
                what = (
                    f"XIDs of codes above {OWN_SERIES_BELOW - 1} that NVIDIA has not numbered "
                    f"(after the first {UNLISTED_PER_GPU} such codes):"
                )
            out.append(
                Cause(
                    f"xid-{xid_label(code)}",
                    state,
                    f"{what} {count}",
                    as_action(xid.action),
                    str(seen.count),
                )
            )
        return out
