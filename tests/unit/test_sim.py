"""The simulator: coupled signals and faults, read through the real pynvml over the simulated
NVML library."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuwatch.clock import ManualClock
from gpuwatch.sim.faults import FAULT_KINDS, HOST_FAULT_KINDS, JOB_FAULT_KINDS, Fault
from gpuwatch.sim.library import SimulatedNvml
from gpuwatch.sim.scenario import builtin_names, load_scenario
from gpuwatch.text.yamlfile import FileError
from tests.conftest import Simulate


@pytest.fixture
def nvml(simulate: Simulate) -> Any:
    """Opens a built-in scenario's node: (pynvml, clock)."""

    def open_node(name: str = "healthy") -> tuple[Any, ManualClock]:
        clock = ManualClock()
        simulate(load_scenario(name), clock)
        pynvml.nvmlInit()
        return pynvml, clock

    return open_node


def test_builtin_scenarios_cover_the_sampling_faults() -> None:
    names = set(builtin_names())
    assert {
        "demo",
        "healthy",
        "nvml_hang",
        "fall_off_bus",
        "thermal_runaway",
        "hw_slowdown",
        "power_brake",
        "xid",
    } <= names
    for name in names - {"demo", "healthy", "mig"} - set(HOST_FAULT_KINDS):
        scenario = load_scenario(name)
        assert scenario.gpus == 8
        assert next(f for f in scenario.faults if f.kind == name) == Fault(
            kind=name,
            gpu=1,
            # Job faults come after a minute of normal training, so the job has a history.
            # gpu_missing: gone from the start, as after a reboot.
            at=60.0 if name in JOB_FAULT_KINDS else 0.0 if name == "gpu_missing" else 10.0,
            duration={"nvml_hang": 30.0, "thermal_shutdown": 60.0}.get(name),
            code=48 if name == "xid" else None,
            action=1 if name == "recovery_action" else None,
            error={"nvml_error": "RESET_REQUIRED", "event_wait_error": "UNKNOWN"}.get(name),
            rate=0.1 if name == "nvlink_replay" else None,
        )
    assert load_scenario("healthy").faults == ()
    for name in HOST_FAULT_KINDS:  # a port's or an NVSwitch's, not a GPU's
        scenario = load_scenario(name)
        assert scenario.gpus == 8
        [fault] = scenario.faults
        assert (fault.kind, fault.at, fault.duration) == (name, 10.0, None)
        if name != "fabric_manager_down":  # the node's one Fabric Manager
            assert fault.switch == 1 if name == "sxid" else fault.port == 1


def scenario_problems(path: Path, text: str) -> str:
    """What loading a scenario file with this text reports; it must be refused."""
    path.write_text(text)
    with pytest.raises(FileError) as caught:
        load_scenario(str(path))
    return str(caught.value)


def test_scenario_errors_name_the_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    text = scenario_problems(
        path,
        "node: {gpus: 2, model: B300}\n"
        "faults:\n"
        "  - {kind: xid, gpu: 5, at: soon}\n"
        "  - {kind: nan_loss_soon, gpu: 0}\n"
        "  - {kind: hw_slowdown}\n",
    )
    assert f"{path}:1: node.model: unknown GPU model 'B300'" in text
    assert f"{path}:3: faults[0].gpu: expected a GPU index from 0 to 1 or all, got 5" in text
    assert f"{path}:3: faults[0].at: expected a duration" in text
    assert f"{path}:3: faults[0]: missing 'code' (the XID number)" in text
    assert f"{path}:4: faults[1].kind: unknown fault kind 'nan_loss_soon'" in text
    assert f"{path}:5: faults[2]: missing 'gpu'" in text


def test_fabric_faults_a_node_cannot_have_are_named(tmp_path: Path) -> None:
    """Accepted, they would play nothing: no fabric before Hopper or without NVSwitches, no
    health field the driver branch does not fill."""
    path = tmp_path / "fabric.yaml"
    text = scenario_problems(
        path,
        "node: {gpus: 2, model: [A100, H100], driver: R550, nvswitches: 4}\n"
        "faults:\n"
        "  - {kind: fabric_degraded, gpu: 0}\n"
        "  - {kind: fabric_degraded, gpu: 1, condition: incorrect_configuration}\n"
        "  - {kind: fabric_unregistered, gpu: 1, condition: route_unhealthy}\n",
    )
    assert f"{path}:3: faults[0].kind: NVIDIA A100-SXM4-80GB has no place in an NVLink" in text
    assert (
        f"{path}:4: faults[1].condition: driver R550 reports these fabric conditions: "
        "degraded_bandwidth, route_recovery, route_unhealthy"
    ) in text
    assert f"{path}:5: faults[2].condition: only fabric_degraded takes a condition" in text
    path.write_text("node: {gpus: 2}\nfaults: [{kind: fabric_manager_down}]\n")
    with pytest.raises(FileError, match=r"fabric_manager_down needs node\.nvswitches"):
        load_scenario(str(path))


