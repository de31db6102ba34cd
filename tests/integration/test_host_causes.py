"""InfiniBand ports and the PCI bus as a sysfs tree shows them: a port that goes down, one that
flaps and one whose symbol errors climb raise their alerts and the node's causes, and clear
once the ports are stable again; a GPU on the bus that the driver does not list is a cause of
its own; a GPU given to a VM is not one; Fabric Manager down and a GPU out of the NVLink
fabric are causes too."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pynvml
import pytest

from gpuwatch import metrics as m
from gpuwatch.clock import ManualClock
from gpuwatch.kernel import fabric_manager
from gpuwatch.kernel.gpus import GpuDirectory
from gpuwatch.kernel.sysfs import SysfsWatcher
from gpuwatch.model import MissingGpu
from gpuwatch.promql.evaluator import Evaluator
from gpuwatch.promql.parse import parse as parse_promql
from gpuwatch.serve.wiring import Wired, wire
from gpuwatch.sim.host import SimHost
from gpuwatch.sim.library import SimulatedNvml
from gpuwatch.sim.scenario import from_doc
from gpuwatch.text.yamlfile import parse
from tests.conftest import Simulate, node_config

PORTS = """\
name: ports
node: {gpus: 4, model: H100, workload: training, seed: 1, ib_ports: 4}
faults:
  - {kind: ib_port_down, port: 0, at: 10s, duration: 60s}
  - {kind: ib_port_flap, port: 1, at: 10s, duration: 100s}
  - {kind: ib_symbol_errors, port: 2, at: 10s, duration: 60s, rate: 1}
"""


def firing(wired: Wired) -> set[tuple[str, str]]:
    return {
        (a.name, dict(a.labels).get("device", dict(a.labels).get("pci_bus_id", "")))
        for r in wired.rules.alerting_rules()
        for a in r.active.values()
        if a.state.value == "firing"
    }


def node_causes(wired: Wired) -> set[str]:
    verdict = wired.daemon.view.node_verdict
    assert verdict is not None
    return {c.key for c in verdict.causes}


@contextlib.asynccontextmanager
async def play(
    tmp_path: Path, simulate: Simulate, scenario: str
) -> AsyncIterator[tuple[Wired, SimHost, ManualClock]]:
    """The node wired as `gpuwatch run --simulate` wires it, reading the simulated host's
    sysfs, started at the scenario's beginning, and stopped after."""
    clock = ManualClock()
    library: SimulatedNvml = simulate(from_doc(parse(scenario, "test.yaml"), "test"), clock)
    host = SimHost(library.node, tmp_path / "host")
    fm = f"'{host.fabric_manager.address}'" if host.fabric_manager else "false"
    config, state = node_config(
        tmp_path,
        f"sources: {{kmsg: {{enabled: false}}, "
        f"host: {{sysfs_root: {host.sysfs}, fabric_manager: {fm}}}}}\n",
    )
    wired = wire(config, pynvml, clock, state, 10040)
    await wired.daemon.start(ticks=False)
    try:
        yield wired, host, clock
    finally:
        await wired.daemon.stop()
        await wired.close()
        host.stop()


async def run_until(
    wired: Wired, host: SimHost, clock: ManualClock, until: float, step: float = 1.0
) -> None:
    """Sample every `step` seconds until `until` seconds into the scenario."""
    start = host.node.start
    while clock.now() - start < until:
        clock.advance(step)
        host.update()
        await wired.daemon.sample_once()


