"""The daemon through the real pynvml over each driver profile of the simulated NVML library:
which metrics each driver generation gives, which are absent, and the verdict; and the
defects a real driver shows (errors, event waits that fail, MIG, calls an old driver lacks)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import pynvml
import pytest
import yaml

from gpuwatch import metrics as m
from gpuwatch.clock import ManualClock
from gpuwatch.config import Config
from gpuwatch.daemon import Daemon, EventLog
from gpuwatch.model import Event, GpuStatus, Sample
from gpuwatch.nvml.config import SamplingConfig
from gpuwatch.nvml.device import RECHECK_S
from gpuwatch.nvml.events import WAIT_MS
from gpuwatch.nvml.source import NvmlSource
from gpuwatch.promql.evaluator import Evaluator
from gpuwatch.promql.parse import parse
from gpuwatch.serve.payloads import node_payload
from gpuwatch.serve.readers import reader_options
from gpuwatch.sim import cdefs
from gpuwatch.sim.driver import PROFILES
from gpuwatch.sim.library import SimulatedNvml
from gpuwatch.sim.reading import RESERVED_FRACTION
from gpuwatch.sim.scenario import load_scenario
from tests.conftest import Simulate
from tests.conftest import daemon_parts as parts

ROOT = Path(__file__).resolve().parents[2]

# Two real processes, so that pids survive the psutil check and the list has more than one.
PIDS = [os.getpid(), os.getppid()]


class Node:
    """A simulated node's daemon, sampled on a manual clock."""

    def __init__(
        self,
        daemon: Daemon,
        source: NvmlSource,
        clock: ManualClock,
        library: SimulatedNvml,
        events: Iterable[Event],
    ) -> None:
        self.daemon, self.source, self.clock = daemon, source, clock
        self.library, self.events = library, events

    async def sample(self, seconds: float = 1.0) -> list[Sample]:
        self.clock.advance(seconds)
        await self.daemon.sample_once()
        batch = self.daemon.view.batch
        assert batch is not None
        return [*batch.samples, *batch.slow_samples]

    def node(self) -> dict[str, Any]:
        return node_payload(reader_options(self.daemon))


@pytest.fixture
async def node(simulate: Simulate, tmp_path: Path) -> AsyncIterator[Any]:
    started: list[Node] = []

    async def start(text: str, kind: type[SimulatedNvml] = SimulatedNvml) -> Node:
        path = tmp_path / f"scenario{len(started)}.yaml"
        path.write_text(text)
        clock = ManualClock()
        library = simulate(load_scenario(str(path)), clock, kind)
        library.node.pids.extend(PIDS)
        # Every cycle reads every field: these tests look at what each driver answers.
        config = Config(
            state_dir=str(tmp_path / f"state{len(started)}"),
            sampling=SamplingConfig(slow_interval=1.0),
        )
        log = EventLog()
        source = NvmlSource(pynvml, clock, config.sampling, log.publish)
        daemon = Daemon(config, clock, source, log, **parts(config))
        await source.start()
        await daemon.sample_once()
        started.append(Node(daemon, source, clock, library, log.recent))
        return started[-1]

    yield start
    for n in started:  # the event thread waits on the manual clock: keep it moving
        stopping = asyncio.ensure_future(n.source.stop())
        while not stopping.done():
            n.clock.advance(0.3)
            await asyncio.sleep(0.005)


def names(samples: list[Sample], gpu: str = "0") -> set[str]:
    return {s.name for s in samples if dict(s.labels).get("gpu") == gpu}


def values(
    samples: list[Sample], name: str, gpu: str = "0"
) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        s.labels[2:]: s.value for s in samples if s.name == name and s.labels[0] == ("gpu", gpu)
    }


def nvlink_types(samples: list[Sample]) -> set[str]:
    return {dict(k)["type"] for k in values(samples, m.NVLINK_ERRORS)}


def test_pynvml_is_the_real_nvidia_ml_py_at_the_version_asked_for() -> None:
    """Nothing stands in for pynvml: the module is nvidia-ml-py's own file, and under
    `make test-lowest-pin` it is the lowest release pyproject.toml allows."""
    dist = importlib.metadata.distribution("nvidia-ml-py")
    assert Path(pynvml.__file__).resolve() == Path(str(dist.locate_file("pynvml.py"))).resolve()
    expected = os.environ.get("GPUWATCH_EXPECT_PYNVML")
    if expected:
        assert dist.version == expected


