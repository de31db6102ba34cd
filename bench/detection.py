"""Detection: fault scenarios with what an operator expects of each, and healthy hours that must
stay quiet, played through the daemon at speed; it prints what was caught, missed, falsely
alerted and how long each detection took.

    .venv/bin/python bench/detection.py [--healthy-hours 12] [--only NAME ...]

Each scenario in bench/detection/ runs in this process on the simulated NVML library (the
real pynvml above it), with the default config and the shipped rule packs, on a clock that
moves one sampling interval per cycle, so hours take minutes. A training scenario's job
reports as the simulated job does (gpuwatch.sim.job), straight into the daemon's push table.

For each scenario: every expected alert must fire for the right GPU or rank within its
deadline after the fault starts; an alert that fires and is neither expected nor listed as
a consequence of the fault (XID 79 raising GpuXidCritical beside GpuFellOffBus) is a false
alert; the faulty GPU's worst verdict must be the one expected and every other GPU must stay
healthy. A scenario may also ask for alerts cleared and reset GPUs healthy by its end, and for
daemon restarts on the same state directory while the node runs on. The healthy scenarios
share `--healthy-hours` between them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pynvml

from gpuwatch.clock import ManualClock
from gpuwatch.config import Config
from gpuwatch.health.verdict import SEVERITY, Health
from gpuwatch.host.boot import current_boot_id
from gpuwatch.model import Sample
from gpuwatch.rules.alerting import AlertState
from gpuwatch.serve.wiring import Wired, wire
from gpuwatch.sim.job import JOB_NAME, TrainingJob
from gpuwatch.sim.jobrun import SLURM_JOB_ID
from gpuwatch.sim.library import SimulatedNvml
from gpuwatch.sim.scenario import Scenario, load_scenario

HERE = Path(__file__).resolve().parent / "detection"


@dataclass(frozen=True)
class Expect:
    alert: str
    labels: dict[str, str]  # the alert's labels that must match: {"gpu": "2"} or {"rank": "3"}
    within: float  # seconds after the fault on its GPU (or rank) starts


@dataclass(frozen=True)
class Case:
    expect: tuple[Expect, ...] = ()
    verdicts: dict[int, Health] = field(default_factory=dict)  # faulty GPUs; others: healthy
    consequences: frozenset[str] = frozenset()  # other alerts the fault rightly raises
    after: float = 120.0  # how long to run past the last deadline
    # The daemon stops and a new one starts on the same state directory at these times
    # (seconds into the scenario), while the node runs on.
    restarts: tuple[float, ...] = ()
    reboot: bool = False  # the restarts are the node's reboots: a new boot id each
    cleared: frozenset[str] = frozenset()  # alerts that must be resolved by the end
    recovered: frozenset[int] = frozenset()  # GPUs that must be healthy again by the end


# Every alert: the fault has passed and its windows emptied by the end.
_all_cleared = frozenset({"*"})


def gpu(n: int) -> dict[str, str]:
    return {"gpu": str(n)}


def rank(n: int) -> dict[str, str]:
    return {"rank": str(n)}


CASES: dict[str, Case] = {
    "a100_ecc_dbe": Case(
        (Expect("GpuEccUncorrectable", gpu(2), 30),),
        {2: Health.UNHEALTHY},
        frozenset({"GpuXidCritical"}),  # XID 48, the driver's report of the same error
    ),
    "h100_fall_off_bus": Case(
        (Expect("GpuFellOffBus", gpu(5), 15),),
        {5: Health.UNHEALTHY},
    ),
    "l4_thermal_runaway": Case(
        (Expect("GpuTemperatureHigh", gpu(0), 240),),
        {0: Health.DEGRADED},
        frozenset({"GpuThermalThrottling"}),  # a GPU that hot slows itself down
    ),
    "h100_nvlink_down": Case(
        (Expect("GpuNvlinkDown", gpu(6), 60),),
        {6: Health.UNHEALTHY},
        frozenset({"GpuXidCritical"}),  # XID 74
    ),
    "a100_nvlink_crc": Case(
        (Expect("GpuNvlinkErrors", gpu(3), 60),),
        {3: Health.UNHEALTHY},
    ),
    "v100_pcie_replays": Case(
        (Expect("GpuPcieReplayRate", gpu(4), 60),),
        {4: Health.DEGRADED},
    ),
    "a100_row_remap_failure": Case(
        (Expect("GpuRowRemapFailed", gpu(7), 30),),
        {7: Health.UNHEALTHY},
        frozenset({"GpuXidCritical"}),  # XID 64
    ),
    "v100_retired_pages": Case(
        (Expect("GpuRetiredPagesHigh", gpu(1), 30),),
        {1: Health.UNHEALTHY},
    ),
    "h100_recovery_action": Case(
        (Expect("GpuRecoveryActionRequired", gpu(2), 30),),
        {2: Health.UNHEALTHY},
    ),
    "h100_power_brake": Case(
        (Expect("GpuPowerBrake", gpu(3), 30),),
        {3: Health.DEGRADED},
        frozenset({"GpuStraggler"}),  # braked to a fifth of its clock, it holds its job back
        after=300,  # GpuThermalThrottling in the minutes after the brake ends is false
    ),
    "h100_nan_loss": Case((Expect("TrainingLossNaN", rank(3), 30),)),
    "a100_step_stall": Case((Expect("TrainingStalled", rank(6), 660),)),
    "h100_nccl_hang": Case(
        (Expect("CollectiveHang", gpu(1), 360),),
        {},
        frozenset({"TrainingStalled"}),  # the hung rank's step stops too
    ),
    # The application's fault, not the GPU's: alerted, and the GPU stays healthy.
    "h100_xid_application": Case((Expect("GpuXidApplication", gpu(4), 15),)),
    # Under the alerts' own windows: nothing fires, every GPU stays healthy.
    "h100_short_hang": Case(after=600),
    "a100_short_stall": Case(after=600),
    "l4_nan_loss_rank0": Case((Expect("TrainingLossNaN", rank(0), 30),)),
    "h100_mixed": Case(
        (
            Expect("GpuTemperatureHigh", gpu(2), 240),
            Expect("GpuPowerBrake", gpu(5), 30),
            Expect("GpuEccUncorrectable", gpu(0), 30),
        ),
        {2: Health.DEGRADED, 5: Health.DEGRADED, 0: Health.UNHEALTHY},
        # the hot GPU's; XID 48; the hot and the braked GPUs lag their job's others
        frozenset({"GpuThermalThrottling", "GpuXidCritical", "GpuStraggler"}),
        after=300,
    ),
    # Idle for its whole 15-minute window, then `for: 5m`.
    "h100_idle_with_memory": Case((Expect("GpuIdleWithMemory", gpu(2), 1260),)),
    # Just under and just over the lines: the one under must raise nothing.
    "h100_pcie_replay_threshold": Case(
        (Expect("GpuPcieReplayRate", gpu(5), 75),), {5: Health.DEGRADED}, cleared=_all_cleared
    ),
    "mixed_pcie_replays": Case(
        (Expect("GpuPcieReplayRate", gpu(6), 75),), {6: Health.DEGRADED}, cleared=_all_cleared
    ),
    "a100_nvlink_crc_threshold": Case(
        (
            Expect("GpuNvlinkErrors", {**gpu(1), "severity": "warning"}, 30),
            Expect("GpuNvlinkErrors", {**gpu(4), "severity": "warning"}, 30),
            Expect("GpuNvlinkErrors", {**gpu(4), "severity": "critical"}, 90),
        ),
        {1: Health.DEGRADED, 4: Health.UNHEALTHY},
        after=420,  # the 5-minute windows empty: everything clears
        cleared=_all_cleared,
    ),
    # The slow GPU among the job's eight, named with its reason within 2 minutes.
    "h100_straggler_hw_slowdown": Case(
        (Expect("GpuStraggler", gpu(6), 120),),
        {6: Health.DEGRADED},
        frozenset({"GpuThermalThrottling"}),  # a hardware slowdown holds its clocks down
    ),
    "h100_pcie_downtrain": Case(
        (Expect("GpuPcieLinkDowntrained", gpu(2), 120),),
        {2: Health.DEGRADED},
    ),
    "a100_nvlink_replay": Case(
        (Expect("GpuNvlinkErrors", {**gpu(2), "severity": "critical"}, 30),),
        {2: Health.UNHEALTHY},
        after=420,
        cleared=_all_cleared,
    ),
    "b200_nvlink_recovery": Case(
        (Expect("GpuNvlinkErrors", {**gpu(3), "severity": "critical"}, 30),),
        {3: Health.UNHEALTHY},
        after=420,
        cleared=_all_cleared,
    ),
    "a100_remapped_rows_512": Case(
        (
            Expect("GpuRowRemapPending", gpu(2), 30),
            Expect("GpuRowRemapPending", gpu(6), 30),
            Expect("GpuRemappedRowsHigh", gpu(6), 30),
        ),
        {2: Health.DEGRADED, 6: Health.DEGRADED},
        cleared=frozenset({"GpuRowRemapPending"}),  # the reset applied the remaps
        recovered=frozenset({2}),
    ),
    "h100_gpu_reset": Case(
        (Expect("GpuEccUncorrectable", gpu(3), 30),),
        {3: Health.UNHEALTHY},
        frozenset({"GpuXidCritical"}),  # XID 48
        cleared=frozenset({"GpuEccUncorrectable"}),
        recovered=frozenset({3}),
    ),
    "h100_thermal_shutdown": Case(
        (Expect("GpuTemperatureHigh", gpu(4), 290), Expect("GpuFellOffBus", gpu(4), 315)),
        {4: Health.UNHEALTHY},
        # hot (and throttled below its job's other GPUs), then XID 79
        frozenset({"GpuThermalThrottling", "GpuXidCritical", "GpuStraggler"}),
    ),
    # After the reboot the GPU is not listed at all: no XID, no error, only its absence.
    "h100_missing_after_reboot": Case(
        (Expect("GpuFellOffBus", gpu(5), 15), Expect("GpuMissing", gpu(5), 150)),
        {5: Health.UNHEALTHY},
        frozenset({"GpuXidCritical"}),  # XID 79
        restarts=(180.0,),
        reboot=True,
    ),
    "h100_all_ranks_hang": Case(
        tuple(Expect("CollectiveHang", gpu(g), 360) for g in range(8)),
        {},
        frozenset({"TrainingStalled"}),
    ),
    "h100_driver_lost": Case(
        tuple(Expect("GpuUnresponsive", gpu(g), 30) for g in range(8)),
        {g: Health.UNHEALTHY for g in range(8)},
    ),
}
HEALTHY = ("healthy_h100_training", "healthy_a100_inference", "healthy_l4_idle",
           "healthy_v100_training", "healthy_mixed_training")  # fmt: skip


@dataclass(frozen=True)
class Fired:
    time: float  # since the scenario started
    alert: str
    labels: dict[str, str]


@dataclass
class Result:
    name: str
    scenario: Scenario
    hours: float
    caught: dict[str, float | None] = field(default_factory=dict)  # expected alert -> delay
    false: list[str] = field(default_factory=list)
    wrong_verdicts: list[str] = field(default_factory=list)
    uncleared: list[str] = field(default_factory=list)  # alerts still firing that should not be
    wall: float = 0.0


def _due(library: SimulatedNvml, now: float) -> bool:
    """An NVML event due by now that the daemon's event thread has not taken yet."""
    events = library.node.events
    return any(
        s.delivered < len(events) and events[s.delivered].time <= now
        for s in list(library._event_sets.values())  # the simulator's own bookkeeping
    )


