"""The verdict on each GPU and on the node: healthy, degraded or unhealthy, with its causes.

A cause names what is wrong, what to do about it, and a key an operator can acknowledge it by.
The facts here come from one sample: states a reading shows at once (a link down, an
uncorrectable error since the reset, a failed remap). Whatever needs a threshold or a window
(error rates, page counts, how long a GPU has not answered) is the rule packs' to decide: an
alert carrying a `cause` label is a cause of the verdict (`alert_cause`), so a threshold is
written once, in the rule. `judge.HealthJudge` adds what needs memory (XIDs, resets,
acknowledgements).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuwatch import metrics as m
from gpuwatch.compat import StrEnum
from gpuwatch.model import BackendState, GpuState, GpuStatus, Sample


class Health(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"


SEVERITY = {Health.HEALTHY: 0, Health.DEGRADED: 1, Health.UNHEALTHY: 2}

# Clock-event reasons that mean the hardware is protecting itself, not just idling or capping.
DEGRADING_REASONS = {
    "hw_slowdown": "HW slowdown is holding the clocks down",
    "hw_thermal_slowdown": "thermal slowdown: the GPU is too hot",
    "hw_power_brake": "the external power brake is asserted",
}

RECOVERY_ACTIONS = {
    "gpu_reset": (Health.UNHEALTHY, "drain the GPU's jobs and reset the GPU"),
    "node_reboot": (Health.UNHEALTHY, "drain the node and reboot it"),
    "drain_and_reset": (Health.UNHEALTHY, "drain the node, then reset the GPU"),
    "drain_p2p": (Health.DEGRADED, "let jobs finish, start no peer-to-peer work, then reset"),
    "recover_imex_domain": (
        Health.UNHEALTHY,
        "drain the IMEX domain's jobs and restart its IMEX daemons (nvidia-imex)",
    ),
    "bus_reset": (Health.UNHEALTHY, "drain the GPU's jobs and reset its PCIe bus"),
    "system_reboot": (Health.UNHEALTHY, "drain the node and reboot it"),
}
# What to do about a GPU whose NVML calls answer an error, by the error's nvml.h name (the
# failing GPU's reason names it).
NVML_ERROR_ACTIONS = {
    "NVML_ERROR_RESET_REQUIRED": (
        "drain the GPU's jobs and reset the GPU (nvidia-smi -r); reboot if the reset fails"
    ),
    "NVML_ERROR_CORRUPTED_INFOROM": "drain the GPU and RMA it: its infoROM is corrupt",
}
DEFAULT_NVML_ERROR_ACTION = (
    "drain the node; check the kernel log (dmesg | grep -i nvrm) and reset the GPU, or reboot"
)


def as_action(text: str) -> str:
    """A sentence (the XID catalogue's, an alert's `action`) as an action in the verdict's
    style, which joins the reason and its action with a semicolon."""
    return text[:1].lower() + text[1:].rstrip(".")


def _nvml_error_action(reason: str) -> str:
    return next(
        (a for name, a in NVML_ERROR_ACTIONS.items() if name in reason), DEFAULT_NVML_ERROR_ACTION
    )


@dataclass(frozen=True, slots=True)
class Cause:
    """One reason a GPU or the node is not healthy.

    `key` is what an operator acknowledges (`gpuwatch ack 3 xid-48`); the acknowledgement holds
    while `fingerprint` stays the same, so a new XID or one more bad page is news again.
    """

    key: str
    state: Health
    reason: str
    action: str
    fingerprint: str = ""

    def as_json(self) -> dict[str, str]:
        return {
            "key": self.key,
            "state": self.state.value,
            "reason": self.reason,
            "action": self.action,
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    state: Health
    causes: tuple[Cause, ...] = ()
    acknowledged: tuple[Cause, ...] = ()  # causes an operator has taken note of; not counted

    @property
    def reasons(self) -> list[str]:
        return [c.reason for c in self.causes]

    @property
    def actions(self) -> list[str]:
        return [c.action for c in self.causes]


def verdict_of(causes: list[Cause], acknowledged: list[Cause] | None = None) -> Verdict:
    """The worst cause decides; causes are listed worst first."""
    ordered = sorted(causes, key=lambda c: -SEVERITY[c.state])
    state = ordered[0].state if ordered else Health.HEALTHY
    return Verdict(state, tuple(ordered), tuple(acknowledged or ()))


@dataclass
class GpuFacts:
    """What one sample says about a GPU's faults and its error counters."""

    clock_reasons: set[str] = field(default_factory=set)
    sbe_volatile: float | None = None  # None: not read this cycle
    dbe_volatile: float | None = None
    remap_pending: bool = False
    remap_failed: bool = False
    retired_pending: bool = False
    recovery_action: str = ""
    links_down: list[str] = field(default_factory=list)

    def add(self, other: GpuFacts) -> None:
        """Take in what another sample of the same GPU says (its slow tier, read apart).
        Each kind of fact comes from one tier, so nothing is said twice: a flag set or a
        count read stands."""
        self.clock_reasons |= other.clock_reasons
        if other.sbe_volatile is not None:
            self.sbe_volatile = other.sbe_volatile
        if other.dbe_volatile is not None:
            self.dbe_volatile = other.dbe_volatile
        self.remap_pending = self.remap_pending or other.remap_pending
        self.remap_failed = self.remap_failed or other.remap_failed
        self.retired_pending = self.retired_pending or other.retired_pending
        self.recovery_action = self.recovery_action or other.recovery_action
        self.links_down = [*self.links_down, *other.links_down]


