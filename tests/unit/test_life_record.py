"""A GPU's life record, by serial: what each cycle and each event adds to it, and that it is
kept across a restart, a reboot, a driver upgrade and a move to another slot."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch import metrics as m
from gpuwatch.health.verdict import Cause, Health, Verdict
from gpuwatch.health.view import NodeView
from gpuwatch.life import book as book_module
from gpuwatch.life.book import FILE_NAME, LifeBook, read_entries
from gpuwatch.life.recorder import LifeRecorder
from gpuwatch.model import BackendState, Batch, Event, GpuInfo, GpuState, GpuStatus, Sample
from gpuwatch.state.statedir import StateProblems

T0 = 1_790_000_000.0
UUID = "GPU-11111111-2222-3333-4444-555555555555"
SERIAL = "1650923012345"


def info(index: int = 1, serial: str = SERIAL, slot: str = "00000000:2A:00.0") -> GpuInfo:
    return GpuInfo(index, UUID, "NVIDIA H100 80GB HBM3", slot, serial, "96.00.99.00.01", 18)


def ecc(kind: str, scope: str, value: float, index: int = 1) -> Sample:
    labels = (("gpu", str(index)), ("uuid", UUID), ("type", kind), ("scope", scope))
    return Sample(m.ECC_ERRORS, labels, value)


def view(
    gpu: GpuInfo,
    samples: list[Sample] = (),  # type: ignore[assignment]
    driver: str = "580.105.08",
    verdicts: dict[int, Verdict] | None = None,
) -> NodeView:
    backend = BackendState(True, "nvml", driver_version=driver)
    batch = Batch("nvml", T0, list(samples), backend, [GpuState(gpu, GpuStatus.OK)])
    return NodeView(batch, verdicts or {})


def recorder(tmp_path: Path, boot: str = "boot-1") -> LifeRecorder:
    return LifeRecorder(LifeBook(tmp_path / FILE_NAME), "n1", boot)


def kinds(rec: LifeRecorder, serial: str = SERIAL) -> list[str]:
    return [e.kind for e in read_entries(rec.book._db, serial)]


def test_a_gpu_seen_first_is_installed_and_a_restart_adds_nothing(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    rec.after_cycle(T0, view(info(), [ecc("uncorrected", "aggregate", 2)]))
    rec.after_cycle(T0 + 1, view(info(), [ecc("uncorrected", "aggregate", 2)]))
    (installed,) = read_entries(rec.book._db, SERIAL)
    assert installed.kind == "installed"
    assert installed.data["ecc_uncorrected"] == 2  # what the board brought with it
    assert "slot 00000000:2A:00.0 (GPU 1)" in installed.message
    rec.book.close()

    again = recorder(tmp_path)
    again.after_cycle(T0 + 60, view(info(), [ecc("uncorrected", "aggregate", 2)]))
    assert kinds(again) == ["installed"]
    assert again.lives[SERIAL].first_seen == T0


def test_reboot_driver_upgrade_and_slot_move_are_each_an_entry(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    rec.after_cycle(T0, view(info()))
    rec.book.close()
    rebooted = recorder(tmp_path, boot="boot-2")
    moved = info(index=5, slot="00000000:AB:00.0")
    rebooted.after_cycle(T0 + 600, view(moved, driver="590.10.01"))
    entries = read_entries(rebooted.book._db, SERIAL)
    assert [e.kind for e in entries] == ["installed", "slot", "driver", "boot"]
    assert entries[1].message == (
        "moved from slot 00000000:2A:00.0 (GPU 1) to slot 00000000:AB:00.0 (GPU 5)"
    )
    assert entries[2].message == "driver 580.105.08 -> 590.10.01"
    assert entries[3].boot_id == "boot-2"


def test_board_counts_are_recorded_as_they_change(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    counts = [ecc("uncorrected", "aggregate", 0), ecc("corrected", "aggregate", 5)]
    rec.after_cycle(T0, view(info(), counts))
    rec.after_cycle(T0 + 1, view(info(), [ecc("uncorrected", "aggregate", 1)]))
    # Corrected errors climb steadily on some boards: told at most once an hour.
    rec.after_cycle(T0 + 2, view(info(), [ecc("corrected", "aggregate", 9)]))
    rec.after_cycle(T0 + 3, view(info(), [ecc("corrected", "aggregate", 40)]))
    rec.after_cycle(T0 + 3700, view(info(), [ecc("corrected", "aggregate", 41)]))
    entries = read_entries(rec.book._db, SERIAL)
    told = [e.message for e in entries if e.kind.startswith("ecc")]
    assert told == [
        "uncorrected (double-bit) ECC errors, aggregate: 0 -> 1",
        "corrected (single-bit) ECC errors, aggregate: 5 -> 9",
        "corrected (single-bit) ECC errors, aggregate: 9 -> 41",
    ]
    assert rec.lives[SERIAL].known["faults"] == {"ecc_uncorrected": 1}


def test_volatile_counts_going_back_within_a_boot_are_a_reset(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    rec.after_cycle(T0, view(info(), [ecc("uncorrected", "volatile", 1)]))
    rec.after_cycle(T0 + 1, view(info(), [ecc("uncorrected", "volatile", 0)]))
    assert kinds(rec) == ["installed", "reset"]
    rec.after_cycle(T0 + 2, view(info(), [ecc("uncorrected", "volatile", 3)]))
    rec.book.close()
    # After a reboot the volatile counts start again: that is the boot, not a reset.
    rebooted = recorder(tmp_path, boot="boot-2")
    rebooted.after_cycle(T0 + 600, view(info(), [ecc("uncorrected", "volatile", 0)]))
    assert kinds(rebooted) == ["installed", "reset", "boot"]


def xid(code: int, t: float, message: str = "") -> Event:
    text = message or f"XID {code} on GPU 1"
    return Event(t, "xid", 1, UUID, text, {"xid": code, "source": "nvml"})


def test_repeated_xids_count_into_one_entry_and_the_driver_text_joins_it(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    rec.after_cycle(T0, view(info()))
    rec.on_event(xid(79, T0 + 1))
    said = {"xid": 79, "source": "kernel_log", "driver_text": "NVRM: Xid (PCI:0000:2a:00): 79"}
    rec.on_event(Event(T0 + 1.1, "kernel_log", 1, UUID, "kernel log: ...", said))
    rec.on_event(xid(79, T0 + 200))
    rec.on_event(xid(79, T0 + 2000))  # past the window after the last: a new entry
    for t in range(5):  # a job's own fault, once a second: one entry a day
        rec.on_event(xid(13, T0 + 10 + t))
    rec.after_cycle(T0 + 2001, view(info()))
    entries = [e for e in read_entries(rec.book._db, SERIAL) if e.kind == "xid"]
    assert [(e.key, e.count) for e in entries] == [("79", 2), ("13", 5), ("79", 1)]
    assert entries[0].data["driver_text"] == "NVRM: Xid (PCI:0000:2a:00): 79"
    assert entries[0].last == T0 + 200
    assert rec.lives[SERIAL].known["faults"] == {"xid": 3}  # XID 13 is the job's, not the GPU's


def test_a_drain_is_in_the_history_of_the_gpu_whose_cause_it_named(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    cause = Cause("xid-79", Health.UNHEALTHY, "XID 79", "reset the GPU")
    verdicts = {1: Verdict(Health.UNHEALTHY, (cause,)), 0: Verdict(Health.HEALTHY)}
    rec.after_cycle(T0, view(info()))
    data = {"action": "drain", "scheduler": "slurm", "node": "n1", "cause": "xid-79"}
    rec.on_event(Event(T0 + 1, "action", None, None, "drained node n1 in Slurm", data))
    rec.after_cycle(T0 + 1, view(info(), verdicts=verdicts))
    resume = {"action": "resume", "scheduler": "slurm", "node": "n1"}
    rec.on_event(Event(T0 + 9, "action", None, None, "resumed node n1 in Slurm", resume))
    rec.on_event(Event(T0 + 9, "action", None, None, "resumed node n1 in Slurm", resume))
    rec.after_cycle(T0 + 9, view(info()))
    assert kinds(rec) == ["installed", "drain", "resume"]


def test_a_gpu_without_a_serial_is_kept_by_its_uuid(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    rec.after_cycle(T0, view(info(serial="N/A")))
    assert list(rec.lives) == [UUID]


def test_lifetime_faults_are_a_counter_a_restart_does_not_set_back(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    rec.after_cycle(T0, view(info()))
    rec.on_event(Event(T0 + 1, "gpu_lost", 1, UUID, "GPU 1 lost"))
    rec.after_cycle(T0 + 1, view(info()))
    rec.book.close()
    again = recorder(tmp_path)
    again.after_cycle(T0 + 60, view(info()))
    assert again.collect() == [
        Sample(m.GPU_LIFE_FAULTS, (("gpu", "1"), ("uuid", UUID), ("kind", "lost")), 1.0)
    ]


def test_a_record_past_its_cap_loses_its_oldest_entries_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(book_module, "MAX_ENTRIES", 3)
    rec = recorder(tmp_path)
    rec.after_cycle(T0, view(info()))
    for n in range(4):
        rec.on_event(Event(T0 + n * 1000, "gpu_lost", 1, UUID, f"lost {n}"))
        ack = {"cause": "gpu-lost"}
        rec.on_event(Event(T0 + n * 1000 + 1, "acknowledged", 1, UUID, f"ack {n}", ack))
    rec.after_cycle(T0 + 5000, view(info()))
    # The faults are kept longest: the acknowledgements and the install go first.
    assert [e.message for e in read_entries(rec.book._db, SERIAL)] == [
        "lost 1",
        "lost 2",
        "lost 3",
    ]
    assert rec.lives[SERIAL].known["trimmed"] == 6
    assert rec.lives[SERIAL].known["faults"] == {"lost": 4}


def test_entries_a_full_disk_refused_are_written_once_it_takes_them(tmp_path: Path) -> None:
    problems = StateProblems(tmp_path)
    rec = LifeRecorder(LifeBook(tmp_path / FILE_NAME, problems), "n1", "boot-1")
    rec.after_cycle(T0, view(info()))
    rec.on_event(Event(T0 + 1, "gpu_lost", 1, UUID, "GPU 1 lost"))
    working = rec.book._db
    rec.book._db = _Refusing()  # type: ignore[assignment]
    rec.after_cycle(T0 + 1, view(info()))
    assert problems.failing() == [(FILE_NAME, "disk I/O error")]
    rec.book._db = working
    rec.after_cycle(T0 + 2, view(info()))
    assert kinds(rec) == ["installed", "gpu_lost"]
    assert problems.failing() == []


class _Refusing:
    def execute(self, *_args: object) -> None:
        import sqlite3

        raise sqlite3.OperationalError("disk I/O error")

    def __enter__(self) -> _Refusing:
        return self

    def __exit__(self, *_args: object) -> None:
        return None


def test_the_gpus_of_one_board_each_keep_a_record(tmp_path: Path) -> None:
    """A board with several GPUs (a K80, an A16) reports one serial for all of them."""
    rec = recorder(tmp_path)
    other = GpuInfo(2, "GPU-other", "NVIDIA A16", "00000000:3A:00.0", SERIAL, "94.0", 0)
    backend = BackendState(True, "nvml", driver_version="580.105.08")
    states = [GpuState(info(), GpuStatus.OK), GpuState(other, GpuStatus.OK)]
    for t in (T0, T0 + 1):
        rec.after_cycle(t, NodeView(Batch("nvml", t, [], backend, states)))
    assert sorted(rec.lives) == [f"{SERIAL}:{UUID}", f"{SERIAL}:GPU-other"]
    assert kinds(rec, f"{SERIAL}:{UUID}") == ["installed"]  # no slot move between the two


def test_a_burst_of_a_jobs_own_xids_loses_no_fault_of_the_board(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    rec.after_cycle(T0, view(info()))
    rec.on_event(xid(48, T0 + 1))
    for n in range(1000):  # NVML's and the kernel log's report of each, in one cycle
        rec.on_event(xid(13, T0 + 1 + n / 1000))
        said = {"xid": 13, "source": "kernel_log", "driver_text": "NVRM: Xid 13"}
        rec.on_event(Event(T0 + 1, "kernel_log", 1, UUID, "kernel log", said))
    rec.after_cycle(T0 + 2, view(info()))
    entries = [(e.kind, e.key) for e in read_entries(rec.book._db, SERIAL)]
    assert ("xid", "48") in entries and ("xid", "13") in entries
    assert rec.lives[SERIAL].known["faults"] == {"xid": 1}


def test_corrected_errors_are_wear_that_a_full_record_gives_up_before_faults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(book_module, "MAX_ENTRIES", 5)
    rec = recorder(tmp_path)
    rec.after_cycle(T0, view(info(), [ecc("corrected", "aggregate", 0)]))
    rec.on_event(xid(79, T0 + 1))
    for hour in range(1, 10):  # a healthy board's corrected errors, an entry an hour
        t = T0 + hour * 3600
        rec.after_cycle(t, view(info(), [ecc("corrected", "aggregate", float(hour))]))
    kinds_kept = [e.kind for e in read_entries(rec.book._db, SERIAL)]
    assert "xid" in kinds_kept
    assert kinds_kept.count("ecc_corrected") == 4


def test_a_gpu_of_a_board_keeps_its_record_when_the_other_goes_missing(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    other = GpuInfo(2, "GPU-other", "Tesla K80", "00000000:3A:00.0", SERIAL, "80.0", 0)
    backend = BackendState(True, "nvml", driver_version="470.1")
    both = [GpuState(info(), GpuStatus.OK), GpuState(other, GpuStatus.OK)]
    rec.after_cycle(T0, NodeView(Batch("nvml", T0, [], backend, both)))
    rec.on_event(xid(79, T0 + 1))
    rec.after_cycle(T0 + 1, NodeView(Batch("nvml", T0 + 1, [], backend, both)))
    rec.book.close()
    rebooted = recorder(tmp_path, boot="boot-2")
    alone = [GpuState(info(), GpuStatus.OK)]
    rebooted.after_cycle(T0 + 600, NodeView(Batch("nvml", T0 + 600, [], backend, alone)))
    assert sorted(rebooted.lives) == [f"{SERIAL}:{UUID}", f"{SERIAL}:GPU-other"]
    assert kinds(rebooted, f"{SERIAL}:{UUID}") == ["installed", "xid", "boot"]


def test_a_stop_writes_each_gpus_last_sight_and_the_events_since_the_cycle(
    tmp_path: Path,
) -> None:
    rec = recorder(tmp_path)
    rec.after_cycle(T0, view(info()))
    rec.after_cycle(T0 + 60, view(info()))  # not written: nothing changed within 10 minutes
    rec.on_event(Event(T0 + 61, "gpu_lost", 1, UUID, "GPU 1 lost"))
    rec.close(T0 + 62)
    rec.book.close()
    again = recorder(tmp_path)
    assert again.lives[SERIAL].last_seen == T0 + 62
    assert kinds(again) == ["installed", "gpu_lost"]