async def play(name: str, scenario: Scenario, case: Case, duration: float) -> Result:
    result = Result(name, scenario, duration / 3600)
    clock = ManualClock()
    library = SimulatedNvml(scenario, clock)
    library.install()
    start = clock.now()
    fired: dict[tuple[object, ...], Fired] = {}  # each firing once, a second one apart
    worst: dict[int, Health] = {}
    restarts = sorted(case.restarts)
    firing: set[str] = set()
    with tempfile.TemporaryDirectory() as state:
        config = Config(state_dir=state)
        boot = current_boot_id()
        wired = await _start(config, clock, boot)
        daemon, rules = wired.daemon, wired.rules
        job = TrainingJob(scenario) if scenario.workload == "training" else None
        slurm = None
        if job is not None:
            library.node.pids.append(os.getpid())  # this process plays the job's, as jobrun's
            # And a process started in the job's environment holds its GPUs too, as
            # `gpuwatch run --simulate`'s job does: which job holds a GPU is learned from it.
            slurm = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                "import time; time.sleep(86400)",
                env={**os.environ, "SLURM_JOB_ID": SLURM_JOB_ID},
            )
            library.node.pids.append(slurm.pid)
        wall = time.monotonic()
        try:
            while clock.now() - start < duration:
                if restarts and clock.now() - start >= restarts[0]:
                    restarts.pop(0)
                    await daemon.source.stop()  # the alert state is saved as it changes
                    await wired.close()
                    boot = f"{boot}+" if case.reboot else boot
                    wired = await _start(config, clock, boot)
                    daemon, rules = wired.daemon, wired.rules
                if job is not None:
                    for r, values in job.at(clock.now() - start).items():
                        labels = (("job", JOB_NAME), ("rank", str(r)))
                        samples = [Sample(f"train_{k}", labels, v) for k, v in values.items()]
                        daemon.jobs.pushed.apply(JOB_NAME, samples, clock.now())
                settle = time.monotonic() + 2.0
                # The event thread takes a due event, then hands it to this loop.
                while _due(library, clock.now()) and time.monotonic() < settle:  # noqa: ASYNC110
                    await asyncio.sleep(0.001)
                await asyncio.sleep(0)
                await daemon.sample_once()
                firing = set()
                for rule in rules.alerting_rules():
                    for labels, alert in rule.active.items():
                        if alert.state == AlertState.FIRING and alert.fired_at is not None:
                            firing.add(alert.name)
                            fired.setdefault(
                                (labels, alert.fired_at),
                                Fired(alert.fired_at - start, alert.name, dict(labels)),
                            )
                for index, verdict in daemon.view.gpu_verdicts.items():
                    if SEVERITY[verdict.state] > SEVERITY[worst.get(index, Health.HEALTHY)]:
                        worst[index] = verdict.state
                clock.advance(config.sampling.interval)
            late = firing if "*" in case.cleared else firing & case.cleared
            result.uncleared = [f"{a} still firing at the end" for a in sorted(late)]
            result.uncleared += [
                f"GPU {g} {v.state.value} at the end, expected healthy again"
                for g, v in sorted(daemon.view.gpu_verdicts.items())
                if g in case.recovered and v.state != Health.HEALTHY
            ]
        finally:
            result.wall = time.monotonic() - wall
            await daemon.source.stop()
            await wired.close()
            SimulatedNvml.uninstall()
            if slurm is not None:
                slurm.kill()
                await slurm.wait()
    judge(result, case, scenario, sorted(fired.values(), key=lambda f: f.time), worst)
    return result