def all_facts(*found: dict[str, GpuFacts]) -> dict[str, GpuFacts]:
    """The facts of each GPU, from several `gpu_facts` (this cycle's samples, and the facts
    each slow part gave when it was read); those are left as they were."""
    out: dict[str, GpuFacts] = {}
    for facts in found:
        for uuid, one in facts.items():
            out.setdefault(uuid, GpuFacts()).add(one)
    return out


def gpu_facts(samples: Iterable[Sample]) -> dict[str, GpuFacts]:
    """uuid -> the fault facts of this batch."""
    out: dict[str, GpuFacts] = {}
    for name, labels, value in samples:
        if name not in _FACT_METRICS or _NOTHING_TO_SEE.get(name) == value:
            continue
        d = dict(labels)
        facts = out.setdefault(d.get("uuid", ""), GpuFacts())
        if name == m.CLOCK_EVENT:
            if value == 1.0:
                facts.clock_reasons.add(d["reason"])
        elif name == m.ECC_ERRORS:
            if d.get("scope") == "volatile":
                if d.get("type") == "uncorrected":
                    facts.dbe_volatile = value
                else:
                    facts.sbe_volatile = value
        elif name == m.ROW_REMAP_PENDING:
            facts.remap_pending = value == 1.0
        elif name == m.ROW_REMAP_FAILED:
            facts.remap_failed = value == 1.0
        elif name == m.RETIRED_PAGES_PENDING:
            facts.retired_pending = value == 1.0
        elif name == m.RECOVERY_ACTION:
            if value == 1.0:
                facts.recovery_action = d.get("action", "")
        elif name == m.NVLINK_LINK_UP and value == 0.0:
            facts.links_down.append(d.get("link", "?"))
    return out


_FACT_METRICS = frozenset(
    {
        m.CLOCK_EVENT,
        m.ECC_ERRORS,
        m.ROW_REMAP_PENDING,
        m.ROW_REMAP_FAILED,
        m.RETIRED_PAGES_PENDING,
        m.RECOVERY_ACTION,
        m.NVLINK_LINK_UP,
    }
)
# Values that say nothing, most of a batch (errors at 0, links up): skipped before parsing labels.
_NOTHING_TO_SEE = {
    m.NVLINK_LINK_UP: 1.0,
    m.CLOCK_EVENT: 0.0,
    m.RECOVERY_ACTION: 0.0,
}