ALWAYS = {m.GPU_UP, m.MEMORY_USED, m.MEMORY_TOTAL, m.SM_CLOCK, m.MEMORY_CLOCK, m.GPU_PROCESSES}
BARE_METAL = {m.TEMPERATURE, m.POWER, m.POWER_LIMIT, m.ENERGY, m.CLOCK_EVENT, m.PCIE_REPLAYS,
              m.MEMORY_TEMPERATURE, m.UTILIZATION, m.PCIE_MAX_GENERATION,
              m.PCIE_MAX_WIDTH}  # fmt: skip


class Generation(NamedTuple):
    driver: str
    model: str
    present: set[str]  # beyond what every bare-metal GPU has
    absent: set[str]
    links: set[str]  # NVLink error types


@pytest.mark.parametrize(
    "case",
    [
        # R470: no clock-event, memory-v2, _v3-process or energy-field entry points, no field
        # ids past 160 (NVLink errors and states through their calls), no recovery action.
        Generation(
            "R470",
            "A100",
            {m.ECC_ERRORS, m.REMAPPED_ROWS, m.NVLINK_LINK_UP, m.NVLINK_SPEED},
            {m.RECOVERY_ACTION, m.PCIE_BYTES},
            {"replay", "recovery", "crc_flit", "crc_data"},
        ),
        Generation(
            "R535",
            "H100",
            {m.ECC_ERRORS, m.NVLINK_BYTES, m.NVLINK_SPEED},
            {m.RECOVERY_ACTION},  # its field ids end at 196
            {"replay", "recovery", "crc_flit"},
        ),
        Generation(
            "R550",
            "V100",
            {m.RETIRED_PAGES, m.NVLINK_SPEED},
            {m.RECOVERY_ACTION, m.REMAPPED_ROWS},
            {"replay", "recovery", "crc_flit", "crc_data"},
        ),
        Generation(
            "R570",
            "H100",
            {m.RECOVERY_ACTION},
            {m.RETIRED_PAGES},
            {"replay", "recovery", "crc_flit"},
        ),
        Generation(
            "R580",
            "L4",
            {m.RECOVERY_ACTION},
            {m.NVLINK_LINK_UP, m.NVLINK_BYTES, m.NVLINK_SPEED},
            set(),
        ),
        # Blackwell: the data-link error counters give way to NVLink5's.
        Generation(
            "R580",
            "B200",
            {m.RECOVERY_ACTION, m.NVLINK_BYTES, m.NVLINK_SPEED},
            set(),
            {"link_recovery", "link_recovery_failed", "effective", "symbol"},
        ),
        Generation(
            "R615",
            "H100",
            {m.RECOVERY_ACTION, m.NVLINK_SPEED},
            set(),
            {"replay", "recovery", "crc_flit"},
        ),
    ],
    ids=lambda case: f"{case.driver}-{case.model}",
)
async def test_each_driver_generation_gives_its_metrics_and_a_healthy_verdict(
    node: Any, case: Generation
) -> None:
    n = await node(f"node: {{gpus: 2, model: {case.model}, driver: {case.driver}}}\n")
    samples = await n.sample()
    found = names(samples)
    assert found >= ALWAYS | BARE_METAL | case.present
    # No branch's PCIe byte counters: 32-bit where they exist (an H200 on R580 answered so).
    assert not found & (case.absent | {m.PCIE_BYTES})
    assert nvlink_types(samples) == case.links
    assert values(samples, m.GPU_PROCESSES) == {(): 2.0}
    assert {p.pid for p in n.daemon.view.batch.gpus[0].processes} == set(PIDS)
    assert n.node()["verdict"] == "healthy", n.node()["reasons"]
    assert n.node()["backend"]["driver_version"] == PROFILES[case.driver].driver_version


async def test_process_memory_and_pids_come_through_the_driver_struct_intact(node: Any) -> None:
    """pynvml 12.535.77 read the 24-byte nvmlProcessInfo_t that R535+ drivers write as 32-byte
    entries: from the second process on, pids and memory were scrambled."""
    n = await node("node: {gpus: 1, model: H100, driver: R535}\n")
    await n.sample()
    processes = n.daemon.view.batch.gpus[0].processes
    assert [p.pid for p in processes] == PIDS
    used = [p.gpu_memory_bytes for p in processes]
    assert used[0] is not None and used[1] is not None
    assert used[0] == pytest.approx(9 * used[1], rel=1e-6)  # the simulated 90/10 split