async def _start(config: Config, clock: ManualClock, boot: str) -> Wired:
    """A daemon as `gpuwatch run` builds one (its journal, acknowledgements, GPU inventory
    and saved alert state), on the state directory the last one left."""
    state = Path(config.state_dir)
    wired = wire(config, pynvml, clock, state, 10040, boot_id=boot)
    wired.daemon.restore_xids()
    await wired.daemon.source.start()
    return wired


def judge(
    result: Result, case: Case, scenario: Scenario, fired: list[Fired], worst: dict[int, Health]
) -> None:
    for e in case.expect:
        fault_at = _fault_at(scenario, e)
        times = [f.time - fault_at for f in fired if f.alert == e.alert and _matches(f, e)]
        in_time = [t for t in times if 0 <= t <= e.within]
        result.caught[f"{e.alert}{_show(e.labels)}"] = min(in_time) if in_time else None
    faulty = {str(f.gpu) for f in scenario.faults}
    for f in fired:
        # An expected alert before its GPU's fault is false; a consequence only on a faulty
        # GPU or rank.
        expected = any(
            e.alert == f.alert and _matches(f, e) and f.time >= _fault_at(scenario, e)
            for e in case.expect
        )
        on_faulty = bool({f.labels.get("gpu"), f.labels.get("rank")} & faulty)
        if not expected and not (f.alert in case.consequences and on_faulty):
            shown = _show({k: v for k, v in f.labels.items() if k in ("gpu", "rank", "link")})
            result.false.append(f"{f.alert}{shown} fired at {f.time / 60:.1f} m")
    for index in range(scenario.gpus):
        state = worst.get(index, Health.HEALTHY)
        want = case.verdicts.get(index, Health.HEALTHY)
        if state != want:
            result.wrong_verdicts.append(f"GPU {index} {state.value}, expected {want.value}")