def sample_causes(facts: GpuFacts) -> list[Cause]:
    """Every fault this one sample shows."""
    out: list[Cause] = []
    bad, warn = Health.UNHEALTHY, Health.DEGRADED
    if facts.recovery_action in RECOVERY_ACTIONS:
        state, action = RECOVERY_ACTIONS[facts.recovery_action]
        out.append(
            Cause(
                "recovery-action",
                state,
                f"the driver asks for {facts.recovery_action}",
                action,
                facts.recovery_action,
            )
        )
    if facts.dbe_volatile:
        out.append(
            Cause(
                "ecc-dbe",
                bad,
                f"{facts.dbe_volatile:g} uncorrectable ECC "
                f"error{'' if facts.dbe_volatile == 1 else 's'} since the last reset",
                "drain the GPU's jobs and reset the GPU",
                f"{facts.dbe_volatile:g}",
            )
        )
    if facts.remap_failed:
        out.append(
            Cause(
                "remap-failed",
                bad,
                "row remapping failed: no spare rows left",
                "take the GPU out; RMA it",
            )
        )
    if facts.links_down:
        links = ", ".join(facts.links_down)
        out.append(
            Cause(
                "nvlink-down",
                bad,
                f"NVLink {links} down",
                "drain, reset the GPU and check the link",
                links,
            )
        )
    if facts.remap_pending:
        out.append(
            Cause(
                "remap-pending",
                warn,
                "a row remap waits for a GPU reset",
                "reset the GPU when it is idle",
            )
        )
    if facts.retired_pending:
        out.append(
            Cause(
                "retirement-pending",
                warn,
                "a page retirement waits for a GPU reset",
                "reset the GPU when it is idle",
            )
        )
    for reason, text in DEGRADING_REASONS.items():
        if reason in facts.clock_reasons:
            out.append(Cause(f"clocks-{reason}", warn, text, "check cooling and power"))
    return out


def status_cause(gpu: GpuState) -> Cause | None:
    """A GPU that cannot be read at all. An unresponsive one is degraded: a stall of a few
    seconds (a driver busy with another GPU's reset, a slow ECC scrub) pages nobody; the
    GpuUnresponsive alert (rules/hardware.yaml) makes it unhealthy once the stall lasts."""
    if gpu.status == GpuStatus.LOST:
        return Cause(
            "gpu-lost",
            Health.UNHEALTHY,
            f"is lost: {gpu.reason}",
            "drain the node and reboot it; reseat or RMA the GPU if it stays lost",
        )
    if gpu.status == GpuStatus.FAILING:
        return Cause(
            "gpu-nvml-error",
            Health.UNHEALTHY,
            f"is failing: {gpu.reason}",
            _nvml_error_action(gpu.reason),
        )
    if gpu.status == GpuStatus.UNRESPONSIVE:
        return Cause(
            "gpu-unresponsive",
            Health.DEGRADED,
            f"is unresponsive: {gpu.reason}",
            "wait: unhealthy if it still does not answer when GpuUnresponsive fires",
        )
    return None


# What to check when the GPU backend is down, by backend: with dcgm-exporter between, the
# exporter is the first suspect, not the driver.
BACKEND_DOWN_ACTIONS = {
    "dcgm": "check that dcgm-exporter runs and answers at its URL (systemctl status "
    "dcgm-exporter, or its pod); gpuwatch sees the GPUs only through it",
}
NVML_DOWN_ACTION = "check that the NVIDIA driver is installed and loaded"


def node_verdict(backend: BackendState, gpus: dict[int, Verdict]) -> Verdict:
    if not backend.up:
        action = BACKEND_DOWN_ACTIONS.get(backend.name, NVML_DOWN_ACTION)
        return verdict_of([Cause("backend", Health.UNHEALTHY, backend.reason, action)])
    causes = [c for v in gpus.values() for c in v.causes]
    acknowledged = [c for v in gpus.values() for c in v.acknowledged]
    return verdict_of(causes, acknowledged)


def with_sampling_problem(verdict: Verdict, problem: str) -> Verdict:
    """The verdict as of now: stale sampling makes the node unhealthy whatever it last saw."""
    if not problem:
        return verdict
    cause = Cause(
        "sampling", Health.UNHEALTHY, problem, "check the daemon's log; restart it if it is wedged"
    )
    return verdict_of([cause, *verdict.causes], list(verdict.acknowledged))


def health_samples(
    gpus: list[GpuState], verdicts: dict[int, Verdict], node: Verdict
) -> list[Sample]:
    out: list[Sample] = []
    for gpu in gpus:
        verdict = verdicts[gpu.info.index]
        for state in Health:
            out.append(
                Sample(
                    m.GPU_HEALTH,
                    (*gpu.info.labels, ("state", state.value)),
                    1.0 if verdict.state == state else 0.0,
                )
            )
    for state in Health:
        out.append(
            Sample(m.NODE_HEALTH, (("state", state.value),), 1.0 if node.state == state else 0.0)
        )
    return out
