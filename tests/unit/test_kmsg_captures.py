"""Kernel log lines the NVIDIA drivers printed on real machines (tests/fixtures/kmsg, each file
naming the public thread it was copied from), read as gpuwatch reads a saved log: each becomes
the event a fleet operator expects, for the right GPU and XID, and a driver line gpuwatch
does not know is kept as an event, not dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.clock import ManualClock
from gpuwatch.kernel.gpus import GpuDirectory
from gpuwatch.kernel.kmsg import KmsgReader
from gpuwatch.kernel.nvrm import read_driver_line
from gpuwatch.kernel.records import parse_record
from gpuwatch.kernel.watcher import Batch, KernelLog
from gpuwatch.model import Event, GpuInfo, GpuState, GpuStatus

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kmsg"

# file -> the events, each (kind, PCI address, XID or SXid, the GPU's UUID where the log or
# the listed GPUs tell it); `gpu 2` sits at 0000:07:00.0 where a file needs a listed GPU.
EXPECTED: dict[str, list[tuple[str, str, int | None, str | None]]] = {
    "relion-436.log": [("xid", "0000:41:00.0", 13, None)] * 4,
    "vllm-5901.log": [("xid", "0000:43:00.0", 13, None)] * 2,
    "gpud-pr46.log": [
        ("kernel_log", "", None, None),  # nvidia-peermem: an NVIDIA line gpuwatch keeps as is
        *[("xid", "0000:cb:00.0", 13, None)] * 3,
        ("xid", "0000:cb:00.0", 109, None),
    ],
    "akash-244.log": [
        ("xid", "0000:00:05.0", 43, "GPU-efbdfde9-5798-a6e7-4c46-12518fa15375"),
        ("xid", "0000:00:05.0", 43, "GPU-efbdfde9-5798-a6e7-4c46-12518fa15375"),
        ("xid", "0000:00:07.0", 31, "GPU-3b6ec030-5adc-1847-e155-79f635584b4e"),
        ("xid", "0000:00:08.0", 94, "GPU-c24840ec-8de1-83d5-b126-08000173ae32"),
    ],
    "gpu-operator-1146.log": [
        ("gpu_init_failed", "0000:0a:00.0", None, None),
        ("kernel_log", "0000:0a:00.0", None, None),
        ("xid", "0000:07:00.0", 48, "GPU-2"),
        ("xid", "0000:07:00.0", 64, "GPU-2"),
    ],
    "pop-3363.log": [
        ("xid", "0000:01:00.0", 79, "GPU-f8600eb8-f1df-acfb-fad9-d24be732714f"),
        ("gpu_lost", "0000:01:00.0", None, "GPU-f8600eb8-f1df-acfb-fad9-d24be732714f"),
    ],
    "bumblebee-554.log": [
        ("gpu_lost", "0000:01:00.0", None, None),
        ("kernel_log", "", None, None),
    ],
    "nvsentinel-155.log": [
        ("gpu_lost", "0000:b3:00.0", None, None),  # three lines, one message, no XID
        ("kernel_log", "", None, None),  # the probe failed; then the load line, no news
    ],
    "nvtrust-77.log": [
        ("kernel_log", "", None, None),
        ("kernel_log", "", None, None),
        ("gpu_init_failed", "0000:01:00.0", None, None),
        ("kernel_log", "0000:01:00.0", None, None),
    ],
    "nvtrust-124.log": [
        ("kernel_log", "0000:04:00.0", 22013, None),  # the SXid's data
        ("sxid", "0000:04:00.0", 22013, None),
        ("kernel_log", "0000:04:00.0", 22013, None),  # its severity
        ("kernel_log", "0000:04:00.0", 22013, None),
        ("sxid", "0000:04:00.0", 22013, None),
        ("kernel_log", "0000:04:00.0", 22013, None),
    ],
    "gpud-pr1271.log": [("nvlink", "", None, None)],
    "open-gpu-kernel-modules-1150.log": [
        ("xid", "0000:dc:00.0", 45, None),
        ("xid", "0000:ed:00.0", 45, None),
        ("xid", "0000:ba:00.0", 45, None),
        ("xid", "0000:97:00.0", 45, None),
    ],
    "gpud-pr1174.log": [
        ("xid", "0019:01:00.0", 149, None),
        ("xid", "0018:01:00.0", 145, None),
    ],
    "gpud-pr338.log": [("kernel_log", "0000:84:00.0", 12028, None)],
    # The kernel's AER lines about the GPU and the root port above it, each on the GPU; the
    # GPU's audio function's are not an NVIDIA device's.
    "pop-3363-aer.log": [("pcie_aer", "0000:07:00.0", None, "GPU-2")] * 18,
    "gpu-burn-1.log": [
        *[("pcie_aer", "0000:02:00.0", None, None)] * 8,
        # `broadcast error_detected message` and `device has no AER-aware driver` are
        # recovery's words, not AER's lines
        ("xid", "0000:02:00.0", 79, "GPU-660d987e-5b28-3bf6-2a2d-1d5ecae7f6df"),
    ],
}
# What sysfs tells of those machines: the port above each GPU (its link partner).
PORTS = {"0000:00:03.1": "0000:07:00.0", "0000:00:02.0": "0000:02:00.0"}


def read_capture(name: str) -> list[Event]:
    gpus = GpuDirectory()
    info = GpuInfo(2, "GPU-2", "H100", "00000000:07:00.0", "s", "v", 18)
    gpus.update([GpuState(info, GpuStatus.OK)], (), up=True)
    gpus.learn_ports(PORTS)
    published: list[Event] = []
    watcher = KernelLog(str(CAPTURES / name), ManualClock(), published.append, gpus)
    reader = KmsgReader(str(CAPTURES / name))
    reader.open()
    watcher.take(Batch(reader.read(), 0, ""))
    return published


def code_of(event: Event) -> int | None:
    for key in ("xid", "sxid"):
        value = event.data.get(key)
        if isinstance(value, int):
            return value
    text = str(event.data.get("driver_text", ""))
    line = read_driver_line(text)
    return line.code if line is not None else None


def test_every_capture_is_tested() -> None:
    assert sorted(p.name for p in CAPTURES.glob("*.log")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_capture_becomes_the_events_an_operator_expects(name: str) -> None:
    events = read_capture(name)
    got = [(e.kind, str(e.data.get("pci_bus_id", "")), code_of(e), e.uuid) for e in events]
    assert got == EXPECTED[name]
    for event in events:
        assert event.data["source"] == "kernel_log"
        assert str(event.data["driver_text"]).startswith(("NVRM", "nvidia", "pcieport"))


def test_an_aer_line_says_its_severity_and_which_device_printed_it() -> None:
    events = read_capture("gpu-burn-1.log")
    fatal = events[4]
    assert fatal.message == (
        "PCIe AER on the device at 0000:02:00.0 (reported by 0000:00:02.0): "
        "AER: Uncorrected (Fatal) error received: id=0010"
    )
    assert fatal.data["severity"] == "fatal" and fatal.data["reporter"] == "0000:00:02.0"
    assert events[0].data["severity"] == "correctable"
    assert "severity" not in events[3].data  # `[12] Replay Timer Timeout`: a detail
    ours = read_capture("pop-3363-aer.log")
    assert ours[15].message.startswith("PCIe AER on GPU 2: PCIe Bus Error: severity=Correctable")
    assert ours[15].data["reporter"] == "0000:07:00.0"


def test_what_the_driver_says_of_an_xid_is_kept() -> None:
    [_, _, _, _, ctx_timeout] = read_capture("gpud-pr46.log")
    assert ctx_timeout.data["pid"] == 1797828
    assert ctx_timeout.data["process"] == "pt_main_thread"
    assert ctx_timeout.message == (
        "XID 109 on GPU at 0000:cb:00.0: Context-switch timeout (Ch 00000008, errorString CTX "
        "SWITCH TIMEOUT, Info 0x58005)"
    )
    dbe = read_capture("gpu-operator-1146.log")[2]
    assert (dbe.gpu, dbe.data["class"]) == (2, "critical")
    assert dbe.message.startswith("XID 48 on GPU 2: ")
    sxid = read_capture("nvtrust-124.log")[1]
    assert (sxid.data["severity"], sxid.data["link"]) == ("non_fatal", 44)


def test_a_message_over_several_lines_is_one_in_kmsg_too() -> None:
    """/dev/kmsg escapes the newlines of a message printed over several lines."""
    record = parse_record(
        b"3,812,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) "
        b"installed in this system has\\x0aNVRM: fallen off the bus and is not responding to "
        b"commands."
    )
    assert record is not None
    line = read_driver_line(record.message)
    assert line is not None and (line.kind, line.pci_bus_id) == ("fallen_off_bus", "0000:b3:00.0")
