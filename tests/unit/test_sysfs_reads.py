"""Reading sysfs when it misbehaves: a file holding what sysfs never writes leaves out that
value alone, a port whose reading fails leaves out that port alone, and a read blocked in the
kernel costs sampling one deadline, not one per cycle, and never holds the daemon's exit."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from gpuwatch import metrics as m
from gpuwatch.clock import ManualClock
from gpuwatch.kernel import sysfs
from gpuwatch.kernel.attributes import Read
from gpuwatch.kernel.gpus import GpuDirectory
from gpuwatch.kernel.infiniband import Port
from gpuwatch.kernel.sysfs import SysfsWatcher
from gpuwatch.model import Sample

DEADLINE = 1.0


def port(root: Path, device: str, state: str, rate: str) -> None:
    where = root / "class" / "infiniband" / device / "ports" / "1"
    (where / "counters").mkdir(parents=True)
    (where / "state").write_text(state + "\n")
    (where / "phys_state").write_text("5: LinkUp\n")
    (where / "rate").write_text(rate + "\n")
    (where / "link_layer").write_text("InfiniBand\n")
    (where / "counters" / "symbol_error").write_text("7\n")
    (where / "counters" / "link_downed").write_text("9" * 400 + "\n")  # no 64-bit count


def values(samples: list[Sample], name: str) -> dict[str, float]:
    return {dict(s.labels)["device"]: s.value for s in samples if s.name == name}


def test_what_sysfs_never_writes_is_left_out_and_the_rest_is_read(tmp_path: Path) -> None:
    port(tmp_path, "mlx5_0", "4: ACTIVE", "1.2.3 Gb/sec (4X NDR)")
    port(tmp_path, "mlx5_1", "4" * 400 + ": ACTIVE", "400 Gb/sec (4X NDR)")
    port(tmp_path, "mlx5_2", "1: DOWN", "200 Gb/sec (2X NDR)")
    watcher = SysfsWatcher(str(tmp_path), ManualClock(), GpuDirectory(), DEADLINE)
    samples = watcher.read_now({}, 0, rescan=True)
    assert values(samples, m.IB_PORT_RATE) == {"mlx5_1": 400e9 / 8, "mlx5_2": 200e9 / 8}
    assert values(samples, m.IB_PORT_STATE) == {"mlx5_0": 4.0, "mlx5_2": 1.0}
    assert values(samples, m.IB_PORT_UP) == {"mlx5_0": 1.0, "mlx5_2": 0.0}
    errors = [
        (dict(s.labels)["device"], dict(s.labels)["type"])
        for s in samples
        if s.name == m.IB_PORT_ERRORS
    ]
    assert errors == [(d, "symbol_error") for d in ("mlx5_0", "mlx5_1", "mlx5_2")]


def test_a_port_whose_reading_fails_is_left_out_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for device in ("mlx5_0", "mlx5_1"):
        port(tmp_path, device, "4: ACTIVE", "400 Gb/sec (4X NDR)")
    real = sysfs.port_samples
    broken = {"mlx5_0"}

    def port_samples(found: Port, affinity: str, read: Read) -> list[Sample]:
        if found.device in broken:
            raise RuntimeError("a fault of ours")
        return real(found, affinity, read)

    monkeypatch.setattr(sysfs, "port_samples", port_samples)
    watcher = SysfsWatcher(str(tmp_path), ManualClock(), GpuDirectory(), DEADLINE)
    for cycle in range(3):
        samples = watcher.read_now({}, 0, rescan=cycle == 0)
        assert values(samples, m.IB_PORT_UP) == {"mlx5_1": 1.0}
    said = [r for r in caplog.records if "reading port mlx5_0/1 failed" in r.getMessage()]
    assert len(said) == 1  # once, not every cycle
    broken.clear()
    assert values(watcher.read_now({}, 0, rescan=False), m.IB_PORT_UP) == {
        "mlx5_0": 1.0,
        "mlx5_1": 1.0,
    }


async def test_a_blocked_read_costs_one_deadline_and_never_holds_the_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    watcher = SysfsWatcher(str(tmp_path), clock, GpuDirectory(), DEADLINE)
    started, released = threading.Event(), threading.Event()
    reads: list[threading.Thread] = []

    def read_now(*args: object) -> list[Sample]:
        reads.append(threading.current_thread())
        started.set()
        if len(reads) == 1:
            released.wait(30)  # in the kernel, on a device in trouble
        return [Sample(m.PCI_GPUS, (), 8.0)]

    monkeypatch.setattr(watcher, "read_now", read_now)

    def late(samples: list[Sample]) -> float:
        return next(s.value for s in samples if s.name == m.SYSFS_READS_LATE)

    first = asyncio.ensure_future(watcher.read())
    assert await asyncio.to_thread(started.wait, 5)
    clock.advance(DEADLINE)
    assert late(await first) == 1.0
    # The next cycles do not wait on it again: no time passes on the clock, and they answer.
    for cycle in (2, 3):
        assert late(await asyncio.wait_for(watcher.read(), 5)) == cycle
    assert len(reads) == 1 and reads[0].daemon  # the daemon exits without waiting for it
    released.set()
    await asyncio.to_thread(reads[0].join, 5)
    fresh = await asyncio.wait_for(watcher.read(), 5)  # a new read, answered at once
    assert len(reads) == 2
    assert [s.value for s in fresh if s.name == m.PCI_GPUS] == [8.0] and late(fresh) == 3.0


def gpu_under_a_port(tmp_path: Path, port_fatal: int) -> Path:
    """A GPU (0000:18:00.0) under a switch's downstream port (0000:17:00.0), laid out as the
    kernel lays them out, with its own AER counts at 0 and the port's fatal count given."""
    port_dir = tmp_path / "devices" / "pci0000:16" / "0000:16:01.0" / "0000:17:00.0"
    gpu_dir = port_dir / "0000:18:00.0"
    gpu_dir.mkdir(parents=True)
    (gpu_dir / "vendor").write_text("0x10de\n")
    (gpu_dir / "class").write_text("0x030200\n")
    for where, fatal in ((gpu_dir, 0), (port_dir, port_fatal)):
        (where / "aer_dev_correctable").write_text("RxErr 0\nBadTLP 0\nTOTAL_ERR_COR 0\n")
        (where / "aer_dev_nonfatal").write_text("Undefined 0\nTOTAL_ERR_NONFATAL 0\n")
        (where / "aer_dev_fatal").write_text(
            f"Undefined 0\nSDES {fatal}\nTOTAL_ERR_FATAL {fatal}\n"
        )
    devices = tmp_path / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    (devices / "0000:18:00.0").symlink_to(
        "../../../devices/pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:00.0"
    )
    return gpu_dir


