"""The kernel log: records as /dev/kmsg and saved logs hold them, the driver's lines turned into
events for the right GPU, one XID counted once whichever sources saw it, and no record taken
twice across a restart."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from gpuwatch.clock import ManualClock
from gpuwatch.kernel import kmsg
from gpuwatch.kernel.gpus import GpuDirectory
from gpuwatch.kernel.kmsg import KmsgReader
from gpuwatch.kernel.line_events import OTHER_PER_MINUTE
from gpuwatch.kernel.merge import MAX_KEYS, WINDOW_S, EventMerger
from gpuwatch.kernel.nvrm import read_driver_line
from gpuwatch.kernel.records import parse_record
from gpuwatch.kernel.watcher import RECORDS_A_TURN, Batch, KernelLog
from gpuwatch.model import Event, GpuInfo, GpuState, GpuStatus
from gpuwatch.text.pci import pci_address

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."


def gpu_at(index: int, bus: str) -> GpuState:
    info = GpuInfo(index, f"GPU-{index}", "H100", f"00000000:{bus}:00.0", "s", "v", 18)
    return GpuState(info, GpuStatus.OK)


def directory(*gpus: GpuState) -> GpuDirectory:
    found = GpuDirectory()
    found.update(list(gpus), (), up=True)
    return found


def test_a_kmsg_record_with_its_continuation_lines() -> None:
    record = parse_record(
        b"4,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."
        b"\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n"
    )
    assert record is not None
    assert (record.seq, record.uptime_us, record.priority) == (1234, 5678901, 4)
    assert record.message == XID_79
    assert record.context == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:3b:00.0"}


def test_escaped_bytes_are_text_again_and_a_saved_dmesg_line_is_a_record() -> None:
    escaped = parse_record(b"6,7,8,-;NVRM: name=caf\\xc3\\xa9, tab\\x09here")
    assert escaped is not None and escaped.message == "NVRM: name=café, tab\there"
    saved = parse_record(b"[ 1234.5678] " + XID_79.encode(), line_number=12)
    assert saved is not None
    assert (saved.seq, saved.uptime_us, saved.message) == (12, 1234567800, XID_79)
    assert parse_record(b"   \n") is None


def test_a_growing_file_is_read_in_whole_records_and_again_after_truncation(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes(b"4,1,10,-;first\n4,2,20,-;sec")
    reader = KmsgReader(str(path))
    reader.open()
    assert [r.message for r in reader.read()] == ["first"]
    with open(path, "ab") as f:
        f.write(b"ond\n SUBSYSTEM=pci\n4,3,30,-;third\n")
    got = reader.read()
    # In a file, records are numbered by the line they start on, not by the kernel.
    assert [(r.seq, r.message) for r in got] == [(2, "second"), (4, "third")]
    assert got[0].context == {"SUBSYSTEM": "pci"}
    assert reader.read() == []
    path.write_bytes(b"4,9,90,-;after rotation\n")  # shorter than what was read: truncated
    assert [r.message for r in reader.read()] == ["after rotation"]


def records(lines: list[str]) -> Batch:
    """The lines as consecutive kmsg records, read at once from /dev/kmsg."""
    found = [r for n, text in enumerate(lines) if (r := parse_record(f"4,{n},0,-;{text}".encode()))]
    return Batch(found, 0, "")


def saved(lines: list[str]) -> Batch:
    """The lines as a saved log's (a syslog file's), numbered from 1, read at once."""
    found = [r for n, text in enumerate(lines, 1) if (r := parse_record(text.encode(), n))]
    return Batch(found, 0, "")


def kernel_log(
    tmp_path: Path, gpus: GpuDirectory, restored: list[Event] | None = None
) -> tuple[KernelLog, list[Event], ManualClock]:
    clock = ManualClock()
    published: list[Event] = []
    watcher = KernelLog(str(tmp_path / "kmsg"), clock, published.append, gpus, restored or [])
    return watcher, published, clock


def test_an_xid_line_is_an_xid_event_for_the_gpu_at_its_address(tmp_path: Path) -> None:
    watcher, published, _ = kernel_log(tmp_path, directory(gpu_at(0, "18"), gpu_at(3, "3B")))
    line = "NVRM: Xid (PCI:0000:3b:00): 31, pid=20044, name=python3, Ch 00000008, MMU Fault"
    record = parse_record(f"4,100,5,-;{line}".encode())
    assert record is not None
    watcher.take(Batch([record], 0, ""))
    [event] = published
    assert (event.kind, event.gpu, event.uuid) == ("xid", 3, "GPU-3")
    assert event.data["xid"] == 31
    assert event.data["pid"] == 20044 and event.data["process"] == "python3"
    assert event.data["driver_text"] == line
    assert event.data["kmsg_seq"] == 100
    assert event.message.startswith("XID 31 on GPU 3: ")
    assert "(Ch 00000008, MMU Fault)" in event.message


def test_the_gpu_named_by_the_drivers_own_line_is_found_without_nvml(tmp_path: Path) -> None:
    """NVML hung from the start lists no address; the driver's `GPU at PCI:` line says whose
    address it is."""
    watcher, published, _ = kernel_log(tmp_path, GpuDirectory())
    lines = [
        "NVRM: GPU at PCI:0000:3b:00: GPU-5a5e9e8a-1234-5678-9abc-def012345678",
        XID_79,
        "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
    ]
    watcher.take(records(lines))
    assert [(e.kind, e.uuid) for e in published] == [
        ("xid", "GPU-5a5e9e8a-1234-5678-9abc-def012345678"),
        ("gpu_lost", "GPU-5a5e9e8a-1234-5678-9abc-def012345678"),
    ]
    # The driver's text says no more than the catalogue's meaning: not said twice.
    assert published[0].message == "XID 79 on GPU at 0000:3b:00.0: GPU has fallen off the bus"


def test_other_driver_lines_are_kept_but_a_storm_of_them_is_counted(tmp_path: Path) -> None:
    watcher, published, clock = kernel_log(tmp_path, directory())
    records = [parse_record(f"6,{i},0,-;NVRM: something new {i}".encode()) for i in range(50)]
    records.append(parse_record(b"6,99,0,-;usb 1-1: new high-speed USB device"))
    watcher.take(Batch([r for r in records if r is not None], 0, ""))
    assert len(published) == OTHER_PER_MINUTE
    assert published[0].kind == "kernel_log"
    assert published[0].message == "kernel log: NVRM: something new 0"
    samples = {s.name: s.value for s in watcher.collect() if not s.labels}
    assert samples["gpuwatch_kmsg_lines_suppressed_total"] == 50 - OTHER_PER_MINUTE
    clock.advance(61)
    watcher.take(Batch([r for r in [parse_record(b"6,100,0,-;NVRM: later")] if r], 0, ""))
    assert published[-1].message == "kernel log: NVRM: later"


def test_a_rotated_saved_log_is_read_again_from_its_first_line(tmp_path: Path) -> None:
    """A saved log numbers its records by line: after a rotation the new file's first lines are
    new, though their numbers are not."""
    watcher, published, _ = kernel_log(tmp_path, directory(gpu_at(3, "3b")))
    path = tmp_path / "kmsg"
    path.write_text(f"[ 1.0] {XID_79}\n[ 2.0] {XID_79}\n")
    watcher._reader.open()
    watcher.take(watcher._read())
    path.write_text(f"[ 3.0] {XID_79}\n")  # rotated: shorter, read from its start
    watcher.take(watcher._read())
    assert len([e for e in published if e.kind == "xid"]) == 3


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def test_what_a_rotated_log_is_given_before_its_writer_moves_on_is_read(tmp_path: Path) -> None:
    """logrotate renames the file, creates an empty one in its place, and then tells the
    writer, which writes to the old file until then: those records are read before the new
    file's, and each XID is counted once."""
    watcher, published, _ = kernel_log(tmp_path, directory(gpu_at(3, "3b")))
    path, old = tmp_path / "kmsg", tmp_path / "kmsg.1"
    path.write_text(f"[ 1.0] {XID_79}\n")
    watcher._reader.open()
    watcher.take(watcher._read())
    path.rename(old)
    append(old, f"[ 2.0] {XID_79} (after the rename)\n")
    watcher.take(watcher._read())  # no file of that name yet: the old one is read on
    path.write_text("")  # created empty: the writer is not told yet
    watcher.take(watcher._read())
    append(old, f"[ 3.0] {XID_79} (before the writer moved)\n[ 4.0] half a li")
    watcher.take(watcher._read())
    append(path, f"[ 5.0] {XID_79} (the new file)\n")  # the writer moved
    watcher.take(watcher._read())  # the old file to where it ends, a half-written line aside
    append(old, f"ne\n[ 6.0] {XID_79} (the writer never told)\n")
    watcher.take(watcher._read())  # then the new file from its start; the old one is left
    assert watcher._read().records == []
    texts = [str(e.data["driver_text"]) for e in published if e.kind == "xid"]
    assert [t.partition("bus.")[2] for t in texts] == [
        "",
        " (after the rename)",
        " (before the writer moved)",
        " (the new file)",
    ]