async def test_an_r470_driver_without_the_v3_process_call_keeps_its_gpus_healthy(
    node: Any,
) -> None:
    """nvidia-ml-py >= 12.550 raises NVMLLibraryMismatchError (not an NVMLError) for the
    unversioned process call on drivers before R510; it must not make the GPU unresponsive."""
    n = await node("node: {gpus: 2, model: A100, driver: R470}\n")
    samples = await n.sample()
    assert [g.status for g in n.daemon.view.batch.gpus] == [GpuStatus.OK, GpuStatus.OK]
    assert values(samples, m.GPU_PROCESSES) == {(): 2.0}
    assert values(samples, m.GPU_UP) == {(): 1.0}


async def test_clock_reasons_and_energy_come_from_the_older_calls_on_r470(node: Any) -> None:
    n = await node(
        "node: {gpus: 1, model: A100, driver: R470}\n"
        "faults: [{kind: hw_slowdown, gpu: 0, at: 5s}]\n"
    )
    await n.sample()
    samples = await n.sample(10.0)
    reasons = values(samples, m.CLOCK_EVENT)
    assert reasons[(("reason", "hw_slowdown"),)] == 1.0
    assert values(samples, m.ENERGY)[()] > 0
    assert n.library.called["nvmlDeviceGetCurrentClocksThrottleReasons"] > 0
    assert n.library.called["nvmlDeviceGetTotalEnergyConsumption"] > 0


async def test_newer_drivers_are_read_through_their_current_calls(node: Any) -> None:
    """Memory used from nvmlMemory_v2 (v1 counts what the driver reserves) and temperature
    from nvmlDeviceGetTemperatureV (nvmlDeviceGetTemperature is deprecated in NVML 13), where
    pynvml has its wrapper (12.570 and later)."""
    n = await node("node: {gpus: 1, model: H100, driver: R580}\n")
    samples = await n.sample()
    used = values(samples, m.MEMORY_USED)[()]
    total = values(samples, m.MEMORY_TOTAL)[()]
    reading = n.library.node.gpus[0].reading()
    assert used == reading.memory_used
    assert used < reading.memory_used + total * RESERVED_FRACTION / 2
    if hasattr(pynvml, "nvmlDeviceGetTemperatureV"):
        assert n.library.called["nvmlDeviceGetTemperatureV"] > 0
        assert n.library.called["nvmlDeviceGetTemperature"] == 0
    else:
        assert n.library.called["nvmlDeviceGetTemperature"] > 0
    old = await node("node: {gpus: 1, model: H100, driver: R470}\n")
    old_samples = await old.sample()
    old_reading = old.library.node.gpus[0].reading()
    assert values(old_samples, m.MEMORY_USED)[()] > old_reading.memory_used  # v1: + reserved


async def test_a_gpu_that_answers_reset_required_is_failing_with_its_action(node: Any) -> None:
    n = await node(
        "node: {gpus: 2, model: H100}\n"
        "faults: [{kind: nvml_error, gpu: 1, at: 5s, duration: 20s, error: RESET_REQUIRED}]\n"
    )
    await n.sample(6.0)
    samples = await n.sample()
    gpu1 = n.daemon.view.batch.gpus[1]
    assert gpu1.status == GpuStatus.FAILING
    assert values(samples, m.GPU_UP, "1") == {(): 0.0}
    assert m.TEMPERATURE not in names(samples, "1")
    payload = n.node()
    assert payload["verdict"] == "unhealthy"
    [cause] = payload["causes"]
    assert cause["key"] == "gpu-nvml-error"
    assert "NVML_ERROR_RESET_REQUIRED" in cause["reason"]
    assert "reset the GPU" in cause["action"]
    assert ("gpu_failing", 1) in [(e.kind, e.gpu) for e in n.events]
    await n.sample(20.0)  # the fault is over: the GPU answers again
    assert n.daemon.view.batch.gpus[1].status == GpuStatus.OK
    assert n.node()["verdict"] == "healthy"


