"""The verdict over time: what one sample cannot show.

- XIDs: a critical XID keeps its GPU unhealthy until the GPU is reset, the node reboots (the
  journal restores only this boot's XIDs) or an operator acknowledges it; a warning XID keeps it
  degraded for an hour. Application and info XIDs leave the GPU healthy, as NVIDIA's device
  plugin does.
- Error rates, as DCGM's health watches judge them: NVLink CRC errors (any in 5 minutes:
  degraded; 100/s over a minute: unhealthy), NVLink replay or recovery errors (any in 5 minutes:
  unhealthy), PCIe replays above the expected rate for the link's generation and width over a
  minute (degraded). They clear once the counters stop moving.
- GPU resets, seen as volatile ECC counts going down or a lost GPU coming back: they clear the
  GPU's XIDs and error history.
- Acknowledgements (acks.AckStore): an acknowledged cause is listed but no longer counted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from gpuwatch.health.acks import AckStore
from gpuwatch.health.verdict import (
    Cause,
    GpuFacts,
    Health,
    Verdict,
    gpu_facts,
    node_verdict,
    sample_causes,
    status_cause,
    verdict_of,
)
from gpuwatch.health.xid_catalog import lookup
from gpuwatch.model import BackendState, GpuState, GpuStatus, MissingGpu, Sample
from gpuwatch.text.timefmt import rfc3339

RATE_WINDOW_S = 300.0
CRC_STORM_WINDOW_S = 60.0
CRC_STORM_PER_S = 100.0  # DCGM: NVLink CRC errors at or above this rate fail the GPU
PCIE_WINDOW_S = 60.0
WARNING_XID_HOLD_S = 3600.0


def pcie_replays_per_lane_minute(generation: int) -> float | None:
    """DCGM's expected PCIe replays per lane per minute: 0.48 at Gen3, doubling with each
    generation (0.96 at Gen4, 1.92 at Gen5), and halving below Gen3 as the link's bandwidth
    does; the same formula as GpuPcieReplayRate (rules/hardware.yaml). None: no link read."""
    return 0.48 * 2.0 ** (generation - 3) if generation >= 1 else None


CRC, REPLAY, PCIE = range(3)  # the error counters whose rates are judged, by position


@dataclass(frozen=True, slots=True)
class _Point:
    time: float
    raw: tuple[float | None, ...]  # the counters as last read (None: never read)
    grown: tuple[float, ...]  # how much each has grown since the history began, resets counted


def _next_point(now: float, previous: _Point | None, raw: tuple[float | None, ...]) -> _Point:
    if previous is None:
        return _Point(now, raw, (0.0,) * len(raw))
    grown: list[float] = []
    kept: list[float | None] = []
    for value, before, total in zip(raw, previous.raw, previous.grown, strict=True):
        if value is None:  # not read this cycle: no news
            grown.append(total)
            kept.append(before)
        else:
            step = 0.0 if before is None else (value - before if value >= before else value)
            grown.append(total + step)
            kept.append(value)
    return _Point(now, tuple(kept), tuple(grown))


def _increase(history: deque[_Point], since: float, counter: int) -> float:
    """How much a counter grew after `since`. Cheap: the history keeps running totals, so
    only the point at `since` has to be found, from the newer end."""
    if not history:
        return 0.0
    base = history[0]
    if since > base.time:
        for point in reversed(history):
            if point.time <= since:
                base = point
                break
    return history[-1].grown[counter] - base.grown[counter]


@dataclass
class _GpuMemory:
    history: deque[_Point] = field(default_factory=deque)
    xids: list[tuple[float, int]] = field(default_factory=list)  # since the last reset
    volatile_ecc: list[float | None] = field(default_factory=lambda: [None, None])  # last read
    status: GpuStatus = GpuStatus.OK
    status_since: float = 0.0  # when the GPU entered that status

    def reset(self) -> None:
        self.history.clear()
        self.xids.clear()


def missing_cause(gpu: MissingGpu) -> Cause:
    return Cause(
        f"gpu-missing-{gpu.uuid}",
        Health.UNHEALTHY,
        f"GPU {gpu.uuid} ({gpu.model}, serial {gpu.serial}, bus {gpu.pci_bus_id}, "
        f"last seen as GPU {gpu.index}) is missing: the driver no longer lists it",
        "drain the node and reboot it; reseat or RMA the GPU if it stays missing; "
        "acknowledge it if it was removed on purpose",
    )


def _action(text: str) -> str:
    """The catalog's sentence as an action in the verdict's style."""
    return text[:1].lower() + text[1:].rstrip(".")


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

    def record_xid(self, uuid: str, time: float, code: int) -> None:
        self._gpus.setdefault(uuid, _GpuMemory()).xids.append((time, code))

    def judge(
        self,
        now: float,
        backend: BackendState,
        gpus: list[GpuState],
        samples: Iterable[Sample],
        own: Iterable[Cause] = (),
    ) -> tuple[dict[int, Verdict], Verdict]:
        """Verdicts per GPU and for the node; `own` are the node's causes that are not about a
        GPU (the daemon's state files)."""
        facts = gpu_facts(samples)
        verdicts = {
            g.info.index: self._judge_gpu(now, g, facts.get(g.info.uuid, GpuFacts())) for g in gpus
        }
        node = node_verdict(backend, verdicts)
        missing = [missing_cause(g) for g in backend.missing] if backend.up else []
        # Only a backend that answers shows which missing GPUs have come back.
        causes, acked = self._with_acks("", [*missing, *own], prune=backend.up)
        return verdicts, verdict_of([*node.causes, *causes], [*node.acknowledged, *acked])

    def _judge_gpu(self, now: float, gpu: GpuState, facts: GpuFacts) -> Verdict:
        uuid = gpu.info.uuid
        memory = self._gpus.setdefault(uuid, _GpuMemory())
        came_back = memory.status == GpuStatus.LOST and gpu.status == GpuStatus.OK
        if gpu.status != memory.status:
            memory.status, memory.status_since = gpu.status, now
        lost = status_cause(gpu, now - memory.status_since)
        if lost is not None:
            causes = [lost, *self._xid_causes(now, memory)]
        else:
            if _reset_seen(memory, facts) or came_back:
                memory.reset()
            self._remember(now, memory, facts)
            causes = [*sample_causes(facts), *self._rate_causes(now, memory, facts),
                      *self._xid_causes(now, memory)]  # fmt: skip
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
        counted, acked = self._with_acks(uuid, causes, prune=lost is None)
        return verdict_of(counted, acked)

    def _with_acks(
        self, uuid: str, causes: list[Cause], prune: bool
    ) -> tuple[list[Cause], list[Cause]]:
        if prune:  # only a GPU read in full shows which causes have cleared
            self.acks.keep_only(uuid, {c.key for c in causes})
        counted = [c for c in causes if not self.acks.covers(uuid, c)]
        acked = [c for c in causes if self.acks.covers(uuid, c)]
        return counted, acked

    @staticmethod
    def _remember(now: float, memory: _GpuMemory, facts: GpuFacts) -> None:
        history = memory.history
        raw = (facts.nvlink_crc, facts.nvlink_replay_recovery, facts.pcie_replays)
        point = _next_point(now, history[-1] if history else None, raw)
        if not history or point.raw != history[-1].raw:  # only changes: 10 Hz makes 3000 a GPU
            history.append(point)
        # The newest point at or before the window's start stays: it is what increases over the
        # whole window are measured from.
        while len(history) > 1 and history[1].time <= now - RATE_WINDOW_S:
            history.popleft()

    @staticmethod
    def _rate_causes(now: float, memory: _GpuMemory, facts: GpuFacts) -> list[Cause]:
        out: list[Cause] = []
        history = memory.history
        crc_storm = _increase(history, now - CRC_STORM_WINDOW_S, CRC)
        crc = _increase(history, now - RATE_WINDOW_S, CRC)
        if crc_storm >= CRC_STORM_PER_S * CRC_STORM_WINDOW_S:
            out.append(
                Cause(
                    "nvlink-crc",
                    Health.UNHEALTHY,
                    f"NVLink CRC errors at {crc_storm / CRC_STORM_WINDOW_S:.0f}/s "
                    f"(DCGM fails a GPU at {CRC_STORM_PER_S:g}/s)",
                    "drain, reset the GPU and check the link",
                )
            )
        elif crc > 0:
            out.append(
                Cause(
                    "nvlink-crc",
                    Health.DEGRADED,
                    f"{crc:g} NVLink CRC errors in the last 5 minutes",
                    "watch the link; reseat or replace it if the errors go on",
                )
            )
        replay = _increase(history, now - RATE_WINDOW_S, REPLAY)
        if replay > 0:
            out.append(
                Cause(
                    "nvlink-replay",
                    Health.UNHEALTHY,
                    f"{replay:g} NVLink replay or recovery errors in the last 5 minutes",
                    "drain, reset the GPU and check the link",
                )
            )
        lanes_rate = pcie_replays_per_lane_minute(int(facts.pcie_generation))
        if lanes_rate is not None and facts.pcie_width > 0:
            expected = lanes_rate * facts.pcie_width * PCIE_WINDOW_S / 60.0
            replays = _increase(history, now - PCIE_WINDOW_S, PCIE)
            if replays > expected:
                gen, width = int(facts.pcie_generation), int(facts.pcie_width)
                out.append(
                    Cause(
                        "pcie-replays",
                        Health.DEGRADED,
                        f"{replays:g} PCIe replays in the last minute (expected at most "
                        f"{expected:.0f} on Gen{gen} x{width})",
                        "check the slot, riser and cabling; reseat the GPU",
                    )
                )
        return out

    @staticmethod
    def _xid_causes(now: float, memory: _GpuMemory) -> list[Cause]:
        seen: dict[int, list[float]] = {}
        for time, code in memory.xids:
            seen.setdefault(code, []).append(time)
        out: list[Cause] = []
        for code, times in sorted(seen.items()):
            xid = lookup(code)
            if xid.xid_class == "critical":
                state = Health.UNHEALTHY
            elif xid.xid_class in ("warning", "unknown") and times[-1] >= now - WARNING_XID_HOLD_S:
                state = Health.DEGRADED
            else:
                continue
            count = (
                f"{len(times)} times since {rfc3339(times[0])}"
                if len(times) > 1
                else (f"at {rfc3339(times[0])}")
            )
            out.append(
                Cause(
                    f"xid-{code}",
                    state,
                    f"XID {code} ({xid.meaning}) {count}",
                    _action(xid.action),
                    str(len(times)),
                )
            )
        return out