def test_work_drives_power_and_power_drives_temperature(nvml: Any) -> None:
    nvml, clock = nvml()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    busy_power = nvml.nvmlDeviceGetPowerUsage(h)
    busy_temp = nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    assert nvml.nvmlDeviceGetUtilizationRates(h).gpu >= 90
    assert 500_000 < busy_power <= 700_000
    # Ten minutes in, the training job checkpoints: utilization, power and then heat fall.
    clock.advance(605)
    assert nvml.nvmlDeviceGetUtilizationRates(h).gpu < 10
    idle_power = nvml.nvmlDeviceGetPowerUsage(h)
    assert idle_power < 120_000
    clock.advance(14)
    assert nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) < busy_temp - 10
    reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert reasons & pynvml.nvmlClocksEventReasonGpuIdle


def test_energy_integrates_power_and_nvlink_bytes_grow_with_work(nvml: Any) -> None:
    nvml, clock = nvml()
    h = nvml.nvmlDeviceGetHandleByIndex(3)
    fields = [pynvml.NVML_FI_DEV_ENERGY, (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0)]
    before = [v.value.ullVal for v in nvml.nvmlDeviceGetFieldValues(h, fields)]
    clock.advance(60)
    after = [v.value.ullVal for v in nvml.nvmlDeviceGetFieldValues(h, fields)]
    watts = (after[0] - before[0]) / 1000 / 60
    assert 500 < watts <= 700
    gib_per_s = (after[1] - before[1]) * 1024 / 60 / 2**30
    assert 5 < gib_per_s < 25


def test_hopper_reports_absent_fields_as_not_supported(nvml: Any) -> None:
    nvml, _ = nvml()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    values = nvml.nvmlDeviceGetFieldValues(
        h, [pynvml.NVML_FI_DEV_RETIRED_SBE, pynvml.NVML_FI_DEV_REMAPPED_UNC]
    )
    assert values[0].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert values[1].nvmlReturn == pynvml.NVML_SUCCESS
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):  # a symbol this library lacks
        nvml.nvmlDeviceGetBoardId(h)


def test_thermal_runaway_climbs_into_thermal_slowdown(nvml: Any) -> None:
    nvml, clock = nvml("thermal_runaway")
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    start = nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    clock.advance(180)
    hot = nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    assert hot >= 89 > start  # the H100's hardware slowdown temperature
    assert (
        nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        & pynvml.nvmlClocksEventReasonHwThermalSlowdown
    )
    other = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetTemperature(other, pynvml.NVML_TEMPERATURE_GPU) < 80


@pytest.mark.parametrize(
    ("scenario", "bit", "max_clock"),
    [
        ("hw_slowdown", pynvml.nvmlClocksEventReasonHwSlowdown, 1000),
        ("power_brake", pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown, 400),
    ],
)
def test_slowdowns_hold_clocks_and_power_down(
    nvml: Any, scenario: str, bit: int, max_clock: int
) -> None:
    nvml, clock = nvml(scenario)
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    assert not nvml.nvmlDeviceGetCurrentClocksEventReasons(h) & bit
    clock.advance(11)
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(h) & bit
    assert nvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) < max_clock
    assert nvml.nvmlDeviceGetPowerUsage(h) < 450_000


def test_fall_off_bus_answers_gpu_is_lost_and_sends_xid_79(nvml: Any) -> None:
    nvml, clock = nvml("fall_off_bus")
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, events)
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(events, 0)
    clock.advance(10)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    data = nvml.nvmlEventSetWait_v2(events, 0)
    assert data.eventData == 79
    assert data.eventType == pynvml.nvmlEventTypeXidCriticalError
    other = nvml.nvmlDeviceGetHandleByIndex(2)
    assert nvml.nvmlDeviceGetTemperature(other, pynvml.NVML_TEMPERATURE_GPU) > 0