async def test_ports_down_flapping_and_erring_raise_causes_that_clear(
    tmp_path: Path, simulate: Simulate
) -> None:
    async with play(tmp_path, simulate, PORTS) as (wired, host, clock):
        await run_until(wired, host, clock, 60)
        assert firing(wired) >= {
            ("IbPortDown", "mlx5_0"),
            ("IbPortFlapping", "mlx5_1"),
            ("IbPortSymbolErrors", "mlx5_2"),
        }
        assert {
            "ib-port-down:mlx5_0/1",
            "ib-port-flapping:mlx5_1/1",
            "ib-symbol-errors:mlx5_2/1",
        } <= node_causes(wired)
        assert not {a for a in firing(wired) if a[1] == "mlx5_3"}  # the healthy port
        verdict = wired.daemon.view.node_verdict
        assert verdict is not None and verdict.state.value == "unhealthy"
        [down] = [c for c in verdict.causes if c.key == "ib-port-down:mlx5_0/1"]
        assert down.reason == "InfiniBand port mlx5_0/1 is down"
        assert down.action.startswith("drain the node. Check the cable")

        await run_until(wired, host, clock, 80)  # mlx5_0 came back at 70 s
        assert ("IbPortDown", "mlx5_0") not in firing(wired)
        assert "ib-port-down:mlx5_0/1" not in node_causes(wired)

        # The flaps end at 110 s, the symbol errors at 70 s: stable for their windows after
        # (sampled less often: nothing changes any more).
        await run_until(wired, host, clock, 120)
        assert ("IbPortFlapping", "mlx5_1") in firing(wired)
        await run_until(wired, host, clock, 110 + 300 + 10, step=10.0)
        assert ("IbPortFlapping", "mlx5_1") not in firing(wired)
        await run_until(wired, host, clock, 70 + 600 + 10, step=10.0)
        assert not {a for a in firing(wired) if a[0].startswith("Ib")}
        # The verdict judges this cycle's evaluation: its causes go with the alerts.
        assert not {c for c in node_causes(wired) if c.startswith("ib-")}
        verdict = wired.daemon.view.node_verdict
        assert verdict is not None and verdict.state.value == "healthy", verdict.reasons


RECEIVE = """\
name: receive
node: {gpus: 2, model: H100, workload: training, seed: 1, ib_ports: 3}
faults:
  - {kind: ib_rcv_errors, port: 0, at: 10s, duration: 60s, rate: 1}
  - {kind: ib_link_integrity_errors, port: 1, at: 10s, rate: 0.5}
"""


async def test_receive_and_link_integrity_errors_are_counted_and_raise_a_warning(
    tmp_path: Path, simulate: Simulate
) -> None:
    """PortRcvErrors and LocalLinkIntegrityErrors count apart from symbol errors and link
    downs; the second is a 4-bit counter in the InfiniBand specification, stopping at 15."""
    async with play(tmp_path, simulate, RECEIVE) as (wired, host, clock):
        await run_until(wired, host, clock, 60)
        assert firing(wired) == {
            ("IbPortReceiveErrors", "mlx5_0"),
            ("IbPortReceiveErrors", "mlx5_1"),
        }

        def counter(device: str, name: str) -> int:
            path = host.sysfs / "class" / "infiniband" / device / "ports" / "1" / "counters"
            return int((path / name).read_text())

        assert counter("mlx5_0", "port_rcv_errors") == 51  # 1 at once, then 1 a second
        assert counter("mlx5_1", "local_link_integrity_errors") == 15
        assert counter("mlx5_0", "link_downed") == counter("mlx5_2", "port_rcv_errors") == 0
        assert "ib-" not in " ".join(node_causes(wired))  # warnings: no cause of the node's


UNLISTED = """\
name: unlisted
node: {gpus: 4, model: H100, workload: training, seed: 1}
faults:
  - {kind: gpu_missing, gpu: 2, at: 0s}
"""


BIG = """\
name: big
node: {gpus: 16, model: H100, workload: inference, seed: 1, ib_ports: 16}
faults: []
"""