def _fault_at(scenario: Scenario, expect: Expect) -> float:
    """When the fault on the expectation's GPU (or rank) starts."""
    on = int(expect.labels.get("gpu", expect.labels.get("rank", "-1")))
    return min(f.at for f in scenario.faults if f.gpu == on)


def _matches(fired: Fired, expect: Expect) -> bool:
    return all(fired.labels.get(k) == v for k, v in expect.labels.items())


def _show(labels: dict[str, str]) -> str:
    return "{" + ",".join(f"{k}={v}" for k, v in labels.items()) + "}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy-hours", type=float, default=12.0)
    parser.add_argument("--only", nargs="*", default=[*CASES, *HEALTHY])
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the daemon's warnings are what is measured here
    healthy = [name for name in args.only if name in HEALTHY]
    print(
        f"machine: {platform.machine()}, Python {platform.python_version()}; "
        f"healthy hours: {args.healthy_hours:g} over {len(healthy)} scenarios"
    )
    results = []
    for name in args.only:
        scenario = load_scenario(str(HERE / f"{name}.yaml"))
        if name in HEALTHY:
            hours = args.healthy_hours / len(healthy)
            result = asyncio.run(play(name, scenario, Case(), hours * 3600))
        else:
            case = CASES[name]
            # Past the last deadline and the end of the last fault: recovery is watched too.
            ends = [f.at + (f.duration or 0.0) for f in scenario.faults]
            deadlines = [_fault_at(scenario, e) + e.within for e in case.expect]
            result = asyncio.run(play(name, scenario, case, max(ends + deadlines) + case.after))
        results.append(result)
        report(result)
    caught = sum(v is not None for r in results for v in r.caught.values())
    expected = sum(len(r.caught) for r in results)
    false = sum(len(r.false) for r in results)
    wrong = sum(len(r.wrong_verdicts) + len(r.uncleared) for r in results)
    hours = sum(r.hours for r in results)
    print(
        f"\ncaught {caught} of {expected}; {false} false alerts; {wrong} wrong verdicts "
        f"or alerts not cleared; "
        f"{hours:.1f} simulated hours in {sum(r.wall for r in results):.0f} s"
    )
    sys.exit(0 if caught == expected and not false and not wrong else 1)


def report(r: Result) -> None:
    names = dict.fromkeys(m.name.removeprefix("NVIDIA ") for m in r.scenario.models)
    model = "+".join(n.split()[0] for n in names) if len(names) > 1 else next(iter(names))
    shown = (
        ", ".join(
            f"{alert} {'MISSED' if delay is None else f'{delay:.0f} s'}"
            for alert, delay in r.caught.items()
        )
        or "nothing expected"
    )
    print(
        f"{r.name:24} {r.scenario.gpus}x {model:20} {r.hours:5.2f} h  {shown}; "
        f"{len(r.false)} false; {r.wall:.0f} s",
        flush=True,
    )
    for line in [*r.false, *r.wrong_verdicts, *r.uncleared]:
        print(f"    {line}")


if __name__ == "__main__":
    main()