def test_calls_before_init_fail_as_nvml_does(simulate: Simulate) -> None:
    simulate(load_scenario("healthy"), ManualClock())
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_the_scenario_in_the_simulator_docs_loads(tmp_path: Path) -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"
    block, host = re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)
    path = tmp_path / "doc.yaml"
    path.write_text(block)
    scenario = load_scenario(str(path))
    (tmp_path / "host.yaml").write_text(host)
    ports = load_scenario(str(tmp_path / "host.yaml"))
    assert (ports.ib_ports, ports.nvswitches) == (8, 4)
    assert [(f.kind, f.port) for f in ports.faults][:2] == [
        ("ib_port_down", 0),
        ("ib_port_flap", 1),
    ]
    assert (scenario.driver.name, scenario.mig) == ("R615", {0: ("3g.40gb", "2g.20gb", "1g.10gb")})
    kinds = [(f.kind, f.gpu) for f in scenario.faults]
    assert kinds[:5] == [
        ("nvml_error", 1),
        ("event_wait_error", 2),
        ("recovery_action", 3),
        ("pcie_replay_storm", 4),
        ("nvlink_crc_storm", 5),
    ]
    assert next(f for f in scenario.faults if f.kind == "nvlink_crc_storm").link == 3
    assert [g for k, g in kinds if k == "nccl_hang"] == list(range(8))


def test_scenario_errors_for_the_node_and_library_faults(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "node: {gpus: 2, model: L4, driver: R999, mig: [{gpu: 0, instances: [9g.99gb]}]}\n"
        "faults:\n"
        "  - {kind: nvml_error, gpu: 0}\n"
        "  - {kind: event_wait_error, gpu: 1, error: SOMETIMES}\n"
        "  - {kind: recovery_action, gpu: 1, action: 9}\n"
    )
    with pytest.raises(FileError) as caught:
        load_scenario(str(path))
    text = str(caught.value)
    assert f"{path}:1: node.driver: expected one of R470, R535, R550, R570, R580, R615" in text
    assert f"{path}:1: node.mig[0].instances: not a MIG profile like 3g.40gb" in text
    assert f"{path}:3: faults[0]: missing 'error' (the NVML error, e.g. UNKNOWN)" in text
    assert f"{path}:4: faults[1].error: expected one of" in text
    assert f"{path}:5: faults[2].action: expected a whole number from 0 to 7, got 9" in text
    newer = tmp_path / "newer.yaml"
    newer.write_text(
        "node: {gpus: 1, driver: R580}\nfaults: [{kind: recovery_action, gpu: 0, action: 6}]\n"
    )
    with pytest.raises(FileError, match="driver R580 knows recovery actions 0-4"):
        load_scenario(str(newer))
    b200 = tmp_path / "b200.yaml"
    b200.write_text("node: {gpus: 1, model: B200, driver: R535}\n")
    with pytest.raises(FileError, match="NVIDIA B200 needs driver R570 or newer"):
        load_scenario(str(b200))


def test_scenario_errors_for_what_the_node_cannot_have(tmp_path: Path) -> None:
    path = tmp_path / "impossible.yaml"
    path.write_text(
        "node:\n"
        "  gpus: 2\n"
        "  model: H100\n"
        "  ecc: false\n"
        "  mig:\n"
        "    - {gpu: 0, instances: [4g.40gb, 3g.60gb]}\n"
        "    - {gpu: 1, instances: [5g.50gb]}\n"
        "    - {gpu: 1, instances: [1g.10gb]}\n"
        "    - {gpu: 1, instances: [2g.20gb]}\n"
        "faults:\n"
        "  - {kind: ecc_dbe, gpu: 0, at: 5s}\n"
        "  - {kind: row_remap_pending, gpu: 1, at: 5s}\n"
    )
    with pytest.raises(FileError) as caught:
        load_scenario(str(path))
    problems = str(caught.value).splitlines()
    mig = f"{path}:{{}}: node.mig[{{}}].instances: {{}}".format
    assert mig(6, 0, "100 GB of instances; the NVIDIA H100 80GB HBM3 has 80 GB") in problems
    assert mig(7, 1, "not a MIG profile like 3g.40gb (1-4 or 7g): '5g.50gb'") in problems
    assert mig(9, 3, "GPU 1 is listed twice") in problems
    fault = f"{path}:{{}}: faults[{{}}].kind: {{}} needs ECC memory; this node has {{}}".format
    assert fault(11, 0, "ecc_dbe", "node.ecc: false") in problems
    assert fault(12, 1, "row_remap_pending", "node.ecc: false") in problems


def test_each_simulated_node_has_gpus_of_its_own_the_same_at_each_start() -> None:
    def identities(node: str) -> list[tuple[str, str]]:
        SimulatedNvml(load_scenario("healthy"), ManualClock(), node=node).install()
        try:
            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
            found = [(pynvml.nvmlDeviceGetUUID(h), pynvml.nvmlDeviceGetSerial(h)) for h in handles]
            pynvml.nvmlShutdown()
            return found
        finally:
            SimulatedNvml.uninstall()

    nodes = {node: identities(node) for node in ("", "gpu-node-01", "gpu-node-02")}
    for found in nodes.values():
        assert all(
            re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", u) for u, _ in found
        )
        assert all(re.fullmatch(r"\d{13}", serial) for _, serial in found)
    every = [pair for found in nodes.values() for pair in found]
    assert len({u for u, _ in every}) == len({s for _, s in every}) == 24
    assert identities("gpu-node-01") == nodes["gpu-node-01"]  # a restart sees the same GPUs