def test_a_rotation_undone_is_read_on_as_if_none_happened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kmsg, "MAX_RECORDS_A_READ", 1)  # the old file is not read out at once
    path, old = tmp_path / "kmsg", tmp_path / "kmsg.1"
    path.write_text("[ 1.0] L1\n")
    reader = KmsgReader(str(path))
    reader.open()
    assert [r.message for r in reader.read()] == ["L1"]
    append(path, "[ 2.0] L2\n[ 3.0] L3\n")
    path.rename(old)
    path.write_text("[ 9.0] never mind\n")
    assert [r.message for r in reader.read()] == ["L2"]
    path.unlink()
    old.rename(path)  # put back
    assert [r.message for r in reader.read()] == ["L3"]
    append(path, "[ 4.0] L4\n")
    assert [r.message for r in reader.read()] == ["L4"]
    path.rename(old)  # rotated for good
    append(old, "[ 5.0] L5\n")
    path.write_text("[ 6.0] L6\n")
    assert [r.message for r in reader.read()] == ["L5"]
    assert [r.message for r in reader.read()] == ["L6"]
    assert reader.restarts == 1


def test_a_restart_takes_only_the_records_after_those_journaled(tmp_path: Path) -> None:
    lines = [f"4,{i},0,-;{XID_79}".encode() for i in (5, 6, 7)]
    records = [r for line in lines if (r := parse_record(line))]
    watcher, published, _ = kernel_log(tmp_path, directory(gpu_at(3, "3b")))
    watcher.take(Batch(records[:2], 0, ""))
    assert len(published) == 2
    again, republished, _ = kernel_log(tmp_path, directory(gpu_at(3, "3b")), published)
    again.take(Batch(records, 0, ""))
    assert [e.data["kmsg_seq"] for e in republished] == [7]