async def test_a_node_of_two_boards_has_every_gpu_and_nic_on_the_bus(
    tmp_path: Path, simulate: Simulate
) -> None:
    """Past 8 GPUs (the benchmarks' nodes) the simulated GPUs sit on more boards, each in a PCI
    domain of its own: each is on the bus where NVML says, each NIC beside its GPU."""
    async with play(tmp_path, simulate, BIG) as (wired, host, clock):
        await run_until(wired, host, clock, 5)
        store, now = wired.daemon.store, clock.now()
        up = Evaluator(store).eval(parse_promql("gpuwatch_pci_device_up"), now)
        on_bus = {dict(s.metric)["pci_bus_id"]: s.value for s in up}
        assert len(on_bus) == 16 and set(on_bus.values()) == {1.0}
        assert "0011:18:00.0" in on_bus  # GPU 8, the second board's first
        ports = Evaluator(store).eval(parse_promql("gpuwatch_ib_port_info"), now)
        assert {dict(s.metric)["device"]: dict(s.metric)["gpus"] for s in ports} == {
            f"mlx5_{i}": str(i) for i in range(16)
        }
        assert node_causes(wired) == set()


async def test_a_gpu_on_the_bus_the_driver_does_not_list_is_a_cause(
    tmp_path: Path, simulate: Simulate
) -> None:
    async with play(tmp_path, simulate, UNLISTED) as (wired, host, clock):
        await run_until(wired, host, clock, 40)
        assert ("GpuNotListedByDriver", "0000:3a:00.0") in firing(wired)
        assert "gpu-unlisted:0000:3a:00.0" in node_causes(wired)
        assert len(wired.daemon.view.batch.gpus if wired.daemon.view.batch else []) == 3


async def test_a_gpu_given_to_a_vm_is_not_counted_as_unlisted(
    tmp_path: Path, simulate: Simulate
) -> None:
    async with play(tmp_path, simulate, UNLISTED) as (wired, host, clock):
        gpu = next(
            p
            for p in (host.sysfs / "bus" / "pci" / "devices").iterdir()
            if p.name == "0000:3a:00.0"
        )
        vfio = host.sysfs / "bus" / "pci" / "drivers" / "vfio-pci"
        vfio.mkdir(parents=True)
        (gpu / "driver").unlink()
        (gpu / "driver").symlink_to(vfio)
        await run_until(wired, host, clock, 40)
        assert not {a for a in firing(wired) if a[0] == "GpuNotListedByDriver"}
        assert not {c for c in node_causes(wired) if c.startswith("gpu-unlisted")}


FABRIC = """\
name: fabric
node: {gpus: 4, model: H100, workload: training, seed: 1, nvswitches: 4, driver: R615}
faults:
  - {kind: fabric_manager_down, at: 10s, duration: 60s}
  - {kind: fabric_unregistered, gpu: 2, at: 10s}
"""


async def test_fabric_manager_down_and_an_unregistered_gpu_are_causes_that_clear(
    tmp_path: Path, simulate: Simulate
) -> None:
    async with play(tmp_path, simulate, FABRIC) as (wired, host, clock):
        await run_until(wired, host, clock, 5)
        query = parse_promql("gpuwatch_fabric_manager_up")
        [up] = Evaluator(wired.daemon.store).eval(query, clock.now())
        assert up.value == 1.0
        # Asked at each scan (every 30 s): down at the one at 31 s, firing 30 s later, as the
        # host pack's 15 s trend group sees it.
        await run_until(wired, host, clock, 80)
        assert firing(wired) == {("FabricManagerDown", "")}
        assert "fabric-manager-down" in node_causes(wired)
        # Its port is back at 70 s, seen at the scan at 91 s.
        await run_until(wired, host, clock, 110)
        assert ("FabricManagerDown", "") not in firing(wired)
        assert "fabric-manager-down" not in node_causes(wired)
        # GPU 2 out of the fabric since 10 s: after 5 minutes, a cause of its own.
        await run_until(wired, host, clock, 300, step=10.0)
        assert not {a for a in firing(wired) if a[0] == "GpuFabricNotRegistered"}
        await run_until(wired, host, clock, 330, step=10.0)
        verdict = wired.daemon.view.gpu_verdicts
        causes = {g: {c.key for c in v.causes} for g, v in verdict.items()}
        assert "fabric-not-registered" in causes[2], causes
        assert not any("fabric-not-registered" in causes[g] for g in (0, 1, 3))