def test_the_readme_names_every_fault_kind() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    kinds = readme[readme.index("Kinds today:") :].split("\n\n", 1)[0]
    assert [k for k in FAULT_KINDS if f"`{k}`" not in kinds] == []


def test_the_simulated_host_reports_the_simulators_cpu(tmp_path: Path) -> None:
    """bench/daemon_cost.py tells the daemon's CPU from its stand-in hardware's by this file:
    the library's entry points' CPU seconds (it times them when asked) and the host's."""
    from gpuwatch.sim.host import SimHost

    clock = ManualClock()
    library = SimulatedNvml(load_scenario("healthy"), clock, account_cpu=True)
    library.install()
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for _ in range(200):
            pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
        spent = library.cpu_used()
        assert spent > 0.0
        host = SimHost(library.node, tmp_path / "host", library_cpu=library.cpu_used)
        reported_library, reported_host = map(float, (tmp_path / "host/cpu").read_text().split())
        assert reported_library == pytest.approx(spent, abs=1e-6)
        assert reported_host > 0.0  # this thread's, which built and wrote the tree
        host.stop()
    finally:
        SimulatedNvml.uninstall()
    unaccounted = SimulatedNvml(load_scenario("healthy"), clock)
    assert unaccounted.cpu_used() == 0.0


def test_a_flap_goes_down_once_a_period_begun_and_recovers_nothing(
    tmp_path: Path, simulate: Simulate
) -> None:
    """A flap of exactly two periods took the link down twice (it counted three once over).
    The InfiniBand specification's PortCounters count a link taken down (LinkDowned) apart
    from a recovery that kept it up (LinkErrorRecovery), which no fault plays."""
    from gpuwatch.sim.host import FLAP_PERIOD_S, SimHost
    from gpuwatch.sim.scenario import from_doc
    from gpuwatch.text.yamlfile import parse

    doc = (
        "name: flap\nnode: {gpus: 1, model: H100, workload: training, seed: 1, ib_ports: 2}\n"
        f"faults:\n  - {{kind: ib_port_flap, port: 1, at: 10s, duration: {2 * FLAP_PERIOD_S}s}}\n"
    )
    clock = ManualClock()
    library = simulate(from_doc(parse(doc, "flap.yaml"), "flap"), clock)
    host = SimHost(library.node, tmp_path / "host")
    second = sorted((host.sysfs / "class" / "infiniband").iterdir())[1]
    counters = second / "ports" / "1" / "counters"

    def read(name: str) -> int:
        return int((counters / name).read_text())

    seen = []
    for elapsed in (9.0, 10.0, 10.0 + FLAP_PERIOD_S, 10.0 + 2 * FLAP_PERIOD_S, 200.0):
        clock.advance(library.node.start + elapsed - clock.now())
        host.update()
        seen.append(read("link_downed"))
        assert read("link_error_recovery") == 0
    host.stop()
    assert seen == [0, 1, 2, 2, 2]


def test_a_board_moved_to_another_slot_keeps_its_serial_and_uuid(tmp_path: Path) -> None:
    def read(scenario: str) -> list[tuple[str, str, str]]:
        path = tmp_path / "node.yaml"
        path.write_text(scenario)
        SimulatedNvml(load_scenario(str(path)), ManualClock()).install()
        try:
            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(3)]
            found = [
                (
                    pynvml.nvmlDeviceGetSerial(h),
                    pynvml.nvmlDeviceGetUUID(h),
                    pynvml.nvmlDeviceGetPciInfo(h).busId,
                )
                for h in handles
            ]
            pynvml.nvmlShutdown()
            return found
        finally:
            SimulatedNvml.uninstall()

    before = read("node: {gpus: 3}\n")
    after = read("node: {gpus: 3, boards: [2, 1, 0]}\n")
    # The boards in slots 0 and 2 traded places: identities move, addresses stay.
    assert [(s, u) for s, u, _ in after] == [(s, u) for s, u, _ in reversed(before)]
    assert [a for _, _, a in after] == [a for _, _, a in before]
    bad = tmp_path / "bad.yaml"
    bad.write_text("node:\n  gpus: 3\n  boards: [0, 0, 1]\n")
    with pytest.raises(FileError) as caught:
        load_scenario(str(bad))
    assert f"{bad}:3: node.boards: must list the board in each of the 3 slots" in str(caught.value)