def test_a_saved_log_replaced_while_stopped_is_read_from_its_start(tmp_path: Path) -> None:
    """A file numbers its records from its first line: the numbers journaled for one file say
    nothing of the file that replaced it while gpuwatch was stopped; of the same file, they
    say where to go on."""
    path = tmp_path / "kmsg"
    path.write_text(f"[ 1.0] {XID_79}\n[ 2.0] {XID_79}\n")
    watcher, published, _ = kernel_log(tmp_path, directory(gpu_at(3, "3b")))
    watcher._reader.open()
    watcher.take(watcher._read())
    assert len(published) == 2
    with path.open("a") as log_file:  # the same file grows while gpuwatch is stopped
        log_file.write(f"[ 3.0] {XID_79}\n")
    same, from_same, _ = kernel_log(tmp_path, directory(gpu_at(3, "3b")), published)
    same._reader.open()
    same.take(same._read())
    assert [e.data["kmsg_seq"] for e in from_same] == [3]
    path.unlink()  # rotated: a new file, shorter than the old one
    path.write_text(f"[ 4.0] {XID_79}\n")
    rotated, from_rotated, _ = kernel_log(tmp_path, directory(gpu_at(3, "3b")), published)
    rotated._reader.open()
    rotated.take(rotated._read())
    assert [e.data["kmsg_seq"] for e in from_rotated] == [1]


def test_a_log_truncated_in_place_and_an_upgraded_journal_lose_and_repeat_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kmsg"
    gpus = directory(gpu_at(3, "3b"))
    path.write_text("".join(f"[ {n}.0] {XID_79}\n" for n in range(1, 4)))
    watcher, published, _ = kernel_log(tmp_path, gpus)
    watcher._reader.open()
    watcher.take(watcher._read())
    path.write_text(f"[ 4.0] {XID_79}\n")  # copytruncate: the same inode, from line 1 again
    watcher.take(watcher._read())
    assert [e.data["kmsg_seq"] for e in published] == [1, 2, 3, 1]
    with path.open("a") as log_file:  # two more while gpuwatch is stopped
        log_file.write(f"[ 5.0] {XID_79}\n[ 6.0] {XID_79}\n")
    again, taken, _ = kernel_log(tmp_path, gpus, published)
    again._reader.open()
    again.take(again._read())
    assert [e.data["kmsg_seq"] for e in taken] == [2, 3]
    # A journal written before events named their file: its numbers are this file's.
    unnamed = [
        replace(e, data={k: v for k, v in e.data.items() if k != "kmsg_file"})
        for e in [*published, *taken]
    ]
    upgraded, after_upgrade, _ = kernel_log(tmp_path, gpus, unnamed)
    upgraded._reader.open()
    upgraded.take(upgraded._read())
    assert after_upgrade == []