async def test_an_unknown_error_on_every_call_is_failing_too(node: Any) -> None:
    n = await node(
        "node: {gpus: 1, model: H100}\n"
        "faults: [{kind: nvml_error, gpu: 0, at: 5s, error: UNKNOWN}]\n"
    )
    samples = await n.sample(6.0)
    assert values(samples, m.GPU_UP) == {(): 0.0}
    cause = n.node()["causes"][0]
    assert "NVML_ERROR_UNKNOWN" in cause["reason"] and "dmesg" in cause["action"]


async def test_a_gpu_that_answers_not_supported_to_everything_is_not_healthy(
    node: Any,
) -> None:
    """Every value retired as NOT_SUPPORTED leaves nothing to judge: not a healthy GPU."""
    n = await node(
        "node: {gpus: 2, model: H100}\n"
        "faults: [{kind: nvml_error, gpu: 1, at: 5s, duration: 1m, error: NOT_SUPPORTED}]\n"
    )
    for _ in range(3):  # also once every value is retired and nothing is asked for
        samples = await n.sample(6.0)
        assert values(samples, m.GPU_UP, "1") == {(): 0.0}
        assert n.daemon.view.batch.gpus[1].status == GpuStatus.FAILING
        payload = n.node()
        assert payload["verdict"] == "unhealthy"
        [cause] = payload["causes"]
        assert cause["key"] == "gpu-nvml-error" and "GPU 1" in cause["reason"]
        assert "NVML_ERROR_NOT_SUPPORTED" in cause["reason"]
    await n.sample(60.0)
    samples = await n.sample(RECHECK_S)  # the fault is over; the recheck asks again
    assert values(samples, m.GPU_UP, "1") == {(): 1.0}
    assert m.TEMPERATURE in names(samples, "1")
    assert n.node()["verdict"] == "healthy"


async def test_fields_a_driver_lacks_on_every_link_are_logged_as_one_entry(
    node: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "gpuwatch.nvml.device")
    await node("node: {gpus: 1, model: H100, driver: R535}\n")
    [line] = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert 'gpuwatch_gpu_nvlink_errors_total{type="symbol"} (field 221) on 18 links' in line
    assert len(line) < 1000


async def test_a_field_refused_once_is_asked_for_again(node: Any) -> None:
    """A NOT_SUPPORTED answer (MIG switched off again, a transient state) retires a value only
    until the next recheck, not for the life of the process."""
    n = await node(
        "node: {gpus: 1, model: H100}\n"
        "faults: [{kind: nvml_error, gpu: 0, at: 5s, duration: 10s, error: NOT_SUPPORTED}]\n"
    )
    samples = await n.sample(6.0)
    assert m.TEMPERATURE not in names(samples)
    samples = await n.sample(20.0)
    assert m.TEMPERATURE not in names(samples)  # retired until the recheck
    samples = await n.sample(RECHECK_S)
    assert names(samples) >= {m.TEMPERATURE, m.ECC_ERRORS, m.POWER, m.CLOCK_EVENT}


async def _wait_for(n: Node, kind: str, gpu: int, seconds: float = 1.0) -> list[Event]:
    """Samples until an event of `kind` on `gpu` is in the journal (the event thread waits on
    the manual clock too)."""
    for _ in range(200):
        await n.sample(seconds)
        found = [e for e in n.events if e.kind == kind and e.gpu == gpu]
        if found:
            return found
        await asyncio.sleep(0.01)
    raise AssertionError(f"no {kind} event on GPU {gpu}: {[(e.kind, e.gpu) for e in n.events]}")


async def test_a_lost_gpu_does_not_cost_the_others_their_xids(node: Any) -> None:
    """nvml.h: the shared event set's wait answers GPU_IS_LOST while any of its GPUs is lost."""
    n = await node(
        "node: {gpus: 4, model: H100}\n"
        "faults:\n"
        "  - {kind: fall_off_bus, gpu: 1, at: 5s}\n"
        "  - {kind: xid, gpu: 2, at: 20s, code: 48}\n"
    )
    await _wait_for(n, "xid", 1)
    found = await _wait_for(n, "xid", 2)
    assert found[0].data["xid"] == 48