async def test_the_ports_above_the_gpus_are_known_before_the_kernel_log_is_read(
    tmp_path: Path,
) -> None:
    """The daemon starts this watcher before the kernel log, which reads this boot's lines
    from the start: an AER line a port printed before gpuwatch started is the GPU's too."""
    gpu_under_a_port(tmp_path, 0)
    gpus = GpuDirectory()
    await SysfsWatcher(str(tmp_path), ManualClock(), gpus, DEADLINE).start()
    assert gpus.nvidia_device("0000:17:00.0") == "0000:18:00.0"


def test_aer_errors_counted_at_the_port_above_a_gpu_are_on_that_gpus_account(
    tmp_path: Path,
) -> None:
    """The kernel's AER counters count what each device saw: errors on a GPU's link are often
    seen at its link partner only (Documentation/ABI/testing/sysfs-bus-pci-devices-aer), the
    GPU's own counters staying at 0. The port's count names the GPU it serves."""
    gpu_dir = gpu_under_a_port(tmp_path, 2)
    gpus = GpuDirectory()
    watcher = SysfsWatcher(str(tmp_path), ManualClock(), gpus, DEADLINE)
    samples = watcher.read_now({}, None, rescan=True)
    fatal = {
        s.labels: s.value
        for s in samples
        if s.name == m.PCIE_AER_ERRORS and ("severity", "fatal") in s.labels
    }
    assert fatal == {
        (("pci_bus_id", "0000:18:00.0"), ("severity", "fatal")): 0.0,
        (("pci_bus_id", "0000:17:00.0"), ("serves", "0000:18:00.0"), ("severity", "fatal")): 2.0,
    }
    # The GPU falls off the bus after a fatal error on its link: its config space answers
    # all ones; the port still answers, and its count stays on the GPU's account.
    (gpu_dir / "config").write_bytes(b"\xff" * 64)
    samples = watcher.read_now({}, None, rescan=False)
    fatal = {
        s.labels: s.value
        for s in samples
        if s.name == m.PCIE_AER_ERRORS and ("severity", "fatal") in s.labels
    }
    assert fatal == {
        (("pci_bus_id", "0000:17:00.0"), ("serves", "0000:18:00.0"), ("severity", "fatal")): 2.0,
    }
    # The kernel's AER lines about that port are about the GPU too.
    assert gpus.nvidia_device("0000:17:00.0") == "0000:18:00.0"
    assert gpus.nvidia_device("0000:16:01.0") is None