def test_a_storm_is_taken_a_few_hundred_records_a_turn_of_the_loop(tmp_path: Path) -> None:
    watcher, published, _ = kernel_log(tmp_path, directory(gpu_at(3, "3b")))
    loop = asyncio.new_event_loop()
    watcher._loop = loop
    storm = records([XID_79] * (2 * RECORDS_A_TURN + 200))
    assert watcher._hand_over(storm, threading.Event())
    turns = []
    while len(published) < len(storm.records) and len(turns) < 10:
        loop.call_soon(loop.stop)  # one turn: the callbacks ready now, then stop
        loop.run_forever()
        turns.append(len(published))
    loop.close()
    # The rest of the loop's work (scrapes, sampling) runs between these turns.
    assert max(b - a for a, b in zip([0, *turns], turns, strict=False)) <= RECORDS_A_TURN
    assert len(published) == len(storm.records) and len(turns) >= 3
    assert [e.data["kmsg_seq"] for e in published] == list(range(len(storm.records)))


def test_what_a_stop_leaves_untaken_is_not_taken_after_it(tmp_path: Path) -> None:
    watcher, published, _ = kernel_log(tmp_path, directory(gpu_at(3, "3b")))
    loop = asyncio.new_event_loop()
    watcher._loop = loop
    assert watcher._hand_over(records([XID_79] * 3 * RECORDS_A_TURN), threading.Event())
    loop.call_soon(loop.stop)
    loop.run_forever()  # one turn takes its share
    loop.run_until_complete(watcher.stop())  # the journal closes after this
    taken = len(published)
    for _ in range(5):
        loop.call_soon(loop.stop)
        loop.run_forever()
    loop.close()
    # The rest was not taken, so the journal does not say it was: read again at the next start.
    assert len(published) == taken < 3 * RECORDS_A_TURN


def test_sxids_count_per_switch_code_and_severity_and_survive_a_restart(tmp_path: Path) -> None:
    head = "nvidia-nvswitch1: SXid (PCI:0000:86:00.0): 12028"
    lines = [f"{head}, Non-fatal, Link 37 egress non-posted PRIV error (First)",
             f"{head}, Severity 0 Engine instance 37 Sub-engine instance 00",
             f"{head}, Non-fatal, Link 37 egress non-posted PRIV error"]  # fmt: skip
    watcher, published, _ = kernel_log(tmp_path, directory())
    watcher.take(records(lines))
    sxids = [e for e in published if e.kind == "sxid"]
    assert len(sxids) == 2 and sxids[0].data["link"] == 37
    assert sxids[0].message == (
        "NVSwitch 0000:86:00.0: non-fatal SXid 12028: Link 37 egress non-posted PRIV error (First)"
    )
    again, _, _ = kernel_log(tmp_path, directory(), published)
    [count] = [s for s in again.collect() if s.name == "gpuwatch_nvswitch_sxid_errors_total"]
    assert dict(count.labels) == {
        "pci_bus_id": "0000:86:00.0",
        "sxid": "12028",
        "severity": "non_fatal",
    }
    assert count.value == 2
    # When it was last printed survives too: a restart is not a new SXid for the rules.
    [last] = [
        s for s in again.collect() if s.name == "gpuwatch_nvswitch_sxid_last_timestamp_seconds"
    ]
    assert last.labels == count.labels and last.value == sxids[-1].time


def xid(source: str, code: int = 79, uuid: str = "GPU-3", at: float = 0.0) -> Event:
    data: dict[str, int | float | str] = {"xid": code}
    if source == "kernel_log":
        data |= {"source": "kernel_log", "driver_text": f"NVRM: Xid ...: {code}, text"}
    return Event(at, "xid", 3, uuid, f"XID {code}", data)