async def test_an_event_wait_error_on_one_gpu_does_not_cost_the_others_their_xids(
    node: Any,
) -> None:
    n = await node(
        "node: {gpus: 4, model: H100}\n"
        "faults:\n"
        "  - {kind: event_wait_error, gpu: 0, at: 2s, error: UNKNOWN}\n"
        "  - {kind: xid, gpu: 3, at: 20s, code: 79}\n"
    )
    found = await _wait_for(n, "xid", 3)
    assert found[0].data["xid"] == 79


async def test_an_event_wait_that_answers_timeout_at_once_is_not_a_busy_loop(
    node: Any,
) -> None:
    """A wait that returns TIMEOUT without blocking: the event thread paces itself to about
    one wait per WAIT_MS of the clock, instead of calling into the driver as fast as it can."""
    n = await node(
        "node: {gpus: 2, model: H100}\n"
        "faults: [{kind: event_wait_error, gpu: 0, at: 0s, error: TIMEOUT}]\n"
    )
    before = n.library.called["nvmlEventSetWait_v2"]
    for _ in range(20):  # 10 s of the clock, in steps the event thread can follow
        n.clock.advance(0.5)
        await asyncio.sleep(0.02)
    waits = n.library.called["nvmlEventSetWait_v2"] - before
    assert 5 <= waits <= 10 / (WAIT_MS / 1000) + 20


async def test_a_gpu_whose_event_wait_keeps_failing_is_logged_once_until_it_recovers(
    node: Any, caplog: pytest.LogCaptureFixture
) -> None:
    n = await node(
        "node: {gpus: 2, model: H100}\n"
        "faults: [{kind: event_wait_error, gpu: 0, at: 2s, duration: 100s, error: UNKNOWN}]\n"
    )
    caplog.set_level(logging.INFO, "gpuwatch.nvml.events")
    for _ in range(150):  # 150 s of the clock: the GPU is tried again every QUARANTINE_S
        n.clock.advance(1.0)
        await asyncio.sleep(0.01)
    messages = [r.getMessage() for r in caplog.records if r.name == "gpuwatch.nvml.events"]
    assert sum("cannot be watched" in msg for msg in messages) == 1, messages
    assert sum("watched again" in msg for msg in messages) == 1, messages


class _NoStormRegistration(SimulatedNvml):
    """A driver that reports the SBE-storm event type as supported but refuses to register it
    (nvml.h: then none of the requested types is registered)."""

    def nvmlDeviceRegisterEvents(self, handle: int, event_types: int, address: int) -> int:
        if event_types & 0x200:
            return cdefs.ERROR_NOT_SUPPORTED
        return super().nvmlDeviceRegisterEvents(handle, event_types, address)


async def test_one_event_type_a_gpu_refuses_does_not_cost_its_xids(node: Any) -> None:
    n = await node(
        "node: {gpus: 2, model: H100}\nfaults: [{kind: xid, gpu: 1, at: 5s, code: 94}]\n",
        _NoStormRegistration,
    )
    found = await _wait_for(n, "xid", 1)
    assert found[0].data["xid"] == 94


async def test_a_gpu_opened_after_start_is_watched_for_events(node: Any) -> None:
    n = await node(
        "node: {gpus: 2, model: H100}\n"
        "faults:\n"
        "  - {kind: nvml_error, gpu: 1, at: 0s, duration: 5s, error: UNKNOWN}\n"
        "  - {kind: xid, gpu: 1, at: 45s, code: 48}\n"
    )
    assert n.daemon.view.batch.gpus[1].status != GpuStatus.OK  # could not be opened at start
    found = await _wait_for(n, "xid", 1)
    assert found[0].data["xid"] == 48
    assert n.daemon.view.batch.gpus[1].status == GpuStatus.OK


@pytest.mark.parametrize(
    ("action", "name"), [(5, "recover_imex_domain"), (6, "bus_reset"), (7, "system_reboot")]
)
async def test_the_newest_recovery_actions_are_known(node: Any, action: int, name: str) -> None:
    n = await node(
        "node: {gpus: 2, model: H100, driver: R615}\n"
        f"faults: [{{kind: recovery_action, gpu: 1, at: 5s, action: {action}}}]\n"
    )
    found = await _wait_for(n, "recovery_action", 1)
    assert found[0].message == f"GPU 1: the driver asks for {name}"
    samples = await n.sample()
    one_hot = values(samples, m.RECOVERY_ACTION, "1")
    assert one_hot[(("action", name),)] == 1.0
    assert sum(one_hot.values()) == 1.0
    payload = n.node()
    assert payload["verdict"] == "unhealthy"
    assert payload["causes"][0]["key"] == "recovery-action"