def test_a_gpu_that_answers_all_ones_is_lost_though_its_vendor_file_says_nvidia(
    tmp_path: Path, simulate: Simulate
) -> None:
    """Fallen off the bus before gpuwatch started: config space answers all ones, as a device
    that no longer answers does (include/linux/pci.h, PCI_ERROR_RESPONSE), while sysfs's
    `vendor` and `class` still show what the kernel read at enumeration
    (drivers/pci/pci-sysfs.c). The driver cannot open it."""
    library = simulate(from_doc(parse(UNLISTED, "test.yaml"), "test"), ManualClock())
    host = SimHost(library.node, tmp_path / "host")
    devices = host.sysfs / "bus" / "pci" / "devices"
    lost = "0000:3a:00.0"
    (devices / lost / "config").write_bytes(b"\xff" * 64)
    assert (devices / lost / "vendor").read_text().strip() == "0x10de"
    gpus = GpuDirectory()
    gpus.update([], (MissingGpu("GPU-2", 2, "H100", "s", "00000000:3A:00.0"),), up=True)
    for known in (gpus, GpuDirectory()):  # whether the node had it or not: it is on the bus
        watcher = SysfsWatcher(str(host.sysfs), ManualClock(), known, 1.0)
        samples = watcher.read_now(known.listed, 3, rescan=True, known=known.known)
        up = {dict(s.labels)["pci_bus_id"]: s.value for s in samples if s.name == m.PCI_DEVICE_UP}
        assert up[lost] == 0.0
        assert sorted(up.values()) == [0.0, 1.0, 1.0, 1.0]  # its neighbours answer


def test_fabric_manager_is_asked_on_its_tcp_port_or_its_unix_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "fm.sock")
    with socket.socket(socket.AF_UNIX) as unix, socket.socket() as tcp:
        unix.bind(path)
        unix.listen(1)
        tcp.bind(("127.0.0.1", 0))
        port = tcp.getsockname()[1]
        assert fabric_manager.answers(path)
        assert not fabric_manager.answers(f"127.0.0.1:{port}")  # bound, not listening
        tcp.listen(1)
        assert fabric_manager.answers(f"127.0.0.1:{port}")
    assert not fabric_manager.answers(path)
    # "²" is a digit to str.isdigit(), not to int().
    for wrong in ("6666", "localhost:", "host:99999", "fm.sock", "host:\u00b2"):
        with pytest.raises(ValueError, match="HOST:PORT or a Unix socket path"):
            fabric_manager.parse_address(wrong)


def test_kept_files_read_what_a_fresh_open_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attributes read through descriptors kept open: a file rewritten in place is read as it
    is now; one whose read fails (a device removed under it answers ENODEV) is opened again,
    and one that is gone reads as nothing; past the limit, files are read and closed."""
    import errno

    from gpuwatch.kernel import attributes
    from gpuwatch.kernel.attributes import KeptFiles

    state = tmp_path / "state"
    state.write_text("4: ACTIVE\n")
    files = KeptFiles(limit=1)
    assert files.read(str(state)) == "4: ACTIVE"
    state.write_text("1: DOWN\n")  # in place, as the kernel's text changes under one inode
    assert files.read(str(state)) == "1: DOWN"
    assert len(files) == 1

    real_pread = attributes.os.pread
    failed: list[int] = []

    def pread_failing_once(fd: int, n: int, offset: int) -> bytes:
        if not failed:
            failed.append(fd)
            raise OSError(errno.ENODEV, "No such device")
        return real_pread(fd, n, offset)

    monkeypatch.setattr(attributes.os, "pread", pread_failing_once)
    state.write_text("4: ACTIVE\n")
    assert files.read(str(state)) == "4: ACTIVE"  # opened again after the failed read
    assert failed and len(files) == 1
    monkeypatch.undo()

    rate = tmp_path / "rate"
    rate.write_text("400 Gb/sec (4X NDR)\n")
    assert files.read(str(rate)) == "400 Gb/sec (4X NDR)"  # past the limit: not kept
    assert len(files) == 1
    assert files.read(str(tmp_path / "absent")) is None
    files.close()
    assert len(files) == 0
    assert files.read(str(state)) == "4: ACTIVE"