def test_one_xid_from_both_sources_is_one_event_in_either_order() -> None:
    clock = ManualClock()
    out: list[Event] = []
    merger = EventMerger(clock, out.append)
    merger.publish(xid("nvml"))
    clock.advance(0.3)
    merger.publish(xid("kernel_log"))  # its twin: kept as text, counts nothing
    merger.publish(xid("kernel_log"))  # a second XID 79: the kernel log saw it first
    merger.publish(xid("nvml"))
    assert [e.kind for e in out] == ["xid", "kernel_log", "xid"]
    assert out[1].message == "kernel log: NVRM: Xid ...: 79, text"
    assert out[2].data.get("source") == "kernel_log"


def test_repeats_pair_one_to_one_and_other_gpus_or_codes_never_pair() -> None:
    clock = ManualClock()
    out: list[Event] = []
    merger = EventMerger(clock, out.append)
    for _ in range(3):
        merger.publish(xid("nvml", 13))
    merger.publish(xid("kernel_log", 13, uuid="GPU-4"))
    merger.publish(xid("kernel_log", 31))
    for _ in range(3):
        merger.publish(xid("kernel_log", 13))
    assert sum(1 for e in out if e.kind == "xid") == 5  # three 13s, GPU-4's 13, the 31
    clock.advance(WINDOW_S + 1)
    merger.publish(xid("nvml", 31))  # the kernel log's 31 is too long ago to be its twin
    assert out[-1].kind == "xid" and "source" not in out[-1].data


def test_reports_awaiting_a_twin_are_kept_for_a_bounded_number_of_faults() -> None:
    clock = ManualClock()
    out: list[Event] = []
    merger = EventMerger(clock, out.append)
    merger.publish(xid("kernel_log", 79))  # a real one, whose NVML twin is late (a hang)
    for code in range(MAX_KEYS + 100):  # then a log of made-up codes, none with a twin
        merger.publish(xid("kernel_log", 100_000 + code))
    assert len(merger._unpaired) == MAX_KEYS and len(out) == MAX_KEYS + 101
    merger.publish(xid("nvml", 100_000 + MAX_KEYS + 99))  # the newest still pairs: once
    merger.publish(xid("nvml", 79))  # and so does the real one, the oldest
    assert merger.merged == 2 and len(out) == MAX_KEYS + 101
    merger.publish(xid("nvml", 100_000))  # the first made-up one was forgotten
    assert merger.merged == 2 and len(out) == MAX_KEYS + 102


def test_addresses_keep_a_vmd_domain_and_daemons_lines_are_not_the_drivers() -> None:
    assert pci_address("00000000:3B:00.0") == pci_address("PCI:0000:3b:00") == "0000:3b:00.0"
    # Intel VMD puts the devices behind it in domains from 10000: not domain 0's.
    assert pci_address("00010000:E1:00.0") == pci_address("10000:e1:00.0") == "10000:e1:00.0"
    assert read_driver_line("nvidia-persistenced[1742]: Started") is None
    assert read_driver_line("systemd[1]: Started nvidia-persistenced.service") is None
    assert read_driver_line("systemd[1]: Starting nvidia-persistenced service") is None
    line = read_driver_line("nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver")
    assert line is not None and line.kind == "other"
    # A saved dmesg line whose message ran over several lines keeps its timestamp.
    record = parse_record(b"[  12.5] NVRM: first\nsecond", 7)
    assert record is not None
    assert (record.uptime_us, record.message) == (12_500_000, "NVRM: first\nsecond")


def test_the_lost_gpus_message_is_one_whichever_way_a_log_splits_its_lines(tmp_path: Path) -> None:
    # The probe's message of tests/fixtures/kmsg/nvsentinel-155.log, as a syslog file holds it:
    # fed from the kernel's syslog interface, each of its lines has a line of its own; from
    # rsyslog's /dev/kmsg input, one line with the newlines written as #012.
    head = "Mar  4 10:12:01 node7 kernel: [ 1843.308145] "
    lines = ["NVRM: The NVIDIA GPU 0000:b3:00.0",
             "NVRM: (PCI ID: 10de:26b5) installed in this system has",
             "NVRM: fallen off the bus and is not responding to commands."]  # fmt: skip
    for split in ([head + line for line in lines], [head + "#012".join(lines)]):
        watcher, published, _ = kernel_log(tmp_path, directory(gpu_at(5, "b3")))
        watcher.take(
            saved([*split, head + "NVRM: The NVIDIA probe routine failed for 1 device(s)."])
        )
        assert [(e.kind, e.gpu) for e in published] == [("gpu_lost", 5), ("kernel_log", None)]
        assert published[0].data["kmsg_seq"] == len(split)  # taken as its last line is
    # An opening that no end follows is kept as it was, once the next line shows it ended.
    watcher, published, _ = kernel_log(tmp_path, directory(gpu_at(5, "b3")))
    watcher.take(saved([head + lines[0], head + XID_79]))
    assert [e.kind for e in published] == ["kernel_log", "xid"]