async def test_a_failed_nvlink5_recovery_is_counted_once(node: Any) -> None:
    """NVLink5's recovery count holds the failed recoveries too; the verdict counts each once."""
    n = await node(
        "node: {gpus: 2, model: B200}\n"
        "faults: [{kind: nvlink_down, gpu: 1, at: 5s, duration: 10s}]\n"
    )
    await n.sample(6.0)
    samples = await n.sample(20.0)
    errors = values(samples, m.NVLINK_ERRORS, "1")
    link = next(dict(k)["link"] for k, v in errors.items() if v)
    assert errors[(("link", link), ("type", "link_recovery"))] == 1.0
    assert errors[(("link", link), ("type", "link_recovery_failed"))] == 1.0
    # The hardware pack's rule for the verdict's nvlink-replay cause sees one error, not two.
    groups = yaml.safe_load((ROOT / "rules" / "hardware.yaml").read_text())["groups"]
    [rule] = [
        r for g in groups for r in g["rules"] if r.get("labels", {}).get("cause") == "nvlink-replay"
    ]
    [found] = Evaluator(n.daemon.store).eval(parse(rule["expr"]), n.clock.now())
    assert dict(found.metric)["link"] == link
    assert 1.0 <= found.value < 1.5  # increase() extrapolates one error a little; two is 2+


LINKS = """\
node: {gpus: 3, model: H100, workload: training}
faults:
  - {kind: nvlink_saturated, gpu: 0, at: 0s}
  - {kind: p2p_disabled, gpu: 1, at: 0s}
"""


def training_rule(name: str) -> str:
    groups = yaml.safe_load((ROOT / "rules" / "training.yaml").read_text())["groups"]
    [rule] = [r for g in groups for r in g["rules"] if r.get("alert") == name]
    return str(rule["expr"])


async def test_the_link_rules_name_a_saturated_nvlink_and_peer_traffic_over_pcie(
    node: Any,
) -> None:
    """Six minutes of GPU 0's collectives at the NVLink ceiling, GPU 1's staged through host
    memory, GPU 2 training as it should, read through pynvml: the training pack's link rules
    name each GPU for what it does, and the healthy one for nothing. PCIe traffic comes from
    nvmlDeviceGetPcieThroughput, read in each GPU's lane apart from the cycle."""
    n = await node(LINKS)
    for _ in range(24):
        samples = await n.sample(15.0)
    assert values(samples, m.NVLINK_SPEED) == {(): 26562e6}  # nvidia-smi's 26.562 GB/s
    evaluator = Evaluator(n.daemon.store)
    found = {}
    for name in ("GpuNvlinkSaturated", "GpuPcieSaturated", "GpuPeerTrafficOverPcie"):
        vector = evaluator.eval(parse(training_rule(name)), n.clock.now())
        found[name] = {dict(v.metric)["gpu"]: round(v.value, 2) for v in vector}
    # Host-staged traffic at 70% of the link names the wrong link, not a full one (80%).
    assert found == {
        "GpuNvlinkSaturated": {"0": 0.77},
        "GpuPcieSaturated": {},
        "GpuPeerTrafficOverPcie": {"1": pytest.approx(0.67, abs=0.03)},
    }
    assert values(samples, m.PCIE_MAX_GENERATION) == {(): 5.0}
    assert values(samples, m.PCIE_MAX_WIDTH) == {(): 16.0}
    # GPU 2: the input's copies one way (2% of the link's rate), NVLink busy as training is.
    rx = evaluator.eval(
        parse('avg_over_time(gpuwatch_gpu_pcie_throughput_bytes_per_second{gpu="2"}[5m])'),
        n.clock.now(),
    )
    assert {dict(v.metric)["direction"]: v.value / 63e9 for v in rx} == {
        "rx": pytest.approx(0.02, abs=0.003),
        "tx": pytest.approx(0.002, abs=0.0005),
    }


