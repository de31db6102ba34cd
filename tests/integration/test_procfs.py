"""/proc read as psutil reads it: the same start time, name, user and environment, checked
against psutil on real processes of this machine, and against crafted /proc files."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpuwatch.host import procfs


def _running(argv: list[str], **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, env={**os.environ, **env}, stdin=subprocess.PIPE)


@pytest.fixture
def long_named(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    # A name past the kernel's 15 characters, with a space and a parenthesis in it.
    program = tmp_path / "a (very) long-named worker"
    program.symlink_to(sys.executable)
    proc = _running([str(program), "-c", "import sys; sys.stdin.read()"], GPUWATCH_T="x=y")
    yield proc
    proc.communicate(b"")


def test_what_psutil_says_of_real_processes(long_named: subprocess.Popen[bytes]) -> None:
    for pid in (os.getpid(), long_named.pid, 1):
        theirs = psutil.Process(pid)
        assert procfs.start_time(pid) == theirs.create_time()
        assert procfs.name(pid) == theirs.name()
        assert procfs.username(pid) == theirs.username()
    assert procfs.name(long_named.pid) == "a (very) long-named worker"
    assert procfs.environ(long_named.pid) == psutil.Process(long_named.pid).environ()
    assert procfs.environ(long_named.pid)["GPUWATCH_T"] == "x=y"


def test_a_process_that_is_gone_is_an_oserror() -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(done.stdout)
    for ask in (procfs.start_time, procfs.name, procfs.username, procfs.environ):
        with pytest.raises(OSError):
            ask(pid)


def test_crafted_proc_files_are_oserrors_not_crashes(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    for pid, stat, status in (
        (7, "7 (no end 0 0", "Name: x\n"),
        (8, "8 (short) S 1", "Uid:\tnotanumber\n"),
        (9, "", ""),
    ):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(stat)
        (tmp_path / str(pid) / "status").write_text(status)
        with pytest.raises(OSError):
            procfs.start_time(pid, tmp_path)
        with pytest.raises(OSError):
            procfs.username(pid, tmp_path)
    assert procfs.name(8, tmp_path) == "short"


@pytest.mark.parametrize(
    ("cmdline", "environ"),
    [
        (b"ray_long_worker_name --epochs 3\0", b"A=1\0"),  # a title with spaces, NUL-ended
        (b"ray_long_worker_name: busy  ", b"A=1\0"),  # setproctitle without a NUL
        (b"ray_long_worker_name\0--x\0", b"A=1\0\0SLURM_JOB_ID=42\0"),  # stale after a gap
        (b"ray_long_worker_name\0", b"A=1\0SLURM_JOB_ID=42"),  # the last entry unended
        (b"", b"=no key\0B=\0C==x\0"),
    ],
)
def test_crafted_titles_and_environments_read_as_psutil_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cmdline: bytes, environ: bytes
) -> None:
    """This process's /proc files copied, its command line and environment replaced: psutil,
    pointed at the copy, is the reference."""
    pid = os.getpid()
    (tmp_path / "stat").write_bytes(Path("/proc/stat").read_bytes())
    mine = tmp_path / str(pid)
    mine.mkdir()
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    (mine / "stat").write_bytes(b"%d (ray_long_worker%s" % (pid, stat[stat.rfind(b")") :]))
    (mine / "status").write_bytes(Path(f"/proc/{pid}/status").read_bytes())
    (mine / "cmdline").write_bytes(cmdline)
    (mine / "environ").write_bytes(environ)
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))
    theirs = psutil.Process(pid)
    assert procfs.name(pid, tmp_path) == theirs.name()
    assert procfs.environ(pid, tmp_path) == theirs.environ()