def test_a_files_records_are_numbered_by_line_however_its_writes_fell(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("[ 1.0] NVRM: The NVIDIA GPU 0000:b3:00.0\n")
    live = KmsgReader(str(path))
    live.open()
    seqs = [r.seq for r in live.read()]
    with path.open("a") as log:  # its continuation lines, written later
        log.write("         NVRM: (PCI ID: 10de:26b5) installed in this system has\n")
        log.write("         NVRM: fallen off the bus and is not responding to commands.\n")
    seqs += [r.seq for r in live.read()]
    with path.open("a") as log:
        log.write(f"[ 2.0] {XID_79}\n")
    seqs += [r.seq for r in live.read()]
    again = KmsgReader(str(path))  # a restart reads the message as one record
    again.open()
    assert [r.seq for r in again.read()] == [1, 4]
    assert seqs == [1, 2, 4]  # so the XID is record 4 either way: taken once
    assert again.identity == live.identity


def test_a_file_written_again_in_place_is_another_log(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text(f"[ 1.0] {XID_79}\n[ 2.0] {XID_79}\n")
    before = KmsgReader(str(path))
    before.open()
    before.read()
    path.write_text("[ 5.0] NVRM: Xid (PCI:0000:3b:00): 48, pid=0, DBE\n")  # same inode
    after = KmsgReader(str(path))
    after.open()
    after.read()
    assert after.identity.split(":")[:2] == before.identity.split(":")[:2]
    assert after.identity != before.identity  # its first line tells it apart


def test_a_file_journaled_by_an_earlier_numbering_is_read_from_its_end(tmp_path: Path) -> None:
    """Journals written before files were numbered by line name a file by its inode alone,
    with the kernel's numbers (or a count of records): where they got to cannot be found in
    the file, so it is read from its end, and no record is taken twice or skipped for good."""
    path = tmp_path / "kmsg"
    path.write_text("".join(f"4,{5000 + n},1,-;{XID_79}\n SUBSYSTEM=pci\n" for n in range(1, 6)))
    reader = KmsgReader(str(path))
    reader.open()
    inode = reader.identity.rsplit(":", 1)[0]
    journaled = xid("kernel_log")
    journaled.data.update(kmsg_file=inode, kmsg_seq=5005)
    watcher, published, _ = kernel_log(tmp_path, directory(gpu_at(3, "3b")), [journaled])
    watcher.take(watcher._open(), backlog=True)
    with path.open("a") as log:
        log.write(f"4,5006,1,-;{XID_79}\n SUBSYSTEM=pci\n")
    watcher.take(watcher._read())
    assert [e.data["kmsg_seq"] for e in published] == [11]  # its line: only the new one
    assert published[0].data["kmsg_file"] == watcher._reader.identity != inode


def test_a_file_mixing_kmsg_records_and_dmesg_lines_loses_none(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text(f"4,99999999,1,-;{XID_79}\n" + f"[ 2.0] {XID_79}\n" * 3)
    watcher, published, _ = kernel_log(tmp_path, directory(gpu_at(3, "3b")))
    watcher._reader.open()
    watcher.take(watcher._read())
    assert [e.data["kmsg_seq"] for e in published] == [1, 2, 3, 4]
    with path.open("a") as log:
        log.write(f"4,100000000,5,-;{XID_79}\n")
    again, taken, _ = kernel_log(tmp_path, directory(gpu_at(3, "3b")), published)
    again._reader.open()
    again.take(again._read())
    assert [e.data["kmsg_seq"] for e in taken] == [5]


@pytest.mark.parametrize(
    ("line", "kernel"),
    [
        # Forms the captures in tests/fixtures/kmsg carry: the kernel's.
        ("Dec  2 11:38:46 worker4 kernel: [  218.250408] NVRM: Xid (PCI:0000:07:00): 48, x", True),
        ("Jul 09 10:42:47 pool0-0082 kernel: NVRM: knvlinkDiscoverPostRxDetLinks_GH100", True),
        ("kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001", True),
        ("kern  :err   : 2025-01-25T10:34:54,859532+00:00 nvidia-nvswitch1: SXid (PCI:0", True),
        ("[   49.261458] NVRM: GPU at 0000:01:00.0 has fallen off the bus.", True),
        ("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1", True),
        ("<4>Nov 28 01:45:00 gw1 kernel: NVRM: Xid (PCI:0000:3a:00): 79, pid=1", True),
        # A program's: `logger` through syslog, in any of the forms a file keeps.
        ("Nov 28 01:45:00 gw1 alice[4242]: NVRM: Xid (PCI:0000:3a:00): 79, pid=4242", False),
        ("Nov 28 01:45:00 gw1 python3: NVRM: Xid (PCI:0000:3a:00): 79, pid=4242", False),
        ("2026-11-28T01:45:00.123+00:00 gw1 alice[4242]: NVRM: Xid (PCI:0000:3a:00): 79", False),
        ("Nov 28 01:45:00.123456 gw1 alice[4242]: NVRM: Xid (PCI:0000:3a:00): 79", False),
        # journalctl -o short-full, short-unix, a space for the T, short-monotonic
        ("Sat 2026-11-28 01:45:00 UTC gw1 alice[4242]: NVRM: Xid (PCI:0000:3a:00): 79", False),
        ("Sat 2026-11-28 01:45:00 UTC gw1 kernel: NVRM: Xid (PCI:0000:3a:00): 79", True),
        ("1732758300.123456 gw1 alice[4242]: NVRM: Xid (PCI:0000:3a:00): 79", False),
        ("2026-11-28 01:45:00 gw1 alice[4242]: NVRM: Xid (PCI:0000:3a:00): 79", False),
        ("[ 1234.567890] gw1 alice[4242]: NVRM: Xid (PCI:0000:3a:00): 79, pid=1", False),
        ("[ 1234.567890] gw1 kernel: NVRM: Xid (PCI:0000:3a:00): 79, pid=1", True),
        # a tag with a space, or without its colon: not `kernel: `, so not the kernel
        ("Nov 28 01:45:00 gw1 my prog[1]: NVRM: Xid (PCI:0000:3a:00): 79", False),
        ("Nov 28 01:45:00 gw1 alice[4242] NVRM: Xid (PCI:0000:3a:00): 79", False),
        # the driver's own words that look like a tag are still the kernel's
        ("[   12.345678] NVRM: nvlink: link 3 is down", True),
        ("alice[4242]: NVRM: Xid (PCI:0000:3a:00): 79, pid=4242", False),
        ("<13>Nov 28 01:45:00 gw1 kernel: NVRM: Xid (PCI:0000:3a:00): 79, pid=1", False),
        ("user  :warn  : 2025-01-25T10:34:54,859532+00:00 NVRM: Xid (PCI:0000:3a:00): 79", False),
        ("12,1795828999999,99000000,-;NVRM: Xid (PCI:0000:5d:00): 48, pid=4242", False),
        ("4,1795828999999,99000000,-;NVRM: Xid (PCI:0000:5d:00): 48, pid=4242", True),
    ],
)
def test_only_what_the_kernel_wrote_counts_as_the_kernels(line: str, kernel: bool) -> None:
    record = parse_record(line.encode())
    assert record is not None and record.kernel is kernel


def test_a_users_driver_line_is_counted_as_noise_and_raises_nothing(tmp_path: Path) -> None:
    watcher, published, _ = kernel_log(tmp_path, directory(gpu_at(3, "3B")))
    lines = [
        b"Nov 28 01:45:00 gw1 alice[4242]: " + XID_79.encode(),
        b"12,7,5,-;" + XID_79.encode(),
    ]
    records = [r for r in (parse_record(line, i + 1) for i, line in enumerate(lines)) if r]
    watcher.take(Batch(records, 0, ""))
    assert published == []
    samples = {s.name: s.value for s in watcher.collect() if not s.labels}
    assert samples["gpuwatch_kmsg_not_kernel_lines_total"] == 2


# As the open driver prints an XID it attributes to a MIG instance: the GPU instance alone
# (the example in NVIDIA/open-gpu-kernel-modules src/common/sdk/nvidia/inc/nverror.h, and in
# NVIDIA's A100 memory error management document), or with its compute instance (the format
# of krcReportXid in src/nvidia/src/kernel/gpu/rc/kernel_rc.c).
MIG_XIDS = [
    "NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). "
    "RST: No, D-RST: No",
    "NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=9120, name=python3, "
    "Graphics Exception: ESR 0x504648=0x80000000",
]


def test_an_xid_of_a_mig_instance_is_the_gpus_xid_with_its_instance(tmp_path: Path) -> None:
    watcher, published, _ = kernel_log(tmp_path, directory(gpu_at(3, "3B")))
    records = [parse_record(f"4,{100 + i},5,-;{line}".encode()) for i, line in enumerate(MIG_XIDS)]
    watcher.take(Batch([r for r in records if r is not None], 0, ""))
    contained, graphics = published
    assert (contained.kind, contained.gpu, contained.data["xid"]) == ("xid", 3, 94)
    assert contained.data["gpu_instance"] == 5 and "compute_instance" not in contained.data
    assert contained.data["pid"] == 7194
    assert "in MIG GPU instance 5" in contained.message
    assert (graphics.kind, graphics.gpu, graphics.data["xid"]) == ("xid", 3, 13)
    assert (graphics.data["gpu_instance"], graphics.data["compute_instance"]) == (1, 2)
    assert graphics.data["process"] == "python3"
    assert "in MIG GPU instance 1, compute instance 2" in graphics.message
    # Counted as XIDs, not as plain lines held to the limit for those.
    lines = {s.labels: s.value for s in watcher.collect() if s.name.endswith("driver_lines_total")}
    assert lines[(("kind", "xid"),)] == 2


def test_a_kernel_line_quoting_what_a_user_chose_is_not_the_drivers(tmp_path: Path) -> None:
    """The kernel prints some strings a user picks: any user with a user namespace can have
    `tmpfs: Unknown parameter '...'` printed with the kernel's facility. What the driver said
    must open the kernel's text; a line that only quotes it is nobody's XID or AER error."""
    fake_xid = "x NVRM: Xid (PCI:0000:07:00): 79, pid=1, name=x, GPU has fallen off the bus."
    fake_aer = "x nvidia 0000:07:00.0: AER: Uncorrectable (Fatal) error received: 0000:07:00.0"
    quoted = [f"tmpfs: Unknown parameter '{fake}'" for fake in (fake_xid, fake_aer)]
    gpus = directory(gpu_at(2, "07"))
    gpus.learn_ports({"0000:00:01.0": "0000:07:00.0"})
    watcher, published, _ = kernel_log(tmp_path, gpus)
    watcher.take(records(quoted))  # as /dev/kmsg hands them
    watcher.take(saved([f"Mar  4 10:12:01 node7 kernel: [ 12.5] {q}" for q in quoted]))
    assert published == []
    # The driver's own line, the same words at the start of the kernel's text, is read.
    watcher, published, _ = kernel_log(tmp_path, gpus)
    watcher.take(records([fake_xid[2:], fake_aer[2:]]))
    assert [(e.kind, e.gpu) for e in published] == [("xid", 2), ("pcie_aer", 2)]


def test_aer_lines_reach_the_gpu_behind_a_switch_and_keep_a_budget_of_their_own(
    tmp_path: Path,
) -> None:
    """On an HGX board the root port above a PCIe switch prints the `received from` line,
    naming the switch port that saw the error: it is the GPU's. A storm of AER lines has its
    own limit, so the driver's lines after it are still journaled; the AER driver's boot
    line is no error."""
    gpus = directory(gpu_at(1, "2a"))
    gpus.learn_ports({"0000:29:00.0": "0000:2a:00.0"})  # the switch's downstream port
    watcher, published, _ = kernel_log(tmp_path, gpus)
    root = "pcieport 0000:27:01.0: AER: "
    storm = [f"{root}Correctable error message received from 0000:29:00.0"] * 40
    lines = [f"{root}enabled with IRQ 122", *storm, "NVRM: nvlink: link 3 is down"]
    watcher.take(records(lines))
    kinds = [(e.kind, e.gpu) for e in published]
    assert kinds == [("pcie_aer", 1)] * OTHER_PER_MINUTE + [("nvlink", None)]
    assert published[0].data["reporter"] == "0000:27:01.0"
    assert published[0].message.startswith("PCIe AER on GPU 1 (reported by 0000:27:01.0)")