async def test_pcie_byte_counters_answered_in_32_bits_are_left_out(
    node: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """As an H200 on R580 answers them (tests/fixtures/nvml): 4 GiB wraps in a tenth of a
    second at Gen5 x16, so such a counter read every few seconds would report a rate that
    means nothing. The GPU exports none, says why, and keeps the rest."""
    caplog.set_level(logging.INFO, logger="gpuwatch.nvml.device")
    n = await node("node: {gpus: 2, model: H100, workload: training}\n")
    samples = await n.sample(5.0)
    assert m.PCIE_BYTES not in names(samples)
    assert 'gpuwatch_gpu_pcie_bytes_total{direction="tx"} (field 197) (32 bits' in caplog.text
    assert {m.NVLINK_BYTES, m.NVLINK_SPEED, m.ECC_ERRORS} <= names(samples)
    assert n.node()["verdict"] == "healthy", n.node()["reasons"]


FABRIC = """\
node: {gpus: 4, model: H100, driver: DRIVER, nvswitches: 4}
faults:
  - {kind: fabric_unregistered, gpu: 1, at: 0s}
  - {kind: fabric_unregistered, gpu: 2, at: 0s, error: UNKNOWN}
  - {kind: fabric_degraded, gpu: 3, at: 0s, condition: route_unhealthy}
"""
FABRIC_SERIES = {m.FABRIC_STATE, m.FABRIC_STATUS, m.FABRIC_CONDITION, m.FABRIC_HEALTH}


@pytest.mark.parametrize("driver", ["R535", "R550", "R580"])
async def test_the_nvlink_fabric_comes_through_each_drivers_struct(node: Any, driver: str) -> None:
    """R535 has only the unversioned call (no health bits), R550 takes the v2 struct, R580
    the v3 one with the health summary: each read through the struct nvml.h declares (the
    lowest nvidia-ml-py declares v2's UUID 80 bytes long; its fields after it would be 0)."""
    scenario = FABRIC.replace("DRIVER", driver)
    if driver == "R535":  # no health bits to set: a scenario asking for one is refused
        scenario = "".join(x for x in scenario.splitlines(True) if "fabric_degraded" not in x)
    n = await node(scenario)
    samples = await n.sample()

    def state(gpu: str) -> set[str]:
        found = values(samples, m.FABRIC_STATE, gpu)
        assert len(found) == 3
        return {dict(k)["state"] for k, v in found.items() if v == 1.0}

    assert [state(g) for g in "0123"] == [
        {"completed"},
        {"in_progress"},
        {"completed"},
        {"completed"},
    ]
    assert values(samples, m.FABRIC_STATUS, "0") == {(): 0.0}
    assert values(samples, m.FABRIC_STATUS, "1") == {}  # meaningful once completed
    assert values(samples, m.FABRIC_STATUS, "2") == {(): float(cdefs.ERROR_UNKNOWN)}
    conditions = values(samples, m.FABRIC_CONDITION, "3")
    summary = values(samples, m.FABRIC_HEALTH, "3")
    if driver == "R535":
        assert conditions == {} and summary == {}
    else:
        assert {dict(k)["condition"] for k, v in conditions.items() if v} == {"route_unhealthy"}
        assert len(conditions) == (3 if driver == "R550" else 5)  # the fields each branch fills
        assert values(samples, m.FABRIC_CONDITION, "0") and not any(
            values(samples, m.FABRIC_CONDITION, "0").values()
        )
    if driver == "R580":
        assert {dict(k)["summary"] for k, v in summary.items() if v} == {"unhealthy"}
        assert values(samples, m.FABRIC_HEALTH, "0")[(("summary", "healthy"),)] == 1.0
    else:
        assert summary == {}


@pytest.mark.parametrize(
    "scenario",
    [
        "node: {gpus: 2, model: H100, driver: R580}",  # no NVSwitch: a PCIe board, or NVLink pairs
        "node: {gpus: 2, model: A100, driver: R580, nvswitches: 6}",  # before Hopper
        "node: {gpus: 2, model: A100, driver: R470, nvswitches: 6}",  # before the call
    ],
)
async def test_a_gpu_without_a_fabric_has_no_fabric_series(node: Any, scenario: str) -> None:
    n = await node(scenario + "\n")
    samples = await n.sample()
    assert not {s.name for s in samples} & FABRIC_SERIES
    assert n.node()["verdict"] == "healthy"


async def test_a_vgpu_guest_and_a_gpu_without_ecc_leave_out_what_they_cannot_read(
    node: Any,
) -> None:
    guest = await node("node: {gpus: 1, model: A100, virtualization: vgpu_guest}\n")
    for _ in range(3):  # PCIe throughput is read apart from the cycle, and comes after it
        samples = await guest.sample()
    assert names(samples) >= ALWAYS | {m.UTILIZATION}
    assert not names(samples) & {
        m.TEMPERATURE,
        m.POWER,
        m.ECC_ERRORS,
        m.MEMORY_TEMPERATURE,
        m.NVLINK_LINK_UP,
        m.PCIE_REPLAYS,
        m.PCIE_THROUGHPUT,
    }
    assert guest.node()["verdict"] == "healthy"
    no_ecc = await node("node: {gpus: 1, model: L4, ecc: false}\n")
    samples = await no_ecc.sample()
    assert m.ECC_ERRORS not in names(samples)
    assert names(samples) >= ALWAYS | BARE_METAL
    assert no_ecc.node()["verdict"] == "healthy"
    # nvml.h: ECC events only on ECC-enabled devices (DBE 0x2, SBE storm 0x200, retirement).
    events = pynvml.nvmlDeviceGetSupportedEventTypes(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert events & 0x8 and not events & (0x2 | 0x200 | 0x400 | 0x800)


async def test_mig_instances_have_their_own_memory_and_processes(node: Any) -> None:
    n = await node(
        "node:\n  gpus: 2\n  model: H100\n"
        "  mig: [{gpu: 0, instances: [3g.40gb, 2g.20gb, 1g.10gb]}]\n"
    )
    samples = await n.sample()
    instances = {
        dict(k)["gpu_i_id"]: (dict(k)["gpu_i_profile"], v)
        for k, v in values(samples, m.INSTANCE_MEMORY_TOTAL).items()
    }
    assert instances == {
        "1": ("3g.40gb", 40 * 2**30),
        "3": ("2g.20gb", 20 * 2**30),
        "7": ("1g.10gb", 10 * 2**30),
    }
    used = {dict(k)["gpu_i_id"]: v for k, v in values(samples, m.INSTANCE_MEMORY_USED).items()}
    assert used["1"] > 0 and used["3"] == used["7"] == 0
    procs = {dict(k)["gpu_i_id"]: v for k, v in values(samples, m.INSTANCE_PROCESSES).items()}
    assert procs == {"1": 2.0, "3": 0.0, "7": 0.0}
    # The parent: no utilization of its own in MIG mode (absent, not 0); the rest as before.
    assert m.UTILIZATION not in names(samples, "0")
    assert names(samples, "0") >= {m.TEMPERATURE, m.POWER, m.ECC_ERRORS, m.MEMORY_USED}
    assert not values(samples, m.INSTANCE_MEMORY_USED, "1")  # GPU 1 is not in MIG mode
    gpu0 = n.daemon.view.batch.gpus[0]
    assert [(i.gpu_instance_id, i.profile, i.pids) for i in gpu0.instances] == [
        (1, "3g.40gb", tuple(PIDS)),
        (3, "2g.20gb", ()),
        (7, "1g.10gb", ()),
    ]
    assert n.node()["verdict"] == "healthy"


CAPTURE = "h200-r580.159.04.json"


async def test_field_values_come_in_the_types_a_real_driver_answers(node: Any) -> None:
    """Each field id a real H200 on R580 answered (tests/fixtures/nvml) comes from the
    simulated H100 on R580 in the same nvmlValueType_t: a 32-bit count where the driver's is
    one, so what the reader makes of it is what it makes of a real answer."""
    capture = json.loads((ROOT / "tests" / "fixtures" / "nvml" / CAPTURE).read_text())
    answered = {
        f["field"]: f["type"]
        for f in capture["gpus"][0]["field_values"]["value"]
        if f["return"] == 0 and f["scope"] == 0
    }
    assert {197, 198, 82, 3, 191} <= set(answered)
    await node("node: {gpus: 1, model: H100, driver: R580}\n")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    simulated = {
        v.fieldId: v.valueType
        for v in pynvml.nvmlDeviceGetFieldValues(handle, sorted(answered))
        if v.nvmlReturn == pynvml.NVML_SUCCESS
    }
    assert simulated == answered
