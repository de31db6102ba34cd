"""`gpuwatch gpu history` and `gpuwatch gpu rma`, run as an operator runs them, on a life
record the recorder wrote."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from gpuwatch.cli import main
from gpuwatch.life.book import FILE_NAME, LifeBook
from gpuwatch.life.recorder import LifeRecorder
from gpuwatch.model import Event
from tests.unit.test_life_record import SERIAL, T0, UUID, ecc, info, view

DRIVER_TEXT = (
    "NVRM: Xid (PCI:0000:2a:00): 48, pid=4242, name=\x1b]0;owned\x07train, An uncorrectable "
    "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6"
)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    rec = LifeRecorder(LifeBook(tmp_path / FILE_NAME), "n1", "boot-1")
    rec.after_cycle(T0, view(info(), [ecc("uncorrected", "aggregate", 0)]))
    data = {"xid": 48, "source": "kernel_log", "driver_text": DRIVER_TEXT}
    rec.on_event(Event(T0 + 5, "xid", 1, UUID, "XID 48 on GPU 1: Double-bit ECC error", data))
    rec.after_cycle(T0 + 5, view(info(), [ecc("uncorrected", "aggregate", 1)]))
    rec.on_event(Event(T0 + 9, "acknowledged", 1, UUID, "acknowledged: XID 48", {"cause": "xid"}))
    rec.after_cycle(T0 + 9, view(info(), [ecc("uncorrected", "aggregate", 1)]))
    rec.book.close()
    return tmp_path


def test_history_lists_the_gpus_and_tells_one_gpus_life(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["gpu", "history", "--state-dir", str(state)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[:2] == [SERIAL, "NVIDIA"]
    assert table[1].endswith("ecc_uncorrected 1, xid 1")

    assert main(["gpu", "history", "--state-dir", str(state), SERIAL]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out  # a process's name cannot retitle the operator's terminal
    assert "name=\\x1b]0;owned\\x07train" in out
    lines = out.splitlines()
    assert lines[0] == f"GPU serial {SERIAL}: NVIDIA H100 80GB HBM3, UUID {UUID}"
    what = [line[21:45].strip() for line in lines if line[:4] == "2026"]
    assert what == ["installed", "xid 48", "ecc_uncorrected", "acknowledged xid"]

    assert main(["gpu", "history", "--state-dir", str(state), UUID, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["serial"] == SERIAL
    assert record["entries"][1]["data"]["driver_text"] == DRIVER_TEXT


def test_an_unknown_gpu_or_a_missing_record_is_said_with_what_is_known(
    state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["gpu", "history", "--state-dir", str(state), "123"]) == 1
    assert capsys.readouterr().err == (
        f"gpuwatch: no GPU with serial or UUID '123'; known: {SERIAL}\n"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["gpu", "rma", "--state-dir", str(empty), SERIAL]) == 2
    assert "no life record here" in capsys.readouterr().err
    assert not (empty / FILE_NAME).exists()  # a command never creates the record


def test_rma_writes_the_evidence_and_how_to_add_the_drivers_report(
    state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rma"
    out.mkdir()
    assert main(["gpu", "rma", "--state-dir", str(state), SERIAL, "-o", str(out)]) == 0
    (folder,) = out.iterdir()
    assert folder.name.startswith(f"gpuwatch-rma-{SERIAL}-")
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert capsys.readouterr().out.startswith(f"wrote {folder}/\n")
    summary = (folder / "summary.txt").read_text()
    for said in (
        f"GPU serial {SERIAL}: NVIDIA H100 80GB HBM3, UUID {UUID}",
        "driver 580.105.08, VBIOS 96.00.99.00.01",
        "uncorrected (double-bit) ECC errors, aggregate: 1",
        "Faults this node recorded (2;",
        "xid 48",
        "driver: NVRM: Xid (PCI:0000:2a:00): 48, pid=4242",
        "uncorrected (double-bit) ECC errors, aggregate: 0 -> 1",
        f"cd {folder} && sudo nvidia-bug-report.sh",
        f"tar czf {folder}.tar.gz -C {folder.parent} {folder.name}",
    ):
        assert said in summary, said
    assert "acknowledged" not in summary  # in the whole record, not among the faults
    history = json.loads((folder / "history.json").read_text())
    assert [e["kind"] for e in history["entries"]] == ["installed", "xid", "ecc", "acknowledged"]
    assert history["known"]["counts"]["ecc_uncorrected"] == 1


def test_rma_refuses_a_folder_it_cannot_write(
    state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no" / "such"
    assert main(["gpu", "rma", "--state-dir", str(state), SERIAL, "-o", str(missing)]) == 2
    assert "cannot write the RMA bundle under" in capsys.readouterr().err


def test_a_board_with_several_gpus_is_asked_for_by_uuid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuwatch.health.view import NodeView
    from gpuwatch.model import BackendState, Batch, GpuInfo, GpuState, GpuStatus

    rec = LifeRecorder(LifeBook(tmp_path / FILE_NAME), "n1", "boot-1")
    other = GpuInfo(2, "GPU-other", "NVIDIA A16", "00000000:3A:00.0", SERIAL, "94.0", 0)
    states = [GpuState(info(), GpuStatus.OK), GpuState(other, GpuStatus.OK)]
    rec.after_cycle(T0, NodeView(Batch("nvml", T0, [], BackendState(True, "nvml"), states)))
    rec.book.close()
    assert main(["gpu", "history", "--state-dir", str(tmp_path), SERIAL]) == 2
    assert capsys.readouterr().err == (
        f"gpuwatch: board {SERIAL} holds 2 GPUs: name one by UUID: {UUID}, GPU-other\n"
    )
    assert main(["gpu", "history", "--state-dir", str(tmp_path), "GPU-other"]) == 0
    assert capsys.readouterr().out.startswith(f"GPU serial {SERIAL}:GPU-other: NVIDIA A16")


def test_the_bundle_is_private_quoted_for_a_shell_and_leaves_a_jobs_xids_out(
    state: Path, tmp_path: Path
) -> None:
    rec = LifeRecorder(LifeBook(state / FILE_NAME), "n1", "boot-1")
    rec.after_cycle(T0 + 20, view(info()))
    rec.on_event(Event(T0 + 21, "xid", 1, UUID, "XID 13 on GPU 1: a job's fault", {"xid": 13}))
    rec.after_cycle(T0 + 22, view(info()))
    rec.book.close()
    out = tmp_path / "rma dir" / "it's $(id)"
    out.mkdir(parents=True)
    assert main(["gpu", "rma", "--state-dir", str(state), SERIAL, "-o", str(out)]) == 0
    (folder,) = out.iterdir()
    summary = (folder / "summary.txt").read_text()
    assert "XID 13" not in summary.split("The whole record")[0]
    assert "Faults this node recorded (2;" in summary
    assert f"cd {shlex.quote(str(folder))} && sudo nvidia-bug-report.sh" in summary
    assert [oct(f.stat().st_mode & 0o777) for f in sorted(folder.iterdir())] == ["0o600"] * 2
